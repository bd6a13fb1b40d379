"""Crash: SIGKILL ``lace serve`` mid-stream, restart it, and every expected alert is delivered,
exactly once per idempotency key, with nothing alerted twice under another key.

Partial matches straddle the crash (a window of 10 s over events 50 ms apart), so the restart
must rebuild them by replaying the archive. The receiver answers slowly, so deliveries are in
flight when the process dies and must be resent with their key.
"""
from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.service_process import CLOCK, Database, make_service, wait_until
from cli.webhook_receiver import Receiver
from engine.compiler import compile_query
from engine.events import Event
from engine.matcher import Matcher

QUERY = """NAME updown
PATTERN SEQ(T a, T b)
WHERE a.kind = 'up' AND b.kind = 'down' AND b.v > a.v
PARTITION BY k
STRATEGY skip_till_next_match
WITHIN 10 seconds
RETURN a.v AS up, b.v AS down"""
BATCHES, PER_BATCH, STEP_MS = 24, 40, 50


def stream(t0: int) -> list[list[dict[str, Any]]]:
    rng = random.Random(7)
    events, n = [], 0
    for _ in range(BATCHES):
        batch = []
        for _ in range(PER_BATCH):
            n += 1
            attrs = {"k": f"k{rng.randrange(4)}", "kind": rng.choice(["up", "down", "flat"]), "v": rng.randrange(100)}
            batch.append({"id": n, "type": "T", "ts": t0 + n * STEP_MS, "attrs": attrs})
        events.append(batch)
    return events


def expected(batches: list[list[dict[str, Any]]]) -> set[tuple[int, int]]:
    m = Matcher(compile_query(QUERY))
    out = set()
    for b in batches:
        for e in b:
            for x in m.push(Event(e["id"], "T", e["ts"] * 1000, e["attrs"])):
                out.add((x.ids()["a"][0], x.ids()["b"][0]))
    return out


@pytest.mark.slow
@pytest.mark.integration
def test_sigkill_mid_stream_loses_no_alert_and_sends_none_twice(fresh_db: Database, tmp_path: Path) -> None:
    rx = Receiver()
    rx.delay_s = 0.03
    rx.start()
    svc = make_service(fresh_db, tmp_path / "data", archive_flush_age_s=0.3)
    batches = stream(CLOCK.take())
    want = expected(batches)
    assert len(want) > 20
    crash_at = BATCHES // 2
    boundary = crash_at * PER_BATCH  # ids up to here were acknowledged before the crash
    assert any(a <= boundary < b for a, b in want)  # some matches need state from before the crash
    try:
        svc.start()
        with svc.client() as c:
            r = c.post("/event-types", json={"name": "T", "attributes": {"k": "string", "kind": "string", "v": "int"}})
            assert r.status_code == 201
            qid = c.post("/queries", json={"text": QUERY}).json()["id"]
            assert c.post("/webhooks", json={"query_id": qid, "url": rx.url}).status_code == 201
            for b in batches[:crash_at]:
                assert c.post("/events", json=b).json()["accepted"] == PER_BATCH
        # the next batch is in flight when the process dies
        answer: list[httpx.Response] = []

        def send() -> None:
            try:
                answer.append(httpx.post(svc.base + "/events", json=batches[crash_at], headers=svc.client().headers))
            except httpx.HTTPError:
                pass

        th = threading.Thread(target=send)
        th.start()
        time.sleep(0.005)
        svc.kill()
        th.join()
        received_before = len(rx.received)

        svc.start()
        with svc.client() as c:
            r = c.post("/events", json=batches[crash_at])  # resend: what was archived comes back as late
            assert r.status_code in (200, 422)
            for b in batches[crash_at + 1 :]:
                assert c.post("/events", json=b).json()["accepted"] == PER_BATCH
            alerts = wait_until(lambda: len(c.get("/alerts", params={"limit": 1000}).json()["items"]) >= len(want))
            assert alerts
            recorded = c.get("/alerts", params={"limit": 1000}).json()["items"]

        def keys() -> dict[str, set[bytes]]:
            by: dict[str, set[bytes]] = {}
            for rec in rx.ok():
                by.setdefault(rec["headers"]["idempotency-key"], set()).add(rec["body"])
            return by

        assert wait_until(lambda: len(keys()) >= len(want), timeout_s=30)
        time.sleep(0.5)  # anything extra would arrive now
        by_key = keys()
    finally:
        svc.stop()
        rx.stop()
    assert received_before > 0  # deliveries were flowing when the process died
    assert all(len(bodies) == 1 for bodies in by_key.values()), [b for b in by_key.values() if len(b) > 1][:2]
    delivered = [json.loads(next(iter(b)))["events"] for b in by_key.values()]
    pairs = [(e["a"][0], e["b"][0]) for e in delivered]
    assert len(pairs) == len(set(pairs))  # no alert sent twice under two keys
    assert set(pairs) == want  # none lost, none invented
    assert {(a["events"]["a"][0], a["events"]["b"][0]) for a in recorded} == want
    assert len(recorded) == len(want)
