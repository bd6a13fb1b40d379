"""Webhooks for real outages (issue 13, items 3, 4 and the webhook part of 8), against a real
``lace serve`` and real receivers, on SQLite and PostgreSQL.

The module's own service has a short "old-style" schedule (4 attempts, back-off 0.05 s .. 0.2 s:
under half a second of retries) and a circuit breaker that opens after 3 consecutive endpoint
failures and probes every 0.3 s .. 1 s; a receiver outage of seconds is then "longer than the
retry schedule", as the 2-minute outage was for the old defaults.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.service_process import Database, ServiceProcess, make_service, wait_until
from cli.webhook_receiver import Receiver
from service.core.config import Settings
from tests.service.conftest import run_service
from tests.service.test_api_e2e import drop_query, ev, make_type, post

HARD = {
    "webhook_max_attempts": 4,
    "webhook_backoff_base_s": 0.05,
    "webhook_backoff_max_s": 0.2,
    "webhook_breaker_failures": 3,
    "webhook_breaker_probe_s": 0.3,
    "webhook_breaker_probe_max_s": 1.0,
}


@pytest.fixture(scope="module")
def hsvc(database_kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    yield from run_service(database_kind, tmp_path_factory.mktemp(f"wh-{database_kind}"), **HARD)


def verify_any(secret: str, rec: dict[str, Any]) -> bool:
    """A receiver's check written from docs/rest.md: some ``v1`` of the header matches under ``secret``."""
    parts = [p.split("=", 1) for p in rec["headers"]["x-lace-signature"].split(",")]
    t = next(v for k, v in parts if k == "t")
    mac = hmac.new(secret.encode(), t.encode() + b"." + rec["body"], hashlib.sha256).hexdigest()
    return abs(time.time() - int(t)) < 300 and any(k == "v1" and hmac.compare_digest(v, mac) for k, v in parts)


def setup_hook(c: httpx.Client, url: str) -> tuple[str, int, int, str]:
    """A type, a drop query and a webhook at ``url``: (type, query id, webhook id, secret)."""
    t = make_type(c)
    qid = c.post("/queries", json={"text": drop_query(t)}).json()["id"]
    r = c.post("/webhooks", json={"query_id": qid, "url": url})
    assert r.status_code == 201, r.text
    return t, qid, r.json()["id"], r.json()["secret"]


def drops(c: httpx.Client, t: str, t0: int, n: int, tag: str = "S") -> int:
    """Post ``n`` drops (one alert each, distinct symbols); return the alerts recorded."""
    events = [
        e for i in range(n) for e in (ev(t, t0 + 10 * i, f"{tag}{i}", 100.0), ev(t, t0 + 10 * i + 1, f"{tag}{i}", 10.0))
    ]
    r = post(c, events)
    assert r.status_code == 200, r.text
    return int(r.json()["alerts"])


def deliveries(c: httpx.Client, webhook_id: int, **params: Any) -> list[dict[str, Any]]:
    return list(c.get("/deliveries", params={"webhook_id": webhook_id, "limit": 1000, **params}).json()["items"])


def all_delivered(c: httpx.Client, webhook_id: int, n: int) -> bool:
    ds = deliveries(c, webhook_id)
    return len(ds) == n and all(d["status"] == "delivered" for d in ds)


def per_key(rx: Receiver) -> Counter[str]:
    return Counter(r["headers"]["idempotency-key"] for r in rx.ok())


# ------------------------------------------------------------------ 3. idempotency keys


def test_delete_then_create_gives_new_idempotency_keys(service: ServiceProcess, receiver: Receiver, t0: int) -> None:
    keys: list[str] = []
    with service.client() as c:
        for round_ in range(2):
            t, qid, _, _ = setup_hook(c, receiver.url)
            assert drops(c, t, t0 + round_ * 1000, 1) == 1
            got = receiver.wait_for(round_ + 1)
            keys.append(got[-1]["headers"]["idempotency-key"])
            assert c.delete(f"/queries/{qid}").status_code == 204  # its alert and webhook ids may come back
    assert len(set(keys)) == 2, keys
    assert all(k.startswith("lace-") and len(k) >= 30 for k in keys), keys


