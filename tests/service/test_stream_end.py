"""The end of a stream (issue 25, "an end you can reach"): the last SLLAA subwindows close without a fake event,
by the stream's idleness (``LACE_IDLE_TIMEOUT_S``) and by ``POST /event-types/{name}/end``; nothing is delivered
twice afterwards; the end survives a SIGTERM restart; ``stats.live_archived`` says when a query has caught up.

Real ``lace serve`` (uvicorn subprocess, its own local Spark), real webhook receiver, SQLite and PostgreSQL. The
expected results come from the engine's SLLAA runner over an in-memory archive, flushed at the end.
"""
from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.service_process import ServiceProcess, wait_until
from cli.webhook_receiver import Receiver
from engine.events import Event
from tests.service.conftest import run_service
from tests.service.test_live_archived import expected, post_all, wait_idle

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.integration]

TEXT = (
    "NAME speeding\nLIVE PATTERN SEQ(pass p) WHERE p.at = 'B'\n"
    "ARCHIVED PATTERN SEQ(pass q) WHERE q.at = 'A' PARTITION BY car\nLOOKBACK 30 min\n"
    "JOIN p.car = q.car AND p.ts - q.ts < 20 min\nRETURN p.car AS car, q.ts AS entered"
)
BASE_MS = 1_500_000_000_000


