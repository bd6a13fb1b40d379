"""Webhook faults against a real ``lace serve`` (SQLite) and a real receiver: the "Reliability"
rows of docs/benchmarks.md.

``--repo DIR`` runs the service of another checkout (e.g. ``/work/main`` for the code before the
webhook hardening) with the same settings, for a before/after comparison. The retry schedule is
shortened (4 attempts, back-off 0.05 s .. 0.2 s: under 0.5 s of retries) so that a receiver
outage of seconds is "longer than the schedule", as 2 minutes were for the old defaults; the
circuit breaker opens after 3 endpoint failures and probes every 0.3 s .. 1 s.

Faults:

* ``outage``: the receiver's port refuses connections for ``--outage-s`` while the alerts are
  recorded, then it comes back.
* ``503``: the receiver answers 503 for ``--outage-s``, then 200.
* ``sigkill``: the receiver SIGKILLs the service right after answering its ``n/3``-th 2xx; the
  service is restarted.
* ``delete-recreate``: a query with a webhook alerts, is deleted, another is created and alerts
  (idempotency keys must differ).

For every delivered 2xx the receiver notes the time; a reader polls the SQLite file for the
moment each delivery's ``delivered`` mark is committed: the difference is the window in which a
crash resends a delivery (``mark window``).

    python -m bench.webhook_faults                   # this checkout
    python -m bench.webhook_faults --repo /work/main # before
"""
from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from cli.service_process import CLOCK, Database, make_service, unique
from cli.webhook_receiver import Receiver

SETTINGS = {
    "webhook_max_attempts": 4,
    "webhook_backoff_base_s": 0.05,
    "webhook_backoff_max_s": 0.2,
    "webhook_breaker_failures": 3,
    "webhook_breaker_probe_s": 0.3,
    "webhook_breaker_probe_max_s": 1.0,
}


def _setup(c: Any, url: str) -> tuple[str, int, int]:
    t = unique("Stock")
    c.post("/event-types", json={"name": t, "attributes": {"symbol": "string", "price": "float"}}).raise_for_status()
    text = (
        f"NAME {unique('drop')}\nPATTERN SEQ({t} a, {t} b)\nWHERE b.price < a.price * 0.9\n"
        "PARTITION BY symbol\nSTRATEGY skip_till_next_match\nWITHIN 1 min"
    )
    qid = c.post("/queries", json={"text": text}).json()["id"]
    r = c.post("/webhooks", json={"query_id": qid, "url": url})
    r.raise_for_status()
    return t, qid, r.json()["id"]


def _drops(c: Any, t: str, n: int, tag: str = "S") -> None:
    t0 = CLOCK.take()
    events = []
    for i in range(n):
        events += [
            {"type": t, "ts": t0 + 10 * i, "attrs": {"symbol": f"{tag}{i}", "price": 100.0}},
            {"type": t, "ts": t0 + 10 * i + 1, "attrs": {"symbol": f"{tag}{i}", "price": 10.0}},
        ]
    r = c.post("/events", json=events)
    assert r.json()["alerts"] == n, r.text