# ------------------------------------------------------------------ 8. target addresses


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[fe80::1]/x",
        "http://10.0.0.5/hook",
        "http://192.168.1.1:8080/hook",
        "http://[fd00::1]/hook",
        "http://0.0.0.0/hook",
        "http://[::ffff:169.254.169.254]/x",
    ],
)
def test_link_local_and_private_targets_are_refused(service: ServiceProcess, url: str) -> None:
    with service.client() as c:
        t = make_type(c)
        qid = c.post("/queries", json={"text": drop_query(t)}).json()["id"]
        r = c.post("/webhooks", json={"query_id": qid, "url": url})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["field"] == "body.url" and "not allowed" in r.json()["detail"][0]["reason"]
        ok = c.post("/webhooks", json={"query_id": qid, "url": "http://127.0.0.1:9/x"})  # the tests allow loopback
        assert ok.status_code == 201
        r = c.patch(f"/webhooks/{ok.json()['id']}", json={"url": url})
        assert r.status_code == 422 and r.json()["detail"][0]["field"] == "body.url"


def test_target_rules_follow_the_settings() -> None:
    from service.webhooks.targets import TargetRefused, check_target

    strict = Settings(_env_file=None)  # type: ignore[call-arg]
    for host in ("127.0.0.1", "::1", "localhost", "169.254.169.254", "10.1.2.3", "100.64.0.1"):
        with pytest.raises(TargetRefused):
            check_target(host, strict)
    check_target("93.184.216.34", strict)  # a public address
    loop = Settings(_env_file=None, webhook_allow_loopback=True)  # type: ignore[call-arg]
    check_target("127.0.0.1", loop)
    with pytest.raises(TargetRefused):
        check_target("169.254.169.254", loop)
    check_target("169.254.169.254", Settings(_env_file=None, webhook_allow_link_local=True))  # type: ignore[call-arg]
    check_target("10.1.2.3", Settings(_env_file=None, webhook_allow_private=True))  # type: ignore[call-arg]


def test_default_schedule_covers_a_day() -> None:
    lo, hi = Settings(_env_file=None).retry_span_s()  # type: ignore[call-arg]
    assert 86_400 <= lo < hi


# ------------------------------------------------------------------ 4. outages


def test_outage_longer_than_the_schedule_dead_letters_nothing(hsvc: ServiceProcess, t0: int) -> None:
    rx = Receiver()  # not started: connections are refused
    n = 30
    with hsvc.client() as c:
        t, _, wid, secret = setup_hook(c, rx.url)
        assert drops(c, t, t0, n) == n
        # far longer than the 4 attempts (< 0.5 s) of the old schedule
        assert wait_until(lambda: c.get(f"/webhooks/{wid}").json()["circuit"]["state"] != "closed", timeout_s=10)
        time.sleep(4.0)
        assert not deliveries(c, wid, status="dead")
        held = c.get(f"/webhooks/{wid}").json()["circuit"]
        assert held["state"] in ("open", "probing") and held["failures"] >= 3
        rx.start()
        try:
            assert wait_until(lambda: all_delivered(c, wid, n), timeout_s=30), deliveries(c, wid)[:3]
            time.sleep(0.5)
            keys = per_key(rx)
            recs = rx.ok()
        finally:
            rx.stop()
        assert c.get(f"/webhooks/{wid}").json()["circuit"]["state"] == "closed"
        assert not deliveries(c, wid, status="dead")
    assert len(keys) == n and set(keys.values()) == {1}  # every alert once per key
    assert len({json.loads(r["body"])["id"] for r in recs}) == n
    assert all(verify_any(secret, r) for r in recs)


