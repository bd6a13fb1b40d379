"""Webhook delivery throughput: N alerts committed as fast as ingest makes them (``PATTERN s x``: one alert per
event, posted in requests of 1,000), and the time until a local receiver has every one of them.

    python -m bench.delivery [N]        # default 10,000

Prints the ingest time, the time until the last delivery, deliveries per second over the whole run and the
``lace serve`` process's CPU seconds (user + system) from the first POST until the last delivery. The
service runs on SQLite with the test harness's settings (``cli.service_process.HARNESS_SETTINGS``); the receiver
(uvicorn on a thread) shares this process.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.service import process_cpu
from cli.service_process import CLOCK, HARNESS_SETTINGS, ServiceProcess
from cli.webhook_receiver import Receiver


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    rx = Receiver()
    rx.start()
    tmp = Path(tempfile.mkdtemp(prefix="lace-delivery-"))
    svc = ServiceProcess(tmp / "data", dict(HARNESS_SETTINGS))
    svc.start()
    try:
        run(svc, rx, n)
    finally:
        svc.stop()
        rx.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def run(svc: ServiceProcess, rx: Receiver, n: int) -> None:
    """Post ``n`` events (a multiple of 1,000) that each make one alert; wait (at most 10 min) until ``rx`` has them
    all; print the times."""
    with svc.client() as c:
        assert c.post("/event-types", json={"name": "s", "attributes": {"v": "int"}}).status_code == 201
        q = c.post("/queries", json={"text": "NAME every PATTERN s x RETURN x.v AS v"}).json()
        assert c.post("/webhooks", json={"query_id": q["id"], "url": rx.hook_url("every")}).status_code == 201
        t0 = CLOCK.take()
        assert svc.proc is not None
        cpu0 = process_cpu(svc.proc.pid)["service"]
        start = time.perf_counter()
        for b in range(0, n, 1_000):
            r = c.post("/events", json=[{"type": "s", "ts": t0 + i, "attrs": {"v": i}} for i in range(b, b + 1_000)])
            assert r.json()["accepted"] == 1_000, r.text
        posted = time.perf_counter()
        while len(rx.ok()) < n and time.perf_counter() - start < 600:
            time.sleep(0.2)
        done = time.perf_counter()
        cpu = process_cpu(svc.proc.pid)["service"] - cpu0
    got = len(rx.ok())
    print(f"{n} alerts: posted in {posted - start:.1f} s, {got} delivered after {done - start:.1f} s: "
          f"{got / (done - start):.0f} deliveries/s; lace serve CPU {cpu:.1f} s ({cpu / max(got, 1) * 1e3:.2f} ms "
          f"per delivery, ingest included)")


if __name__ == "__main__":
    main()