class MarkWatcher(threading.Thread):
    """Polls the SQLite file: when was each delivery first seen ``delivered`` (time.time())."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.seen, self.stop = path, dict[str, float](), False

    def run(self) -> None:
        while not self.stop:
            try:
                con = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=1)
                while not self.stop:
                    rows = con.execute("SELECT idempotency_key FROM deliveries WHERE status = 'delivered'").fetchall()
                    now = time.time()
                    for (k,) in rows:
                        self.seen.setdefault(k, now)
                    time.sleep(0.0005)
            except sqlite3.Error:
                time.sleep(0.01)


def run(fault: str, repo: Path, n: int, outage_s: float, tmp: Path) -> dict[str, Any]:
    db = Database("sqlite", f"sqlite:///{tmp / 'lace.db'}")
    svc = make_service(db, tmp / "data", repo=repo, **SETTINGS)
    rx = Receiver()
    watcher = MarkWatcher(tmp / "lace.db")
    extra: dict[str, Any] = {}
    try:
        svc.start()
        watcher.start()
        with svc.client() as c:
            if fault == "delete-recreate":
                rx.start()
                keys = []
                for round_ in range(2):
                    t, qid, _ = _setup(c, rx.url)
                    _drops(c, t, n)
                    deadline = time.monotonic() + 30
                    while len(rx.ok()) < n * (round_ + 1) and time.monotonic() < deadline:
                        time.sleep(0.02)
                    keys.append({r["headers"]["idempotency-key"] for r in rx.ok()[round_ * n :]})
                    c.delete(f"/queries/{qid}").raise_for_status()
                extra["keys reused"] = len(keys[0] & keys[1])
                expected = 2 * n
            else:
                t, qid, wid = _setup(c, rx.url)
                if fault == "503":
                    rx.status = 503
                    rx.start()
                if fault == "sigkill":
                    rx.delay_s = 0.01

                    def kill(_: dict[str, Any]) -> None:
                        if len(rx.ok()) == n // 3 and svc.proc is not None:
                            svc.proc.kill()

                    rx.after_response = kill
                    rx.start()
                _drops(c, t, n)
                expected = n
                if fault in ("outage", "503"):
                    time.sleep(outage_s)
                    if fault == "outage":
                        rx.start()
                    rx.status = 200
                if fault == "sigkill":
                    assert svc.proc is not None
                    svc.proc.wait(timeout=60)
                    rx.after_response = None
                    svc.start()
        with svc.client() as c:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                items = c.get("/deliveries", params={"limit": 1000}).json()["items"]
                if items and all(d["status"] != "pending" for d in items) and len(items) >= expected / (
                    2 if fault == "delete-recreate" else 1
                ):
                    break
                time.sleep(0.1)
            time.sleep(0.5)
            items = c.get("/deliveries", params={"limit": 1000}).json()["items"]
            metrics = {
                line.split(" ")[0]: float(line.split(" ")[1])
                for line in c.get("/metrics").text.splitlines()
                if line.startswith("lace_delivery_mark_seconds_")
            }
            if metrics.get("lace_delivery_mark_seconds_count"):
                mean = metrics["lace_delivery_mark_seconds_sum"] / metrics["lace_delivery_mark_seconds_count"]
                extra["mark mean ms (service)"] = round(mean * 1e3, 1)
        dead = sum(d["status"] == "dead" for d in items)
    finally:
        watcher.stop = True
        svc.stop()
        rx.stop()
    ok = rx.ok()
    per_key = Counter(r["headers"]["idempotency-key"] for r in ok)
    alerts = {json.loads(r["body"])["id"] for r in ok} if fault != "delete-recreate" else set(per_key)
    first_2xx: dict[str, float] = {}
    for r in ok:
        first_2xx.setdefault(r["headers"]["idempotency-key"], r["at"])
    windows = [(watcher.seen[k] - first_2xx[k]) * 1e3 for k in first_2xx if k in watcher.seen]
    windows = [w for w in windows if w < 10_000]  # a delivery marked after a restart is not a window
    return {
        "fault": fault,
        "alerts expected": expected,
        "alerts delivered": len(alerts),
        "duplicates": sum(v - 1 for v in per_key.values()),
        "dead letters": dead,
        "requests": len(rx.received),
        "mark window p50 ms": round(statistics.median(windows), 1) if windows else None,
        "mark window max ms": round(max(windows), 1) if windows else None,
        **extra,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--faults", default="outage,503,sigkill,delete-recreate")
    ap.add_argument("--n", type=int, default=110)
    ap.add_argument("--outage-s", type=float, default=5.0)
    args = ap.parse_args()
    rows = []
    for fault in args.faults.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(run(fault, args.repo.resolve(), args.n, args.outage_s, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    cols = list(dict.fromkeys(k for r in rows for k in r))
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join("" if r.get(k) is None else str(r.get(k)) for k in cols) + " |")


if __name__ == "__main__":
    main()
