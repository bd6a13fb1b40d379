"""Bad input gets a 4xx naming the field and the reason, and changes nothing; API-key scopes hold."""
from __future__ import annotations

import hashlib
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from cli.service_process import ServiceProcess, unique
from tests.service.test_api_e2e import drop_query, ev, make_type, post


def state(c: httpx.Client, qid: int) -> tuple[Any, ...]:
    """What bad input must not change: the query's counters, its alerts, the number of queries and types."""
    q = c.get(f"/queries/{qid}").json()
    alerts = c.get("/alerts", params={"query_id": qid}).json()["items"]
    return (q["stats"], q["version"], len(alerts), len(c.get("/queries").json()), len(c.get("/event-types").json()))


@pytest.fixture
def setup(service: ServiceProcess, t0: int) -> tuple[httpx.Client, str, int, int]:
    c = service.client()
    t = make_type(c, lateness_ms=1_000)
    qid = c.post("/queries", json={"text": drop_query(t)}).json()["id"]
    assert post(c, [ev(t, t0 + 10_000, "A", 100.0)]).json()["accepted"] == 1
    return c, t, qid, t0


def field_of(r: httpx.Response, i: int = 0) -> str:
    body = r.json()
    return body["rejections"][i]["field"] if "rejections" in body else body["detail"][i]["field"]