def test_circuit_breaker_holds_deliveries_and_probes(hsvc: ServiceProcess, receiver: Receiver, t0: int) -> None:
    receiver.status = 503
    n = 10
    with hsvc.client() as c:
        t, _, wid, _ = setup_hook(c, receiver.url)
        assert drops(c, t, t0, n) == n
        assert wait_until(lambda: c.get(f"/webhooks/{wid}").json()["circuit"]["state"] != "closed", timeout_s=10)
        time.sleep(0.5)
        before = len(receiver.received)
        time.sleep(3.0)
        probes = len(receiver.received) - before
        # held: one probe at a time, every 0.3 s .. 1 s, not n deliveries retried
        assert 1 <= probes <= 8, probes
        circuit = c.get(f"/webhooks/{wid}").json()["circuit"]
        assert circuit["opened_at"] and (circuit["next_probe_at"] or circuit["state"] == "probing"), circuit
        assert not deliveries(c, wid, status="dead")
        receiver.status = 200
        assert wait_until(lambda: all_delivered(c, wid, n), timeout_s=20)
        assert c.get(f"/webhooks/{wid}").json()["circuit"] == {
            "state": "closed",
            "failures": 0,
            "opened_at": None,
            "next_probe_at": None,
        }
    assert len(per_key(receiver)) == n and set(per_key(receiver).values()) == {1}


def test_rejected_delivery_dead_letters_without_opening_the_circuit_then_bulk_redeliver(
    hsvc: ServiceProcess, receiver: Receiver, t0: int
) -> None:
    """A 4xx is the receiver refusing one delivery (the endpoint is up): it does not trip the
    breaker; the delivery dead-letters after its attempts. Bulk redeliver by state and time range."""
    receiver.status = 400
    with hsvc.client() as c:
        t, _, wid, _ = setup_hook(c, receiver.url)
        assert drops(c, t, t0, 3, "A") == 3
        assert wait_until(lambda: len(deliveries(c, wid, status="dead")) == 3, timeout_s=15)
        assert c.get(f"/webhooks/{wid}").json()["circuit"]["state"] == "closed"
        time.sleep(0.05)
        mid = int(time.time() * 1000)
        time.sleep(0.05)
        assert drops(c, t, t0 + 100_000, 2, "B") == 2
        assert wait_until(lambda: len(deliveries(c, wid, status="dead")) == 5, timeout_s=15)
        dead = deliveries(c, wid, status="dead")
        late_keys = {d["idempotency_key"] for d in dead if d["created_at"] > _iso_ms(mid)}
        assert len(late_keys) == 2
        receiver.status = 200
        n_before = len(receiver.ok())
        r = c.post(f"/webhooks/{wid}/redeliver", json={"status": ["dead"], "from": mid})
        assert r.status_code == 200 and r.json() == {"redelivered": 2}, r.text
        assert wait_until(lambda: len(deliveries(c, wid, status="delivered")) == 2)
        assert {x["headers"]["idempotency-key"] for x in receiver.ok()[n_before:]} == late_keys
        assert len(deliveries(c, wid, status="dead")) == 3
        r = c.post(f"/webhooks/{wid}/redeliver", json={"status": ["dead"], "to": "2999-01-01T00:00:00Z"})
        assert r.json() == {"redelivered": 3}
        assert wait_until(lambda: all_delivered(c, wid, 5))
        # delivered ones can be sent again too (same keys); nothing matches an empty range
        assert c.post(f"/webhooks/{wid}/redeliver", json={"status": ["delivered"], "to": mid}).json() == {
            "redelivered": 3
        }
        assert c.post(f"/webhooks/{wid}/redeliver", json={"from": mid, "to": mid}).json() == {"redelivered": 0}
        bad = c.post(f"/webhooks/{wid}/redeliver", json={"status": ["exploded"]})
        assert bad.status_code == 422
        bad = c.post(f"/webhooks/{wid}/redeliver", json={"from": "yesterday"})
        assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "body.from"
        assert wait_until(lambda: all_delivered(c, wid, 5))
    keys = per_key(receiver)
    assert len(keys) == 5 and sorted(keys.values()) == [1, 1, 2, 2, 2]


