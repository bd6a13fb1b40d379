"""``POST /queries/{id}/results`` (issue 26): matches found elsewhere (``lace stream``'s OUT, ``Match.to_json()``
lines) become the query's alerts through the one alert path, de-duplicated with the service's own alerts by event
ids, each delivered once; a bad line refuses the whole body. Real ``lace serve`` on SQLite and PostgreSQL, real
webhook receiver."""
from __future__ import annotations

import json
import time
from typing import Any

import httpx
import orjson

from cli.service_process import ServiceProcess, unique
from cli.webhook_receiver import Receiver
from tests.service.test_api_e2e import drop_query, ev, make_type, post

NDJSON = {"content-type": "application/x-ndjson"}


def lines(docs: list[dict[str, Any]]) -> bytes:
    """``docs`` as ``lace match`` writes them: one compact JSON object per line."""
    return b"".join(orjson.dumps(d) + b"\n" for d in docs)


def doc(name: str, a: int, b: int, t0_ms: int, symbol: str = "S", low: float = 1.0) -> dict[str, Any]:
    return {"query": name, "events": {"a": [a], "b": [b]}, "start": t0_ms * 1_000, "end": (t0_ms + 1) * 1_000,
            "fields": {"symbol": symbol, "low": low}}


def delivered_events(receiver: Receiver) -> list[str]:
    """The ``events`` of every alert answered 2xx, as canonical JSON (one entry per delivery received)."""
    return [json.dumps(json.loads(r["body"])["events"], sort_keys=True) for r in receiver.ok()]


def alert_count(c: httpx.Client, qid: int) -> int:
    return len(c.get("/alerts", params={"query_id": qid, "limit": 1000}).json()["items"])


def test_imported_matches_alert_once_with_the_service_own(service: ServiceProcess, receiver: Receiver, t0: int):
    """The service alerts one match itself; an import of it and two new ones alerts the two (to a paused query:
    moved elsewhere, its results still delivered); the same body again alerts nothing; each event set reaches
    the receiver once, with the fields of the import."""
    with service.client() as c:
        t = make_type(c)
        q = c.post("/queries", json={"text": drop_query(t)}).json()
        qid, name = q["id"], q["name"]
        assert c.post("/webhooks", json={"query_id": qid, "url": receiver.url}).status_code == 201
        ids = post(c, [ev(t, t0, "IBM", 100.0), ev(t, t0 + 1_000, "IBM", 80.0)]).json()["ids"]
        assert len(receiver.wait_for(1)) == 1
        assert c.post(f"/queries/{qid}/pause").json()["state"] == "paused"

        own = doc(name, ids[0], ids[1], t0, "IBM", 80.0)
        new = [doc(name, 9_000_001, 9_000_002, t0 + 5, low=2.5), doc(name, 9_000_003, 9_000_004, t0 + 6, low=3.5)]
        r = c.post(f"/queries/{qid}/results", content=lines([own, *new]), headers=NDJSON)
        assert r.status_code == 200, r.text
        assert r.json() == {"received": 3, "alerts": 2, "duplicates": 1}
        got = receiver.wait_for(3)
        assert len(got) == 3
        bodies = [json.loads(x["body"]) for x in got]
        assert sorted(json.dumps(b["events"], sort_keys=True) for b in bodies) == sorted(
            json.dumps(d["events"], sort_keys=True) for d in [own, *new]
        )
        assert {b["fields"]["low"] for b in bodies[1:]} == {2.5, 3.5}
        assert all(b["query"] == {"id": qid, "name": name, "version": 1} for b in bodies)

        again = c.post(f"/queries/{qid}/results", content=lines([own, *new]), headers=NDJSON)
        assert again.status_code == 200 and again.json() == {"received": 3, "alerts": 0, "duplicates": 3}
        time.sleep(1.0)  # the dispatcher polls every 0.05 s: anything new would have gone out
        assert len(receiver.ok()) == 3 and len(set(delivered_events(receiver))) == 3
        assert alert_count(c, qid) == 3
        keys = [x["headers"]["idempotency-key"] for x in receiver.ok()]
        assert len(set(keys)) == 3

        # repeated within a body: one alert; a JSON array is read too
        dup = doc(name, 9_000_005, 9_000_006, t0 + 7)
        r = c.post(f"/queries/{qid}/results", json=[dup, dup])
        assert r.status_code == 200 and r.json() == {"received": 2, "alerts": 1, "duplicates": 1}
        assert len(receiver.wait_for(4)) == 4
        # an empty body records nothing (lace stream's check before its run)
        r = c.post(f"/queries/{qid}/results", content=b"", headers=NDJSON)
        assert r.status_code == 200 and r.json() == {"received": 0, "alerts": 0, "duplicates": 0}


def test_a_bad_line_refuses_the_whole_body(service: ServiceProcess, t0: int):
    with service.client() as c:
        t = make_type(c)
        q = c.post("/queries", json={"text": drop_query(t)}).json()
        qid, name = q["id"], q["name"]
        good = [doc(name, 8_000_001, 8_000_002, t0), doc(name, 8_000_003, 8_000_004, t0 + 1)]
        bad_docs = [
            {**good[0], "events": {"a": ["x"]}},  # not an id
            {k: v for k, v in good[0].items() if k != "fields"},  # fields missing
            {**good[0], "extra": 1},  # an unknown key
            {**good[0], "start": good[0]["end"] + 1},  # start after end
        ]
        for bad in bad_docs:
            body = lines([good[0], good[1]]) + b"\n" + lines([bad])  # a blank line counts: the bad one is line 4
            r = c.post(f"/queries/{qid}/results", content=body, headers=NDJSON)
            assert r.status_code == 422, (bad, r.text)
            detail = r.json()["detail"][0]
            assert detail["line"] == 4 and detail["reason"].startswith("line 4: "), detail
        r = c.post(f"/queries/{qid}/results", content=lines(good) + b'{"query": \n', headers=NDJSON)
        assert r.status_code == 400 and r.json()["detail"][0]["line"] == 3  # malformed JSON, as on every route
        other = c.post(f"/queries/{qid}/results", content=lines([{**good[1], "query": "elsewhere"}]), headers=NDJSON)
        assert other.status_code == 422
        reason = other.json()["detail"][0]["reason"]
        assert "'elsewhere'" in reason and repr(name) in reason and f"query {qid}" in reason
        assert alert_count(c, qid) == 0  # nothing recorded from any of them
        r = c.post(f"/queries/{qid}/results", content=lines(good), headers=NDJSON)
        assert r.json() == {"received": 2, "alerts": 2, "duplicates": 0}


def test_unknown_query_and_wrong_scope(service: ServiceProcess, t0: int):
    with service.client() as c:
        r = c.post("/queries/987654321/results", content=lines([doc("x", 1, 2, t0)]), headers=NDJSON)
        assert r.status_code == 404 and r.json()["detail"][0]["field"] == "path.id"
        r = c.post("/queries/987654321/results", content=b"a,b\n", headers={"content-type": "text/csv"})
        assert r.status_code == 415 and "application/x-ndjson" in r.json()["detail"][0]["reason"]
        read_key = c.post("/keys", json={"name": unique("reader"), "scopes": ["read"]}).json()["key"]
    with service.client(read_key) as c:
        assert c.post("/queries/1/results", content=b"", headers=NDJSON).status_code == 403
