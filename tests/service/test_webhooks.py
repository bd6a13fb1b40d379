"""Webhook delivery against a real receiver: retries with back-off, dead-letter, redelivery, same key throughout.

The shared test service allows 6 attempts with back-off base 0.1 s, cap 1 s (conftest).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from cli.service_process import ServiceProcess, wait_until
from cli.webhook_receiver import Receiver
from tests.service.conftest import run_service
from tests.service.test_api_e2e import drop_query, ev, make_type, post, verify

MAX_ATTEMPTS = 6


def one_alert(c: httpx.Client, url: str, t0: int) -> tuple[str, dict[str, Any]]:
    """Register a type, a query and a webhook at ``url``; post one drop; return (secret, delivery)."""
    t = make_type(c)
    qid = c.post("/queries", json={"text": drop_query(t)}).json()["id"]
    secret = c.post("/webhooks", json={"query_id": qid, "url": url}).json()["secret"]
    assert post(c, [ev(t, t0, "W", 100.0), ev(t, t0 + 1, "W", 10.0)]).json()["alerts"] == 1
    alert = c.get("/alerts", params={"query_id": qid}).json()["items"][0]
    delivery = wait_until(lambda: c.get("/deliveries", params={"alert_id": alert["id"]}).json()["items"])[0]
    return secret, delivery


def test_receiver_down_then_back_gets_the_alert_after_retries(service: ServiceProcess, t0: int) -> None:
    rx = Receiver()  # not started: its port refuses connections
    with service.client() as c:
        secret, d = one_alert(c, rx.url, t0)
        assert wait_until(lambda: c.get(f"/deliveries/{d['id']}").json()["attempts"] >= 2, timeout_s=10)
        rx.start()
        try:
            got = rx.wait_for(1, timeout_s=15)
        finally:
            rx.stop()
        detail = wait_until(lambda: (x := c.get(f"/deliveries/{d['id']}").json())["status"] == "delivered" and x)
    assert len(got) == 1 and verify(secret, got[0])
    assert got[0]["headers"]["idempotency-key"] == d["idempotency_key"]
    outcomes = [a["outcome"] for a in detail["log"]]
    assert outcomes[-1] == "delivered" and outcomes[:-1] == ["failed"] * (len(outcomes) - 1) and len(outcomes) >= 3
    assert detail["log"][0]["error"] and detail["log"][0]["status_code"] is None


def test_dead_letter_after_max_attempts_then_redelivery_keeps_the_key(
    service: ServiceProcess, receiver: Receiver, t0: int
) -> None:
    receiver.status = 503
    with service.client() as c:
        secret, d = one_alert(c, receiver.url, t0)
        dead = wait_until(lambda: (x := c.get(f"/deliveries/{d['id']}").json())["status"] == "dead" and x, timeout_s=20)
        assert dead, c.get(f"/deliveries/{d['id']}").json()
        assert dead["attempts"] == MAX_ATTEMPTS
        assert [a["outcome"] for a in dead["log"]] == ["failed"] * (MAX_ATTEMPTS - 1) + ["dead"]
        assert all(a["status_code"] == 503 for a in dead["log"])
        tries = [r for r in receiver.received if r["headers"]["idempotency-key"] == d["idempotency_key"]]
        assert len(tries) == MAX_ATTEMPTS and all(verify(secret, r) for r in tries)
        assert len({r["body"] for r in tries}) == 1  # the same body every time
        gaps = [b["at"] - a["at"] for a, b in zip(tries, tries[1:])]
        assert gaps[-1] > gaps[0]  # exponential back-off
        listed = c.get("/deliveries", params={"status": "dead", "webhook_id": d["webhook_id"]}).json()["items"]
        assert [x["id"] for x in listed] == [d["id"]]

        receiver.status = 200
        assert c.post(f"/deliveries/{d['id']}/redeliver").json()["status"] == "pending"
        assert receiver.wait_for(1)
        assert wait_until(lambda: c.get(f"/deliveries/{d['id']}").json()["status"] == "delivered")
    ok = receiver.ok()
    assert ok[0]["headers"]["idempotency-key"] == d["idempotency_key"] and verify(secret, ok[0])
    assert json.loads(ok[0]["body"]) == json.loads(tries[0]["body"])


def test_a_retry_goes_out_when_it_is_due_not_at_the_next_poll(database_kind: str, tmp_path: Path, t0: int) -> None:
    """With ``webhook_poll_s`` at 60 s, three failed attempts and the fourth delivered take well under a minute: the
    dispatcher sleeps until the next retry is due (``next_due_us``), not a poll interval (an idle service polled its
    database every 0.05 s in the tests before: 5.5 % of a core each)."""
    rx = Receiver()
    answers = iter([503, 503, 503])
    rx.status_for = lambda _body: next(answers, 200)
    rx.start()
    try:
        for svc in run_service(database_kind, tmp_path, webhook_poll_s=60):
            with svc.client() as c:
                started = time.monotonic()
                _, d = one_alert(c, rx.url, t0)
                path = f"/deliveries/{d['id']}"
                detail = wait_until(lambda: (x := c.get(path).json())["status"] == "delivered" and x,  # noqa: B023
                                    timeout_s=30)
                took = time.monotonic() - started
    finally:
        rx.stop()
    assert [a["outcome"] for a in detail["log"]] == ["failed"] * 3 + ["delivered"], detail["log"]
    assert took < 20, f"4 attempts took {took:.1f} s: the retries waited for a poll"
