"""Issue 24 item 3: a recorded resume point is never cut by LACE_REPLAY_MAX_S.

Live-and-archived workers still have unanswered live instances (SLLAA, T_L = 1 hour: they wait in open
subwindows) when the stream's event time jumps 30 days ahead; the process is SIGKILLed before they are
answered. The restart replay must go back to the query's recorded position (``resume_seq``: since issue 43 what
its worker acknowledged its unfinished work needs; the limit of 7 days used to clamp it to ``newest - 7 days``:
nothing pending was replayed, no result came, nothing was logged). Every alert of the fault-free run is delivered,
each idempotency key once.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cli.service_process import Database, make_service, wait_until
from cli.webhook_receiver import Receiver
from engine.events import Event
from tests.service.test_live_archived import expected, post_all, wait_idle

DAY_MS = 86_400_000
TEXT = (
    "NAME gone\nLIVE PATTERN SEQ(pass24 p) WHERE p.at = 'B'\n"
    "ARCHIVED PATTERN SEQ(pass24 q) WHERE q.at = 'A' PARTITION BY car\nLOOKBACK 30 min\n"
    "JOIN p.car = q.car AND p.ts - q.ts < 20 min\nRETURN p.car AS car, q.ts AS entered"
)


@pytest.mark.slow
@pytest.mark.integration
def test_sigkill_after_a_30_day_jump_delivers_every_pending_result(
    fresh_db: Database, tmp_path: Path, receiver: Receiver
) -> None:
    base_ms = int(time.time() * 1000) - 60 * DAY_MS
    cars = 120
    archived = [Event(1 + i, "pass24", (base_ms + i * 60_000) * 1000, {"car": i, "at": "A"}) for i in range(cars)]
    half = cars // 2
    live = [
        Event(1_000 + i, "pass24", (base_ms + i * 60_000 + 300_000) * 1000, {"car": i, "at": "B"})
        for i in range(half, cars)
        if i % 3 != 0
    ]
    live = sorted(archived[half:] + live, key=Event.order_key)
    archived = archived[:half]
    jump = Event(5_000, "pass24", max(e.ts for e in live) + 30 * DAY_MS * 1000, {"car": -1, "at": "C"})
    want = expected(TEXT, "sllaa", archived, [*live, jump])
    assert len(want) > 20
    svc = make_service(fresh_db, tmp_path / "data", la_checkpoint_s=0.2)
    svc.start()
    try:
        with svc.client() as c:
            r = c.post("/event-types", json={"name": "pass24", "attributes": {"car": "int", "at": "string"}})
            assert r.status_code == 201, r.text
            post_all(c, archived)
            q = c.post("/queries", json={"text": TEXT, "algorithm": "sllaa", "tolerance": "1 hour"}).json()
            assert c.post("/webhooks", json={"query_id": q["id"], "url": receiver.url}).status_code == 201
            post_all(c, live, batch=40)

            def pending() -> int:
                la = c.get(f"/queries/{q['id']}").json()["stats"]["live_archived"]
                return int(la["pending_live_instances"]) if la["backlog_events"] == 0 else 0

            assert wait_until(pending, timeout_s=60) >= len(want) // 2, "the live instances do not wait"
            time.sleep(1.0)  # a restart checkpoint recorded them
            post_all(c, [jump])  # acknowledged: after the restart the newest archived ts is 30 days ahead
        svc.kill()  # the instances the jump released are not answered yet (the first Spark job takes seconds)
        before = len(receiver.ok())
        svc.start()
        with svc.client() as c:
            wait_idle(c, [q["id"]], receiver)
            got = receiver.ok()
            stats = c.get(f"/queries/{q['id']}").json()["stats"]
            metrics = c.get("/metrics").text
    finally:
        svc.stop()
    assert before < len(want), "every result was delivered before the kill: the test proves nothing"
    keys = [d["headers"]["idempotency-key"] for d in got]
    assert len(keys) == len(set(keys)), "an alert was delivered twice"
    have = {json.dumps(json.loads(d["body"])["events"], sort_keys=True) for d in got}
    assert have == want, f"{len(want - have)} alerts lost, {len(have - want)} unexpected"
    assert "replay_cut_ms" not in stats  # the resume point was not cut
    assert 'lace_replay_cut_total{query="gone"}' not in metrics