def _iso_ms(ms: int) -> str:
    from service.schemas.common import iso

    return iso(ms * 1000)


# ------------------------------------------------------------------ management


def test_pause_and_resume_hold_then_send(hsvc: ServiceProcess, receiver: Receiver, t0: int) -> None:
    with hsvc.client() as c:
        t, _, wid, _ = setup_hook(c, receiver.url)
        r = c.post(f"/webhooks/{wid}/pause")
        assert r.status_code == 200 and r.json()["active"] is False
        assert drops(c, t, t0, 3) == 3
        time.sleep(1.0)
        assert receiver.received == []
        ds = deliveries(c, wid)
        assert len(ds) == 3 and {d["status"] for d in ds} == {"pending"}
        assert c.post(f"/webhooks/{wid}/resume").json()["active"] is True
        assert wait_until(lambda: all_delivered(c, wid, 3))
        assert c.get(f"/webhooks/{wid}").json()["active"] is True
    assert len(per_key(receiver)) == 3


def test_url_update_moves_pending_deliveries(hsvc: ServiceProcess, receiver: Receiver, t0: int) -> None:
    down = Receiver()  # never started
    with hsvc.client() as c:
        t, _, wid, secret = setup_hook(c, down.url)
        assert drops(c, t, t0, 2) == 2
        assert wait_until(lambda: all(d["attempts"] >= 1 for d in deliveries(c, wid)) and deliveries(c, wid))
        keys = {d["idempotency_key"] for d in deliveries(c, wid)}
        r = c.patch(f"/webhooks/{wid}", json={"url": receiver.url})
        assert r.status_code == 200 and r.json()["url"] == receiver.url
        assert r.json()["circuit"]["state"] == "closed"
        assert wait_until(lambda: all_delivered(c, wid, 2), timeout_s=15), (
            c.get(f"/webhooks/{wid}").json(),
            [c.get(f"/deliveries/{d['id']}").json() for d in deliveries(c, wid)],
        )
        assert c.patch(f"/webhooks/{wid}", json={"url": "ftp://x"}).status_code == 422
        assert c.patch(f"/webhooks/{wid}", json={"nope": 1}).status_code == 422
    assert set(per_key(receiver)) == keys
    assert all(verify_any(secret, r) for r in receiver.ok())


def test_secret_rotation_signs_with_both_during_the_grace_period(
    hsvc: ServiceProcess, receiver: Receiver, t0: int
) -> None:
    with hsvc.client() as c:
        t, _, wid, s1 = setup_hook(c, receiver.url)
        r = c.post(f"/webhooks/{wid}/rotate-secret", json={"grace_s": 600})
        assert r.status_code == 200, r.text
        s2 = r.json()["secret"]
        assert s2 != s1 and r.json()["previous_secret_expires_at"]
        assert drops(c, t, t0, 1) == 1
        rec = receiver.wait_for(1)[0]
        assert rec["headers"]["x-lace-signature"].count("v1=") == 2
        assert verify_any(s1, rec) and verify_any(s2, rec) and not verify_any(s1 + "x", rec)
        # the old secret is dropped at once with no grace
        s3 = c.post(f"/webhooks/{wid}/rotate-secret", json={"grace_s": 0}).json()["secret"]
        assert drops(c, t, t0 + 10_000, 1, "Z") == 1
        rec = receiver.wait_for(2)[1]
        assert rec["headers"]["x-lace-signature"].count("v1=") == 1
        assert verify_any(s3, rec) and not verify_any(s2, rec) and not verify_any(s1, rec)
        assert "secret" not in c.get(f"/webhooks/{wid}").json()
        assert c.post(f"/webhooks/{wid}/rotate-secret", json={"grace_s": -1}).status_code == 422


