"""The live-and-archived worker pool in a real service (issue 43): queries spread over the workers by the documented
rule, a worker killed alone (SIGKILL of its process) and a query that raises in its worker each get the worker
restarted, its queries replayed from their acknowledged positions, and every result delivered exactly once.

One service on the embedded database with ``LACE_WORKERS=2``: four queries (one per algorithm, the text of issue
43's reproduction) go to workers 0, 1, 0, 1; ``la_llaa`` raises on its second batch (``LACE_WORKER_FAULT``,
worker 0); worker 1 is SIGKILLed right after the first live event's POST is answered. Three keys each have one
archived ``b`` and one live ``a``: three results per query.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from cli.service_process import ServiceProcess, wait_until
from tests.service.test_la_kill_after_post import ALGORITHMS, DAY_MS, register_each_algorithm, settled
from tests.service.test_live_archived import count_alerts

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.integration]


def _worker(c: httpx.Client, qid: int) -> dict:
    return c.get(f"/queries/{qid}").json()["stats"]["live_archived"]["worker"]


def _post(c: httpx.Client, events: list[dict]) -> None:
    r = c.post("/events", json=events)
    assert r.status_code == 200 and r.json()["accepted"] == len(events), r.text


def test_a_killed_worker_and_a_raising_query_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    settings = {"max_future_skew_s": 365 * 86_400, "log_level": "info", "workers": "2",
                "worker_fault": "raise:la_llaa:2"}
    svc = ServiceProcess(tmp_path / "data", settings, own_group=True)
    t0 = int(time.time() * 1000) - 60 * DAY_MS
    keys = ("k1", "k2", "k3")
    try:
        svc.start()
        with svc.client() as c:
            r = c.post("/event-types", json={"name": "s", "attributes": {"key": "string", "v": "int"},
                                             "allowed_lateness_ms": 0})
            assert r.status_code == 201, r.text
            _post(c, [{"id": n + 1, "type": "s", "ts": t0 + n, "attrs": {"key": k, "v": 1}}
                      for n, k in enumerate(keys)])
            ids = register_each_algorithm(c)
            places = {alg: _worker(c, q) for alg, q in ids.items()}
            assert [places[a]["index"] for a in ALGORITHMS] == [0, 1, 0, 1], places  # fewest queries, lowest index
            assert wait_until(lambda: all(_worker(c, q)["alive"] for q in ids.values()), timeout_s=60)
            killed = _worker(c, ids["ollaa"])["pid"]
            _post(c, [{"id": 10, "type": "s", "ts": t0 + DAY_MS, "attrs": {"key": "k1", "v": 99}}])
            os.kill(killed, signal.SIGKILL)  # worker 1 alone, as soon as the POST is answered
            _post(c, [{"id": 11, "type": "s", "ts": t0 + 2 * DAY_MS, "attrs": {"key": "k2", "v": 99}}])  # llaa raises
            # ingest answered while worker 1 restarts and worker 0 fails
            _post(c, [{"id": 12, "type": "s", "ts": t0 + 3 * DAY_MS, "attrs": {"key": "k3", "v": 99}}])
            _post(c, [{"id": 13, "type": "s", "ts": t0 + 40 * DAY_MS, "attrs": {"key": "z", "v": 50}}])
            assert wait_until(lambda: all(_worker(c, q)["restarts"] >= 1 for q in ids.values()), timeout_s=60), {
                a: _worker(c, q) for a, q in ids.items()}
            assert wait_until(lambda: settled(c, list(ids.values())), timeout_s=120), "the queries did not settle"
            wait_until(lambda: all(count_alerts(c, q) >= len(keys) for q in ids.values()), timeout_s=30)
            time.sleep(1.0)  # a duplicate would come now
            got = {alg: count_alerts(c, q) for alg, q in ids.items()}
            after = {alg: _worker(c, q) for alg, q in ids.items()}
            metrics = c.get("/metrics").text
    finally:
        svc.stop()
    assert got == dict.fromkeys(ALGORITHMS, len(keys)), f"alerts per algorithm: {got}\n{svc.log_tail()}"
    assert after["ollaa"]["pid"] != killed and after["ollaa"]["alive"]
    restarts = [float(ln.split()[-1]) for ln in metrics.splitlines() if ln.startswith("lace_worker_restarts_total")]
    assert restarts and restarts[0] >= 2, metrics
    log = svc.log_tail(10_000_000)
    assert "query la_llaa raised in worker 0" in log and "injected fault (LACE_WORKER_FAULT) on batch 2" in log
