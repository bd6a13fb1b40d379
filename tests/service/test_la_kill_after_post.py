"""Issue 43's reproduction: a SIGKILL right after the POST that closes an SLLAA subwindow lost the pending
live-and-archived result, silently (the restart replay started past the live instance waiting for the archive).

One service on the embedded database, one event type ``s(key string, v int)`` with lateness 0, one query per
algorithm over it (the same text), so the four share the scenario: an archived ``b`` (id 1, v 1, T0), a live ``a``
(id 2, v 99, T0 + 1 day; SLLAA waits for its subwindow, ``T_L`` 1 day), an event 40 days later (id 3, another key)
that closes the subwindow, and the service's process group killed as soon as that POST is answered. After the
restart each query has its one alert exactly once.
"""
from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from cli.service_process import ServiceProcess, wait_until
from tests.service.test_live_archived import count_alerts

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.integration]

DAY_MS = 86_400_000
ALGORITHMS = ("sllaa", "ollaa", "llaa", "alaa")
TEXT = """NAME {name}
LIVE PATTERN s a WHERE a.v > 50
ARCHIVED PATTERN s b WHERE b.v < 10
LOOKBACK 10 days
JOIN a.key = b.key"""


def register_each_algorithm(c: httpx.Client) -> dict[str, int]:
    """Register :data:`TEXT` once per algorithm (SLLAA with a tolerance of 1 day): algorithm -> query id."""
    ids: dict[str, int] = {}
    for alg in ALGORITHMS:
        body = {"text": TEXT.format(name=f"la_{alg}"), "algorithm": alg}
        if alg == "sllaa":
            body["tolerance"] = "1 days"
        r = c.post("/queries", json=body)
        assert r.status_code == 201, r.text
        ids[alg] = r.json()["id"]
    return ids


def settled(c: httpx.Client, ids: list[int]) -> bool:
    """Every query matched what it got and answered every archive request."""
    for qid in ids:
        la = c.get(f"/queries/{qid}").json()["stats"]["live_archived"]
        if la is None or la["backlog_events"] or la["requests_in_flight"] or la["pending_live_instances"]:
            return False
    return True


@pytest.mark.parametrize("la_process", [True, False], ids=["query-process", "in-thread"])
def test_sigkill_right_after_the_post_that_closes_a_subwindow_loses_no_result(tmp_path: Path, la_process: bool) -> None:
    """The queries run in query processes (the default) or on threads of the service (``LACE_LA_PROCESS=false``)."""
    settings = {"max_future_skew_s": 365 * 86_400, "log_level": "info", "la_process": str(la_process).lower()}
    svc = ServiceProcess(tmp_path / "data", settings, own_group=True)
    t0 = int(time.time() * 1000) - 60 * DAY_MS
    try:
        svc.start()
        with svc.client() as c:
            r = c.post("/event-types", json={"name": "s", "attributes": {"key": "string", "v": "int"},
                                             "allowed_lateness_ms": 0})
            assert r.status_code == 201, r.text
            r = c.post("/events", json=[{"id": 1, "type": "s", "ts": t0, "attrs": {"key": "k", "v": 1}}])
            assert r.json()["accepted"] == 1, r.text
            ids = register_each_algorithm(c)
            r = c.post("/events", json=[{"id": 2, "type": "s", "ts": t0 + DAY_MS, "attrs": {"key": "k", "v": 99}}])
            assert r.json()["accepted"] == 1, r.text
            r = c.post("/events", json=[{"id": 3, "type": "s", "ts": t0 + 40 * DAY_MS,
                                         "attrs": {"key": "z", "v": 50}}])
            assert r.json()["accepted"] == 1, r.text
        svc.kill()  # as soon as the POST that closes the subwindow is answered
        svc.start()
        with svc.client() as c:
            assert wait_until(lambda: settled(c, list(ids.values())), timeout_s=120), "the queries did not settle"
            wait_until(lambda: all(count_alerts(c, q) for q in ids.values()), timeout_s=20)
            time.sleep(1.0)  # a duplicate would come now
            got = {alg: count_alerts(c, q) for alg, q in ids.items()}
            stats = {alg: c.get(f"/queries/{q}").json()["stats"]["live_archived"] for alg, q in ids.items()}
    finally:
        svc.stop()
    assert got == dict.fromkeys(ALGORITHMS, 1), f"alerts per algorithm (want 1 each): {got}\n{stats}\n{svc.log_tail()}"
