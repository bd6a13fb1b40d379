"""End to end over real HTTP: types, queries, ingest, signed webhook alerts, live query changes, paging.

Runs against a real ``lace serve`` on SQLite and on PostgreSQL (the ``service`` fixture).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx

from cli.service_process import ServiceProcess, unique, wait_until
from cli.webhook_receiver import Receiver
from service.schemas.alerts import WebhookAlert
from service.schemas.common import iso


def make_type(c: httpx.Client, *, lateness_ms: int = 0) -> str:
    name = unique("Stock")
    r = c.post(
        "/event-types",
        json={
            "name": name,
            "attributes": {"symbol": "string", "price": "float", "at": "timestamp"},
            "partition_key": "symbol",
            "allowed_lateness_ms": lateness_ms,
        },
    )
    assert r.status_code == 201, r.text
    return name


def drop_query(t: str, name: str | None = None, ratio: float = 0.9) -> str:
    return (
        f"NAME {name or unique('drop')}\nPATTERN SEQ({t} a, {t} b)\nWHERE b.price < a.price * {ratio}\n"
        f"PARTITION BY symbol\nSTRATEGY skip_till_next_match\nWITHIN 1 min\n"
        f"RETURN a.symbol AS symbol, b.price AS low"
    )


def ev(t: str, ts_ms: int, symbol: str, price: float, **extra: Any) -> dict[str, Any]:
    return {"type": t, "ts": ts_ms, "attrs": {"symbol": symbol, "price": price, "at": ts_ms}, **extra}


def post(c: httpx.Client, events: list[dict[str, Any]], **params: Any) -> httpx.Response:
    return c.post("/events", json=events, params=params)


def verify(secret: str, delivery: dict[str, Any]) -> bool:
    """The receiver's check, written from the documented scheme (not with the service's helper)."""
    parts = dict(p.split("=", 1) for p in delivery["headers"]["x-lace-signature"].split(","))
    mac = hmac.new(secret.encode(), parts["t"].encode() + b"." + delivery["body"], hashlib.sha256).hexdigest()
    return hmac.compare_digest(mac, parts["v1"]) and abs(time.time() - int(parts["t"])) < 300


def test_alert_reaches_the_receiver_signed(service: ServiceProcess, receiver: Receiver, t0: int) -> None:
    with service.client() as c:
        t = make_type(c)
        q = c.post("/queries", json={"text": drop_query(t)}).json()
        wh = c.post("/webhooks", json={"query_id": q["id"], "url": receiver.url})
        assert wh.status_code == 201 and wh.json()["secret"].startswith("whsec_")
        secret = wh.json()["secret"]
        assert "secret" not in c.get(f"/webhooks/{wh.json()['id']}").json()  # shown once
        r = post(
            c,
            [
                {"type": t, "ts": "1970-01-01T00:00:00Z", "attrs": {"symbol": "IBM", "price": 100.0, "at": 0}}
                | {"ts": t0},
                {"type": t, "ts": t0 + 1_000, "symbol": "AIG", "price": 50.0, "at": "2024-01-10T06:00:00+01:00"},
                ev(t, t0 + 2_000, "IBM", 85.0),
            ],
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["accepted"], body["rejected"], body["alerts"]) == (3, 0, 1)
        ids = body["ids"]
        got = receiver.wait_for(1)
        assert len(got) == 1
        assert verify(secret, got[0])
        assert not verify(secret + "x", got[0])
        payload = json.loads(got[0]["body"])
        assert payload["events"] == {"a": [ids[0]], "b": [ids[2]]}
        assert payload["fields"] == {"symbol": "IBM", "low": 85.0}
        assert payload["end"].endswith("+00:00")
        alerts = c.get("/alerts", params={"query_id": q["id"]}).json()["items"]
        # the body is the documented WebhookAlert: GET /alerts's item, same names and values, and the query's name
        WebhookAlert.model_validate(payload)
        assert {k: payload[k] for k in alerts[0]} == alerts[0] and payload["query_name"] == q["name"]
        assert payload["query_version"] == 1
        # issue 47: the names sent before stay (deprecated in the schema) for receivers that read them
        assert payload["alert_id"] == payload["id"]
        assert payload["query"] == {"id": q["id"], "name": q["name"], "version": 1}
        schema = c.get("/openapi.json").json()
        assert schema["webhooks"]["alert"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/WebhookAlert"
        }
        assert set(schema["components"]["schemas"]["WebhookAlert"]["properties"]) == set(payload)
        key = got[0]["headers"]["idempotency-key"]
        assert key.startswith("lace-") and str(uuid.UUID(key.removeprefix("lace-"))) == key.removeprefix("lace-")
        dl = wait_until(lambda: c.get("/deliveries", params={"alert_id": payload["id"]}).json()["items"])
        assert wait_until(lambda: c.get(f"/deliveries/{dl[0]['id']}").json()["status"] == "delivered")
        detail = c.get(f"/deliveries/{dl[0]['id']}").json()
        assert detail["idempotency_key"] == key and [a["outcome"] for a in detail["log"]] == ["delivered"]


def test_query_created_while_events_flow_sees_exactly_the_later_events(service: ServiceProcess, t0: int) -> None:
    with service.client() as c:
        t = make_type(c)
        first = post(c, [ev(t, t0, "X", 100.0)]).json()["ids"]
        q = c.post("/queries", json={"text": drop_query(t)}).json()
        later = post(c, [ev(t, t0 + 1_000, "X", 80.0), ev(t, t0 + 2_000, "X", 60.0)]).json()["ids"]
        alerts = c.get("/alerts", params={"query_id": q["id"]}).json()["items"]
        # 100 -> 80 would match, but 100 arrived before the query existed
        assert [a["events"] for a in alerts] == [{"a": [later[0]], "b": [later[1]]}]
        assert first[0] not in {i for a in alerts for ids in a["events"].values() for i in ids}


def test_pause_resume_update_delete_take_effect_live(service: ServiceProcess, t0: int) -> None:
    with service.client() as c:
        t = make_type(c)
        q = c.post("/queries", json={"text": drop_query(t)}).json()
        qid = q["id"]

        def n_alerts() -> int:
            return len(c.get("/alerts", params={"query_id": qid}).json()["items"])

        assert c.post(f"/queries/{qid}/pause").json()["state"] == "paused"
        post(c, [ev(t, t0, "P", 100.0), ev(t, t0 + 1, "P", 10.0)])
        assert n_alerts() == 0
        assert c.post(f"/queries/{qid}/resume").json()["state"] == "active"
        post(c, [ev(t, t0 + 2, "P", 5.0)])  # with 10.0 (seen while paused) it would match
        assert n_alerts() == 0
        post(c, [ev(t, t0 + 3, "P", 1.0)])
        assert n_alerts() == 1
        # a looser threshold: 1.0 -> 0.95 matches only after the update
        up = c.put(f"/queries/{qid}", json={"text": drop_query(t, name=q["name"], ratio=0.99)})
        assert up.status_code == 200 and up.json()["version"] == 2
        post(c, [ev(t, t0 + 4, "P", 1.0), ev(t, t0 + 5, "P", 0.985)])
        assert n_alerts() == 2
        assert c.delete(f"/queries/{qid}").status_code == 204
        assert c.get(f"/queries/{qid}").status_code == 404
        assert c.get("/alerts", params={"query_id": qid}).json()["items"] == []
        assert post(c, [ev(t, t0 + 6, "P", 0.5)]).json()["accepted"] == 1


def test_counters_and_milliseconds_are_json_integers(service: ServiceProcess, t0: int) -> None:
    """Issue 47: ``allowed_lateness_ms`` came back as ``5000.0`` and totals as ``"events": 4.0``."""

    def ints(d: dict[str, Any], *keys: str) -> None:
        for k in keys:
            assert type(d[k]) is int, (k, d[k])

    with service.client() as c:
        t = make_type(c, lateness_ms=5_000)
        ints(c.get(f"/event-types/{t}").json(), "allowed_lateness_ms")
        plain = unique("Plain")
        assert c.post("/event-types", json={"name": plain, "attributes": {"x": "int"}}).status_code == 201
        assert c.get(f"/event-types/{plain}").json()["allowed_lateness_ms"] == 0  # the documented default
        spec = c.get("/openapi.json").json()["components"]["schemas"]
        assert spec["EventTypeCreate"]["properties"]["allowed_lateness_ms"]["default"] == 0
        assert type(spec["EventTypeCreate"]["properties"]["allowed_lateness_ms"]["maximum"]) is int
        qid = c.post("/queries", json={"text": drop_query(t)}).json()["id"]
        post(c, [ev(t, t0 + i * 10_000, "S", 100.0 - i) for i in range(4)])  # the last one waits 5 s
        q = c.get(f"/queries/{qid}").json()
        ints(q, "window_ms")
        ints(q["stats"], "events", "late", "matches", "keys")
        ints(q["totals"], "events", "late", "matches")
        assert q["totals"]["events"] == 3 and type(q["totals"]["cpu_s"]) is float
        assert c.post(f"/queries/{qid}/pause").status_code == 200  # totals from the stored counters now
        paused = c.get(f"/queries/{qid}").json()["totals"]
        ints(paused, "events", "late", "matches")


def test_held_matches_are_visible_until_the_watermark_passes(service: ServiceProcess, t0: int) -> None:
    """Issue 47: a drop under an allowed lateness gave no alert and nothing said why."""
    with service.client() as c:
        t = make_type(c, lateness_ms=5_000)
        q = c.post("/queries", json={"text": drop_query(t)}).json()
        r = post(c, [ev(t, t0, "AIG", 100.0), ev(t, t0 + 1_000, "AIG", 50.0)]).json()
        assert (r["matches"], r["alerts"]) == (0, 0)
        (held,) = r["held"]
        assert (held["query"], held["events"], held["matches"]) == (q["name"], 2, 0), held
        assert (held["earliest"], held["latest"]) == (iso(t0 * 1_000), iso((t0 + 1_000) * 1_000))
        stats = c.get(f"/queries/{q['id']}").json()["stats"]
        assert stats["held"] == {k: v for k, v in held.items() if k != "query"}
        assert stats["held"]["watermark"] == iso((t0 + 1_000 - 5_000) * 1_000 - 1)  # newest - lateness - 1 us
        r = post(c, [ev(t, t0 + 7_000, "IBM", 10.0)]).json()  # 6 s later: the watermark passes both
        assert (r["matches"], r["alerts"]) == (1, 1) and r["held"][0]["events"] == 1, r
        assert c.post(f"/event-types/{t}/end").status_code == 200
        assert c.get(f"/queries/{q['id']}").json()["stats"]["held"]["events"] == 0


def test_alerts_page_with_cursor_and_filter_by_time(service: ServiceProcess, t0: int) -> None:
    with service.client() as c:
        t = make_type(c)
        qid = c.post("/queries", json={"text": drop_query(t)}).json()["id"]
        events = []
        for i in range(5):  # five separate drops, one alert each, ending at t0 + 10_000 * i + 1
            events += [ev(t, t0 + 10_000 * i, "S", 100.0), ev(t, t0 + 10_000 * i + 1, "S", 50.0)]
        assert post(c, events).json()["alerts"] == 5
        seen, cursor = [], None
        while True:
            params: dict[str, Any] = {"query_id": qid, "limit": 2}
            if cursor:
                params["cursor"] = cursor
            page = c.get("/alerts", params=params).json()
            seen += [a["id"] for a in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert len(seen) == 5 and seen == sorted(set(seen))
        since = datetime.fromtimestamp((t0 + 10_001) / 1000, tz=UTC).isoformat()  # the end of alert 1, included
        mid = c.get("/alerts", params={"query_id": qid, "since": since, "until": t0 + 30_001}).json()["items"]
        assert [a["id"] for a in mid] == seen[1:3]
        bad = c.get("/alerts", params={"cursor": "nonsense!"})
        assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "query.cursor"
        bad = c.get("/alerts", params={"since": "yesterday"})
        assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "query.since"


def test_metrics_count_what_happened(service: ServiceProcess, t0: int) -> None:
    with service.client() as c:
        t = make_type(c)
        c.post("/queries", json={"text": drop_query(t)})
        post(c, [ev(t, t0 + 5_000, "M", 100.0), ev(t, t0 + 6_000, "M", 99.0), ev(t, t0, "M", 1.0)])
        text = c.get("/metrics").text
    assert f'lace_events_ingested_total{{type="{t}"}} 2.0' in text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line and line[0] != "#"}
    assert values["lace_events_late_total"] >= 1
    assert values["lace_partial_matches"] >= 1  # 100 and 99 wait for a drop
    for name in ("lace_spark_jobs_total", "lace_partial_matches_spilled", "lace_archive_lag_seconds"):
        assert name in values