def test_delivery_log_survives_webhook_deletion(hsvc: ServiceProcess, receiver: Receiver, t0: int) -> None:
    down = Receiver()
    with hsvc.client() as c:
        t, qid, wid, _ = setup_hook(c, receiver.url)
        assert drops(c, t, t0, 2) == 2
        assert wait_until(lambda: all_delivered(c, wid, 2))
        w2 = c.post("/webhooks", json={"query_id": qid, "url": down.url}).json()["id"]
        c.post(f"/webhooks/{w2}/pause")
        c.post(f"/webhooks/{wid}/pause")  # its third delivery stays pending until the delete
        assert drops(c, t, t0 + 10_000, 1, "P") == 1
        assert c.delete(f"/webhooks/{wid}").status_code == 204
        assert c.delete(f"/webhooks/{w2}").status_code == 204
        assert c.get(f"/webhooks/{wid}").status_code == 404
        assert wid not in [w["id"] for w in c.get("/webhooks", params={"query_id": qid}).json()]
        kept = deliveries(c, wid)
        assert len(kept) == 3 and sorted(d["status"] for d in kept) == ["cancelled", "delivered", "delivered"]
        detail = c.get(f"/deliveries/{kept[0]['id']}").json()
        assert [a["outcome"] for a in detail["log"]] == ["delivered"]
        assert [d["status"] for d in deliveries(c, w2)] == ["cancelled"]
        assert c.post(f"/deliveries/{kept[0]['id']}/redeliver").status_code == 409
        assert c.post(f"/webhooks/{wid}/redeliver", json={}).status_code == 404
        time.sleep(0.3)
    assert len(receiver.ok()) == 2  # the cancelled one was never sent


# ------------------------------------------------------------------ SIGKILL right after a 2xx


@pytest.mark.slow
def test_sigkill_right_after_a_2xx(fresh_db: Database, tmp_path: Path, t0: int) -> None:
    """The receiver SIGKILLs the service right after answering 2xx. The delivered mark is written the
    moment the answer arrives, so at most the deliveries in flight at that instant can come again,
    with their own key; every alert arrives, none under two keys."""
    rx = Receiver()
    rx.delay_s = 0.01
    svc = make_service(fresh_db, tmp_path / "data", webhook_concurrency=1, **HARD)
    kill_after = 5
    n = 12

    def kill(_: dict[str, Any]) -> None:
        if len(rx.ok()) == kill_after and svc.proc is not None:
            svc.proc.kill()

    rx.after_response = kill
    rx.start()
    try:
        svc.start()
        with svc.client() as c:
            t, _, wid, _ = setup_hook(c, rx.url)
            assert drops(c, t, t0, n) == n
        assert svc.proc is not None
        svc.proc.wait(timeout=30)
        rx.after_response = None
        svc.start()
        with svc.client() as c:
            assert wait_until(lambda: all_delivered(c, wid, n), timeout_s=30)
            time.sleep(0.3)
            ds = deliveries(c, wid)
    finally:
        svc.stop()
        rx.stop()
    keys = per_key(rx)
    by_alert: dict[int, set[str]] = {}
    for r in rx.ok():
        by_alert.setdefault(json.loads(r["body"])["id"], set()).add(r["headers"]["idempotency-key"])
    assert len(by_alert) == n and all(len(k) == 1 for k in by_alert.values())  # no alert under two keys
    assert set(keys) == {d["idempotency_key"] for d in ds}
    # with one request in flight, at most the one answered just before the kill comes again
    assert sum(keys.values()) - n <= 1, keys