def passes(cars: int = 60) -> tuple[list[Event], list[Event]]:
    """(archived, live): cars pass A a minute apart; two thirds pass B 5 minutes later (live); the first half's A
    passes are archived before the query starts."""
    a = [Event(1_000 + i, "pass", (BASE_MS + i * 60_000) * 1000, {"car": i, "at": "A"}) for i in range(cars)]
    b = [
        Event(5_000 + i, "pass", (BASE_MS + i * 60_000 + 300_000) * 1000, {"car": i, "at": "B"})
        for i in range(cars // 2, cars)
        if i % 3 != 0
    ]
    half = cars // 2
    return a[:half], sorted(a[half:] + b, key=Event.order_key)


def start(c: httpx.Client, receiver: Receiver, archived: list[Event], live: list[Event]) -> int:
    """Register the type and the SLLAA query (T_L = 1 day: no subwindow closes by the watermark), post both parts."""
    r = c.post("/event-types", json={"name": "pass", "attributes": {"car": "int", "at": "string"}})
    assert r.status_code == 201, r.text
    post_all(c, archived)
    q = c.post("/queries", json={"text": TEXT, "algorithm": "sllaa", "tolerance": "1 day"})
    assert q.status_code == 201, q.text
    qid = int(q.json()["id"])
    assert c.post("/webhooks", json={"query_id": qid, "url": receiver.url}).status_code == 201
    post_all(c, live, batch=20)
    return qid


def la_stats(c: httpx.Client, qid: int) -> dict[str, Any]:
    return dict(c.get(f"/queries/{qid}").json()["stats"]["live_archived"])


def stat(c: httpx.Client, qid: int, name: str) -> Any:
    return la_stats(c, qid)[name]


def no_backlog(c: httpx.Client, qid: int) -> bool:
    return la_stats(c, qid)["backlog_events"] == 0


def delivered(receiver: Receiver) -> tuple[set[str], list[str]]:
    """(result event ids as JSON, idempotency keys) of the deliveries received."""
    got = receiver.ok()
    return (
        {json.dumps(json.loads(d["body"])["events"], sort_keys=True) for d in got},
        [d["headers"]["idempotency-key"] for d in got],
    )


def test_an_idle_stream_closes_its_last_subwindow(database_kind: str, tmp_path: Path, receiver: Receiver) -> None:
    archived, live = passes()
    want = expected(TEXT, "sllaa", archived, live)
    assert want
    for svc in run_service(database_kind, tmp_path, idle_timeout_s=2):
        with svc.client() as c:
            qid = start(c, receiver, archived, live)
            la = la_stats(c, qid)
            new = {"backlog_s", "requests_waiting", "caught_up", "oldest_pending_start", "oldest_pending_wait_s"}
            assert new <= set(la)
            # before the idle timeout, the subwindow waits (T_L = 1 day): the last results come from idleness
            assert wait_until(lambda: delivered(receiver)[0] == want, timeout_s=120), (
                f"{len(delivered(receiver)[0])} of {len(want)} results; stats {la_stats(c, qid)}"
            )
            la = la_stats(c, qid)
            assert la["subwindows_closed_idle"] >= 1
            assert wait_until(partial(stat, c, qid, "caught_up"), timeout_s=30)
            la = la_stats(c, qid)
            assert la["oldest_pending_start"] is None and la["backlog_s"] == 0.0
            # a later event (no new result) after the idle close: nothing is delivered again
            later = (max(e.ts for e in live) // 1000) + 3_600_000
            r = c.post("/events", json=[{"type": "pass", "ts": later, "attrs": {"car": -1, "at": "B"}}])
            assert r.status_code == 200, r.text
            wait_idle(c, [qid], receiver)
            time.sleep(3)  # idle again: the (empty) subwindow closes once more
            have, keys = delivered(receiver)
            assert have == want and len(keys) == len(set(keys)) == len(want)


def test_ending_a_stream_closes_it_durably(database_kind: str, tmp_path: Path, receiver: Receiver) -> None:
    archived, live = passes()
    want = expected(TEXT, "sllaa", archived, live)
    newest_ms = max(e.ts for e in live) // 1000
    svc: ServiceProcess
    for svc in run_service(database_kind, tmp_path, idle_timeout_s=3_600):  # only the end closes the subwindow
        with svc.client() as c:
            qid = start(c, receiver, archived, live)
            assert wait_until(partial(no_backlog, c, qid), timeout_s=60)
            assert la_stats(c, qid)["pending_live_instances"] > 0
            assert c.post("/event-types/nope/end").status_code == 404
            r = c.post("/event-types/pass/end")
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["already_ended"] is False and body["queries"] == ["speeding"], body
            assert body["end_ts"] is not None and body["live_archived_pending"]["speeding"] > 0
            assert wait_until(lambda: delivered(receiver)[0] == want, timeout_s=120), (
                f"{len(delivered(receiver)[0])} of {len(want)} results; stats {la_stats(c, qid)}"
            )
            assert wait_until(partial(stat, c, qid, "caught_up"), timeout_s=30)
            assert la_stats(c, qid)["pending_live_instances"] == 0
            # after the end, the type takes no event: late, with the reason
            r = c.post("/events", json=[{"type": "pass", "ts": newest_ms + 60_000, "attrs": {"car": 1, "at": "B"}}])
            assert r.status_code == 422, r.text
            rej = r.json()["rejections"][0]
            assert rej["field"] == "events[0].type" and "ended" in rej["reason"], rej
            t = c.get("/event-types/pass").json()
            assert t["ended_at"] is not None and t["end_ts"] == body["end_ts"]
            again = c.post("/event-types/pass/end").json()
            assert again["already_ended"] is True and again["end_ts"] == body["end_ts"]
        assert svc.stop() in (0, None, -15)  # SIGTERM
        svc.start()
        with svc.client() as c:
            assert c.get("/event-types/pass").json()["ended_at"] == t["ended_at"]
            r = c.post("/events", json=[{"type": "pass", "ts": newest_ms + 120_000, "attrs": {"car": 2, "at": "B"}}])
            assert r.status_code == 422 and "ended" in r.json()["rejections"][0]["reason"], r.text
            wait_idle(c, [qid], receiver)
            time.sleep(2)  # time for a result delivered again to arrive (counted below)
            # the restart's worker replays from the acknowledged position: under load it may still be starting or
            # replaying 2 s after wait_idle saw the service's view of it empty (CI, load 6-11: False once in a run)
            assert wait_until(partial(stat, c, qid, "caught_up"), timeout_s=60), la_stats(c, qid)
        have, keys = delivered(receiver)
        assert have == want, f"{len(want - have)} lost, {len(have - want)} unexpected"
        assert len(keys) == len(set(keys)) == len(want), "an alert was delivered twice"


@pytest.mark.parametrize("how", ["pause", "update"])
def test_a_pause_or_an_update_records_the_results_already_due_first(
    how: str, database_kind: str, tmp_path: Path, receiver: Receiver
) -> None:
    """Every live instance here is complete (one live event), waiting in SLLAA's open subwindow (T_L = 1 day, no
    idleness): a pause, or a new version, answers them before it stops the running query (they were dropped with
    its partial matches, and the results depended on T_L: another algorithm, or a shorter T_L, delivered them).
    After the resume (or as the new version) it sees only later events, and nothing is delivered twice."""
    archived, live = passes()
    want = expected(TEXT, "sllaa", archived, live)
    assert want
    for svc in run_service(database_kind, tmp_path, idle_timeout_s=3_600):
        with svc.client() as c:
            qid = start(c, receiver, archived, live)
            assert wait_until(partial(no_backlog, c, qid), timeout_s=60)
            assert la_stats(c, qid)["pending_live_instances"] > 0
            assert not receiver.ok()
            if how == "pause":
                r = c.post(f"/queries/{qid}/pause")
                assert r.status_code == 200 and r.json()["state"] == "paused", r.text
            else:
                r = c.put(f"/queries/{qid}", json={"text": TEXT, "algorithm": "sllaa", "tolerance": "1 day"})
                assert r.status_code == 200 and r.json()["version"] == 2, r.text
            assert wait_until(lambda: delivered(receiver)[0] == want, timeout_s=60), (
                f"{len(delivered(receiver)[0])} of {len(want)} results after the {how}"
            )
            if how == "pause":
                assert int(c.get(f"/queries/{qid}").json()["totals"]["matches"]) == len(want)
                r = c.post(f"/queries/{qid}/resume")
                assert r.status_code == 200 and r.json()["state"] == "active", r.text
            later = (max(e.ts for e in live) // 1000) + 60_000  # a B pass of a car that passed A before
            r = c.post("/events", json=[{"type": "pass", "ts": later, "attrs": {"car": 59, "at": "B"}}])
            assert r.status_code == 200, r.text
            assert c.post("/event-types/pass/end").status_code == 200
            wait_idle(c, [qid], receiver)
            have, keys = delivered(receiver)
            assert len(have) == len(want) + 1 and want < have, f"{len(have)} results, {len(want)} before the {how}"
            assert len(keys) == len(set(keys)), "an alert was delivered twice"