def test_malformed_json_is_400_and_changes_nothing(setup: tuple[httpx.Client, str, int, int]) -> None:
    c, t, qid, t0 = setup
    before = state(c, qid)
    r = c.post(
        "/events", content=b'[{"type": "' + t.encode() + b'", "ts": 1', headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["detail"][0]["field"] == "body"
    nd = b'{"type":"%s","ts":%d,"symbol":"A","price":1.0,"at":0}\n{oops\n' % (t.encode(), t0 + 10_500)
    r = c.post("/events", content=nd, headers={"content-type": "application/x-ndjson"})
    assert r.status_code == 400 and r.json()["detail"][0]["line"] == 2
    assert state(c, qid) == before  # the good first line was not taken either


@pytest.mark.parametrize(
    ("mutate", "field", "words"),
    [
        (lambda e: e.update(type="NoSuchType"), "events[0].type", "unknown event type"),
        (lambda e: e["attrs"].pop("price"), "events[0].attrs.price", "required"),
        (lambda e: e["attrs"].update(price="cheap"), "events[0].attrs.price", "expected a number"),
        (lambda e: e["attrs"].update(symbol=7), "events[0].attrs.symbol", "expected a string"),
        (lambda e: e["attrs"].update(at="noon"), "events[0].attrs.at", "ISO-8601"),
        (lambda e: e["attrs"].update(extra=1), "events[0].attrs.extra", "unknown attribute"),
        (lambda e: e.update(ts="2024-01-10T06:00:00"), "events[0].ts", "no UTC offset"),
        (lambda e: e.update(ts=None), "events[0].ts", "not null"),
        (lambda e: e.update(id=-4), "events[0].id", "integer"),
        (lambda e: e.update(ts=0), "events[0].ts", "late event"),
    ],
)
def test_bad_event_is_rejected_with_field_and_reason(
    setup: tuple[httpx.Client, str, int, int], mutate: Any, field: str, words: str
) -> None:
    c, t, qid, t0 = setup
    before = state(c, qid)
    e = ev(t, t0 + 10_000, "A", 50.0)  # would match 100 -> 50 if it were taken
    mutate(e)
    r = post(c, [e])
    assert r.status_code == 422, r.text
    body = r.json()
    assert (body["accepted"], body["rejected"]) == (0, 1)
    assert body["rejections"][0]["field"] == field and words in body["rejections"][0]["reason"]
    assert state(c, qid) == before


def test_mixed_batch_takes_the_good_events_unless_atomic(setup: tuple[httpx.Client, str, int, int]) -> None:
    c, t, qid, t0 = setup
    good, bad = ev(t, t0 + 10_100, "B", 1.0), ev(t, t0 + 10_100, "B", 1.0) | {"type": 3}
    before = state(c, qid)
    r = post(c, [good, bad], atomic="true")
    assert r.status_code == 422 and r.json()["accepted"] == 0 and state(c, qid) == before
    r = post(c, [good, bad])
    assert r.status_code == 200 and (r.json()["accepted"], r.json()["rejected"]) == (1, 1)
    assert r.json()["rejections"][0]["index"] == 1


def test_oversize_body_is_413(setup: tuple[httpx.Client, str, int, int]) -> None:
    c, t, qid, t0 = setup
    before = state(c, qid)
    big = [ev(t, t0 + 10_200, "C", 1.0)] * 12_000  # ~1.2 MB > the test service's 1 MB limit
    r = post(c, big)
    assert r.status_code == 413 and r.json()["detail"][0]["field"] == "body"
    r = c.post("/events", content=iter([b"[", b" " * 1_100_000, b"]"]), headers={"content-type": "application/json"})
    assert r.status_code == 413  # chunked, no Content-Length: counted as it streams
    assert state(c, qid) == before


def test_bad_lql_is_422_with_line_and_column(setup: tuple[httpx.Client, str, int, int]) -> None:
    c, t, qid, _ = setup
    before = state(c, qid)
    r = c.post("/queries", json={"text": f"NAME x\nPATTERN SEQ({t} a, {t} b)\nWHERE c.price > 1"})
    assert r.status_code == 422
    d = r.json()["detail"][0]
    assert d["field"] == "body.text" and (d["line"], d["column"]) == (3, 7) and "'c'" in d["reason"]
    r = c.post("/queries", json={"text": "PATTERN SEQ(Nope a"})
    assert r.status_code == 422 and r.json()["detail"][0]["line"] == 1
    r = c.put(f"/queries/{qid}", json={"text": "PATTERN"})
    assert r.status_code == 422
    assert state(c, qid) == before


def test_bad_webhook_url_and_unknown_ids(setup: tuple[httpx.Client, str, int, int]) -> None:
    c, t, qid, _ = setup
    before = state(c, qid)
    for url in ("ftp://example.com/x", "not a url", "http://user:pw@example.com/", "http:///nohost", ""):
        r = c.post("/webhooks", json={"query_id": qid, "url": url})
        assert r.status_code == 422 and r.json()["detail"][0]["field"] == "body.url", (url, r.text)
    r = c.post("/webhooks", json={"query_id": 987654321, "url": "http://127.0.0.1:1/x"})
    assert r.status_code == 404 and r.json()["detail"][0]["field"] == "body.query_id"
    for path in (
        "/queries/987654321",
        "/alerts/987654321",
        "/webhooks/987654321",
        "/deliveries/987654321",
        "/event-types/Nope",
    ):
        r = c.get(path)
        assert r.status_code == 404 and r.json()["detail"][0]["reason"], path
    assert c.post("/queries/987654321/pause").status_code == 404
    assert c.delete("/queries/987654321").status_code == 404
    assert c.get("/queries/99999999999999999999999").status_code == 422  # beyond int64: refused, never a 500
    assert state(c, qid) == before


def test_duplicate_and_invalid_registrations_are_refused(setup: tuple[httpx.Client, str, int, int]) -> None:
    c, t, qid, _ = setup
    q = c.get(f"/queries/{qid}").json()
    assert c.post("/queries", json={"text": drop_query(t, name=q["name"])}).status_code == 409
    assert c.post("/event-types", json={"name": t, "attributes": {}}).status_code == 409
    r = c.post("/event-types", json={"name": unique("T"), "attributes": {"ts": "int"}})
    assert r.status_code == 422 and "reserved" in r.json()["detail"][0]["reason"]
    r = c.post("/event-types", json={"name": unique("T"), "attributes": {"a": "int"}, "partition_key": "b"})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "body.partition_key"
    r = c.patch(f"/event-types/{t}", json={"attributes": {"price": "int"}})
    assert r.status_code == 409 and r.json()["detail"][0]["field"] == "body.attributes.price"
    assert c.delete(f"/event-types/{t}").status_code == 409  # a query uses it


# ---------------------------------------------------------------------------------- API keys


def test_each_scope_does_only_its_own_work(service: ServiceProcess, t0: int) -> None:
    with service.client() as admin_all:
        t = make_type(admin_all)
        keys = {}
        for scope in ("admin", "ingest", "read"):
            r = admin_all.post("/keys", json={"name": f"only-{scope}", "scopes": [scope]})
            assert r.status_code == 201 and r.json()["key"].startswith("lace_")
            keys[scope] = r.json()
    events = [ev(t, t0, "K", 1.0)]
    q = {"text": drop_query(t)}
    with httpx.Client(base_url=service.base, timeout=30) as anon:
        assert anon.get("/healthz").status_code == 200
        for method, path in (("GET", "/queries"), ("GET", "/metrics"), ("POST", "/events"), ("GET", "/alerts")):
            r = anon.request(method, path)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert anon.get("/queries", headers={"Authorization": "Bearer lace_wrong"}).status_code == 401
    with service.client(keys["ingest"]["key"]) as c:
        assert post(c, events).status_code == 200
        assert c.get("/alerts").status_code == 403 and c.post("/queries", json=q).status_code == 403
    with service.client(keys["read"]["key"]) as c:
        assert c.get("/alerts").status_code == 200 and c.get("/metrics").status_code == 200
        assert post(c, events).status_code == 403 and c.post("/queries", json=q).status_code == 403
    with service.client(keys["admin"]["key"]) as c:
        assert c.post("/queries", json=q).status_code == 201
        assert post(c, events).status_code == 403 and c.get("/alerts").status_code == 403
        assert c.post("/keys", json={"name": "x", "scopes": ["superuser"]}).status_code == 422
    with service.client() as admin_all:
        assert admin_all.delete(f"/keys/{keys['ingest']['id']}").status_code == 204
        listed = {k["id"]: k for k in admin_all.get("/keys").json()}
        assert listed[keys["ingest"]["id"]]["revoked_at"] is not None and "key" not in listed[keys["ingest"]["id"]]
    with service.client(keys["ingest"]["key"]) as c:
        assert post(c, events).status_code == 401


def test_keys_are_stored_hashed(service: ServiceProcess) -> None:
    engine = create_engine(service.db.url)
    try:
        with engine.connect() as conn:
            hashes = {r[0] for r in conn.execute(text("SELECT key_hash FROM api_keys"))}
            dump = " ".join(str(v) for row in conn.execute(text("SELECT * FROM api_keys")) for v in row)
    finally:
        engine.dispose()
    assert hashlib.sha256(service.admin.encode()).hexdigest() in hashes
    assert service.admin not in dump and service.admin[12:] not in dump
