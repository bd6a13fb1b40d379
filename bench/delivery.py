"""Webhook delivery throughput: N alerts committed as fast as ingest makes them (``PATTERN s x``: one alert per
event, posted in requests of 1,000), and the time until a local receiver has every one of them.

    python -m bench.delivery [N]                 # default 10,000
    python -m bench.delivery --trickle 600 [N]   # N alerts (default 12,000), 600 a second in requests of 10
    python -m bench.delivery --claims            # claim_due alone: CPU per delivery leased 1, 10, 200 at a time

Prints the ingest time, the time until the last delivery, deliveries per second over the whole run and the
``lace serve`` process's CPU seconds (user + system) from the first POST until the last delivery. The
service runs on SQLite with the test harness's settings (``cli.service_process.HARNESS_SETTINGS``); the receiver
(uvicorn on a thread) shares this process. ``--trickle`` paces the requests as a live stream does (the alerts of
``bench.service --live-archived`` come a few at a time: each commit wakes the dispatcher); ``--claims`` fills a
database with 5,000 pending deliveries (the webhook paused while they are recorded) and times
:func:`service.webhooks.store.claim_due` at three claim sizes in this process.
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
    args = sys.argv[1:]
    if args[:1] == ["--claims"]:
        claims()
        return
    rate = 0.0
    if args[:1] == ["--trickle"]:
        rate, args = float(args[1]), args[2:]
    n = int(args[0]) if args else (12_000 if rate else 10_000)
    rx = Receiver()
    rx.start()
    tmp = Path(tempfile.mkdtemp(prefix="lace-delivery-"))
    svc = ServiceProcess(tmp / "data", dict(HARNESS_SETTINGS))
    svc.start()
    try:
        run(svc, rx, n, rate)
    finally:
        svc.stop()
        rx.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def run(svc: ServiceProcess, rx: Receiver, n: int, rate: float = 0.0) -> None:
    """Post ``n`` events (a multiple of 1,000) that each make one alert, in requests of 1,000 as fast as they are
    answered, or ``rate`` a second in requests of 10; wait (at most 10 min) until ``rx`` has them all; print the
    times."""
    size = 10 if rate else 1_000
    with svc.client() as c:
        assert c.post("/event-types", json={"name": "s", "attributes": {"v": "int"}}).status_code == 201
        q = c.post("/queries", json={"text": "NAME every PATTERN s x RETURN x.v AS v"}).json()
        assert c.post("/webhooks", json={"query_id": q["id"], "url": rx.hook_url("every")}).status_code == 201
        t0 = CLOCK.take()
        assert svc.proc is not None
        cpu0 = process_cpu(svc.proc.pid)["service"]
        start = time.perf_counter()
        for b in range(0, n, size):
            if rate:
                time.sleep(max(0.0, start + b / rate - time.perf_counter()))
            r = c.post("/events", json=[{"type": "s", "ts": t0 + i, "attrs": {"v": i}} for i in range(b, b + size)])
            assert r.json()["accepted"] == size, r.text
        posted = time.perf_counter()
        while len(rx.ok()) < n and time.perf_counter() - start < 600:
            time.sleep(0.2)
        done = time.perf_counter()
        cpu = process_cpu(svc.proc.pid)["service"] - cpu0
    got = len(rx.ok())
    print(f"{n} alerts: posted in {posted - start:.1f} s, {got} delivered after {done - start:.1f} s: "
          f"{got / (done - start):.0f} deliveries/s; lace serve CPU {cpu:.1f} s ({cpu / max(got, 1) * 1e3:.2f} ms "
          f"per delivery, ingest included)")


def claims(n: int = 5_000) -> None:
    """Fill a SQLite database with ``n`` pending deliveries through a service (its webhook paused), then time
    :func:`~service.webhooks.store.claim_due` leasing them 1, 10 and 200 at a time (CPU ms per delivery, best of 2)."""
    from sqlalchemy import update

    from service.db.models import WebhookRow
    from service.db.session import make_engine, make_session_factory, now_us
    from service.webhooks.store import claim_due, release_leases

    tmp = Path(tempfile.mkdtemp(prefix="lace-claims-"))
    svc = ServiceProcess(tmp / "data", dict(HARNESS_SETTINGS))
    svc.start()
    try:
        with svc.client() as c:
            assert c.post("/event-types", json={"name": "s", "attributes": {"v": "int"}}).status_code == 201
            q = c.post("/queries", json={"text": "NAME every PATTERN s x RETURN x.v AS v"}).json()
            wh = c.post("/webhooks", json={"query_id": q["id"], "url": "http://127.0.0.1:9/closed"}).json()
            assert c.post(f"/webhooks/{wh['id']}/pause").status_code == 200
            t0 = CLOCK.take()
            for b in range(0, n, 1_000):
                events = [{"type": "s", "ts": t0 + i, "attrs": {"v": i}} for i in range(b, min(n, b + 1_000))]
                assert c.post("/events", json=events).json()["accepted"] == len(events)
        svc.stop()
        sessions = make_session_factory(make_engine(svc.db.url))
        with sessions.begin() as s:
            s.execute(update(WebhookRow).values(active=True))
        for size in (1, 10, 200):
            best = float("inf")
            for _ in range(2):
                release_leases(sessions, now_us=now_us())
                got, cpu = 0, time.process_time()
                while jobs := claim_due(sessions, now_us=now_us(), limit=size, lease_us=600_000_000):
                    got += len(jobs)
                best = min(best, (time.process_time() - cpu) / got * 1e3)
            print(f"claims of {size}: {best:.3f} ms CPU per delivery ({got} deliveries)")
    finally:
        svc.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