def claim_counts(c: httpx.Client) -> tuple[float, float]:
    """(claims that leased deliveries, deliveries leased) since the service started, from ``GET /metrics``."""
    values = {
        line.split(" ")[0]: float(line.split(" ")[1]) for line in c.get("/metrics").text.splitlines() if line[:1] != "#"
    }
    return values["lace_delivery_claims_total"], values["lace_deliveries_claimed_total"]


def test_claims_are_large_and_each_lease_covers_its_wait(fresh_db: Database, tmp_path: Path, t0: int) -> None:
    """One attempt in flight (``webhook_concurrency=1``), up to 20 leased (``webhook_batch``): 200 deliveries
    released at once are leased in claims of 10-20, not one per free slot (200 claims); then 20 deliveries to a
    receiver that answers after 0.4 s (a 1 s timeout) wait up to 8 s for the one slot, longer than a lease of
    ``timeout + 5`` s: each is sent once, as its lease covers the wait behind the 19 leased before it. (With a 0.5 s
    timeout, one answer in 220 came after it at load 20-27 and was rightly sent again: a retry, not a second lease.)"""
    rx = Receiver()
    rx.start()
    svc = make_service(fresh_db, tmp_path / "data", webhook_concurrency=1, webhook_batch=20, webhook_timeout_s=1.0)
    svc.start()
    try:
        with svc.client() as c:
            t, _, wid, _ = setup_hook(c, rx.url)
            assert c.post(f"/webhooks/{wid}/pause").status_code == 200
            assert drops(c, t, t0, 200) == 200
            claims0, claimed0 = claim_counts(c)
            assert c.post(f"/webhooks/{wid}/resume").status_code == 200
            assert wait_until(lambda: all_delivered(c, wid, 200), timeout_s=60)
            claims, claimed = claim_counts(c)
            assert claimed - claimed0 == 200
            assert claims - claims0 <= 200 / 10 + 2, (claims - claims0, claimed - claimed0)

            rx.delay_s = 0.4
            assert drops(c, t, t0 + 10_000, 20, tag="W") == 20
            assert wait_until(lambda: all_delivered(c, wid, 220), timeout_s=60)
            assert claim_counts(c)[1] - claimed == 20  # none leased twice
    finally:
        svc.stop()
        rx.stop()
    assert len(rx.ok()) == 220 and set(per_key(rx).values()) == {1}


@pytest.mark.parametrize("database_kind", ["sqlite"], indirect=True)
def test_deliveries_go_through_the_proxy_of_http_proxy_and_not_for_no_proxy(fresh_db: Database, tmp_path: Path):
    """``HTTP_PROXY`` in the service's environment: a webhook's delivery goes to that proxy (the request for
    ``http://localhost:<port>/hook`` arrives at the proxy, nothing listens on that port), a host in ``NO_PROXY``
    is sent to directly. The dispatcher reads the proxy once per host (``env_proxy``), not per request."""
    from cli.webhook_receiver import free_port

    proxy, direct = Receiver(), Receiver()
    proxy.start()
    direct.start()
    svc = make_service(fresh_db, tmp_path / "data")
    svc.env.update(HTTP_PROXY=f"http://127.0.0.1:{proxy.port}", NO_PROXY="127.0.0.1")
    svc.start()
    try:
        nowhere = free_port()
        with svc.client() as c:
            t, qid, _, _ = setup_hook(c, f"http://localhost:{nowhere}/hook")
            assert c.post("/webhooks", json={"query_id": qid, "url": direct.url}).status_code == 201
            post(c, [ev(t, 1_000, "IBM", 100.0), ev(t, 2_000, "IBM", 80.0)])
            got, straight = proxy.wait_for(1), direct.wait_for(1)
        assert [r["headers"]["host"] for r in got] == [f"localhost:{nowhere}"]
        assert [r["headers"]["host"] for r in straight] == [f"127.0.0.1:{direct.port}"]  # NO_PROXY: not proxied
        assert [len(proxy.received), len(direct.received)] == [1, 1]
    finally:
        svc.stop()
        proxy.stop()
        direct.stop()
