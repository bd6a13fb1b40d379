"""Service benchmark: ingest throughput and ingest-to-webhook latency of ``lace serve``.

Starts ``lace serve`` in a subprocess (embedded defaults: SQLite, local Delta archive with
its WAL fsync'd per request), registers one event type, one live query and one webhook
pointing at a receiver in this process (uvicorn in a thread), then, from this process:

1. **throughput**: ``--events`` events as NDJSON batches of ``--batch``, back to back over
   one keep-alive connection; sustained events/s = events / wall time.
2. **latency**: ``--rate`` events/s for ``--seconds`` (one batch every batch/rate seconds);
   for every alert, delivery time at the receiver minus the time the batch holding its
   last event was posted. p50/p99/max in milliseconds.

The query (``partition_contiguity``: one partial match per symbol) finds a spike: a price
more than 5x the previous one of the same symbol; one event in ~1,000 is a spike.

    python -m bench.service                      # 200k events, then 5k ev/s for 30 s
    python -m bench.service --events 50000 --seconds 10 --json out.json

With ``--live-archived``, the stream is the Aarhus traffic table (``shared/data/aarhus``, in ts order,
``hour`` added) and the query is the demo's live-and-archived ``congested_same_hour`` (SLLAA, T_L = 10 min):
``--archive-days`` days are posted with no query registered (sustained ingest without a query), then the
query is registered and ``--rate`` events/s are posted for ``--seconds`` (the paced part: its delays are the
service's own, not a backlog left by a burst before it), then ``--events`` more back to back (sustained ingest with
the query); with ``--queries 10``, ten queries (4 SLLAA, 2 OLLAA, 2 LLAA, 2 ALAA:
:func:`la_queries`) instead of one (issue 25's (b)); at the end the queries' counters (archive requests, live instances,
subwindows) and the latency from the POST that closed a subwindow to the webhook delivery of its results:
p99 of (POST -> results committed, measured in the service per request) plus p99 of (committed ->
delivered, measured per alert at the receiver), an upper bound of the p99 of their sum.

    python -m bench.service --live-archived --archive-days 7 --events 200000 --rate 5000 --seconds 60
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson

from cli.service_process import ServiceProcess
from cli.webhook_receiver import Receiver

QUERY = """NAME spike
PATTERN SEQ(Tick a, Tick b)
WHERE b.price > a.price * 5
PARTITION BY sym
STRATEGY partition_contiguity
RETURN a.sym AS sym, a.price AS before, b.price AS after"""
SYMBOLS = 100
REPO = Path(__file__).resolve().parents[1]


class Stream:
    """Deterministic events with producer ids (so alerts map back to their batch)."""

    def __init__(self, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        self.next_id = 1
        self.ts_ms = int(time.time() * 1000)

    def batch(self, n: int) -> tuple[bytes, int, int]:
        """NDJSON bytes of ``n`` events and their first and last ids."""
        lines = []
        first = self.next_id
        for _ in range(n):
            price = 1000.0 if self.rng.random() < 0.001 else round(self.rng.uniform(50, 150), 2)
            sym = f"S{self.rng.randrange(SYMBOLS)}"
            lines.append(
                orjson.dumps({"id": self.next_id, "type": "Tick", "ts": self.ts_ms, "sym": sym, "price": price})
            )
            self.next_id += 1
            self.ts_ms += 1
        return b"\n".join(lines), first, self.next_id - 1


def start_service(tmp: Path, service_env: list[str]) -> ServiceProcess:
    """A started ``lace serve`` on ``tmp`` (embedded SQLite and archive), webhooks polled every 0.5 s;
    ``service_env``: more settings as ``LACE_X=V``."""
    settings: dict[str, Any] = {"webhook_poll_s": 0.5}
    for kv in service_env:
        name, value = kv.split("=", 1)
        settings[name.removeprefix("LACE_").lower()] = value
    svc = ServiceProcess(tmp, settings)
    svc.start(timeout_s=60)
    return svc


def throughput(c: httpx.Client, stream: Stream, events: int, batch: int) -> dict[str, Any]:
    bodies = [stream.batch(batch)[0] for _ in range(events // batch)]  # built before timing
    start = time.perf_counter()
    for body in bodies:
        r = c.post("/events", content=body, headers={"content-type": "application/x-ndjson"})
        assert r.status_code == 200 and r.json()["accepted"] == batch, r.text[:300]
    wall = time.perf_counter() - start
    return {"events": len(bodies) * batch, "wall_s": round(wall, 3), "events_per_s": round(len(bodies) * batch / wall)}


def latency(c: httpx.Client, rx: Receiver, stream: Stream, rate: int, seconds: float, batch: int) -> dict[str, Any]:
    n_batches = int(rate * seconds / batch)
    period = batch / rate
    sent: list[tuple[int, int, float]] = []  # (first id, last id, wall time posted)
    bodies = [stream.batch(batch) for _ in range(n_batches)]
    lag = []
    start = time.perf_counter()
    for i, (body, first, last) in enumerate(bodies):
        due = start + i * period
        now = time.perf_counter()
        if due > now:
            time.sleep(due - now)
        lag.append(time.perf_counter() - due)
        posted = time.time()
        r = c.post("/events", content=body, headers={"content-type": "application/x-ndjson"})
        assert r.status_code == 200, r.text[:300]
        sent.append((first, last, posted))
    deadline = time.time() + 30
    expected = None
    while time.time() < deadline:
        q = c.get("/queries").json()[0]
        expected = q["stats"]["matches"] if q["stats"] else None
        if expected is not None and len(rx.ok()) >= expected:
            break
        time.sleep(0.2)
    lat_ms = []
    for rec in rx.ok():
        end_id = json.loads(rec["body"])["events"]["b"][0]
        for first, last, posted in sent:
            if first <= end_id <= last:
                lat_ms.append((rec["at"] - posted) * 1000)
                break
    lat_ms.sort()

    def pct(p: float) -> float:
        return round(lat_ms[min(len(lat_ms) - 1, int(p * len(lat_ms)))], 1) if lat_ms else float("nan")

    return {
        "rate_events_per_s": rate,
        "seconds": seconds,
        "alerts": len(lat_ms),
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": round(lat_ms[-1], 1) if lat_ms else None,
        "client_behind_schedule_max_ms": round(max(lag) * 1000, 1) if lag else 0,
    }


AARHUS = next(
    (p / "shared" / "data" / "aarhus" for p in REPO.parents if (p / "shared" / "data" / "aarhus").is_dir()),
    REPO.parent / "shared" / "data" / "aarhus",
)  # /work/shared from a checkout in /work/main or a worktree in /work/wt/NAME
LA_QUERY = REPO / "cli" / "demo_data" / "queries" / "congested_same_hour.lql"
DAY_MS = 86_400_000
LA_MIX = ["sllaa", "sllaa", "sllaa", "sllaa", "ollaa", "ollaa", "llaa", "llaa", "alaa", "alaa"]
"""Issue 25's (b): the algorithms of ten live-and-archived queries (the first one alone is (a))."""


def la_queries(n: int) -> list[tuple[str, str, str]]:
    """``n`` live-and-archived queries over the traffic stream as ``(name, text, algorithm)``: the demo's
    ``congested_same_hour`` first (SLLAA), then variations of it (congestion thresholds, look-backs, the hour
    condition) under :data:`LA_MIX`'s algorithms: overlapping key sets and access ranges, one event type."""
    base = LA_QUERY.read_text()
    variants = [("0.5", "7 days"), ("0.4", "7 days"), ("0.6", "3 days"), ("0.5", "2 days"), ("0.45", "5 days")]
    out = []
    for i in range(n):
        ratio, lookback = variants[i % len(variants)]
        text = base.replace("NAME congested_same_hour", f"NAME congested_{i}")
        text = text.replace("LOOKBACK 7 days", f"LOOKBACK {lookback}")
        for v in ("a", "b"):
            text = text.replace(f"{v}.avg_speed < 0.5", f"{v}.avg_speed < {ratio}")
        if i % 2:  # half of them: any hour (a wider archived match set)
            text = text.replace(" AND hour_of_day(a.ts) = hour_of_day(c.ts)", "")
        out.append((f"congested_{i}", text, LA_MIX[i % len(LA_MIX)]))
    return out


def aarhus_lines(days: float, extra_events: int) -> list[tuple[int, bytes]]:
    """The first ``days`` of Aarhus readings and ``extra_events`` more, as ``(ts_ms, NDJSON line)`` in ts order,
    ``hour`` (UTC) and ``ndt_kmh`` added (only those rows become Python objects)."""
    import csv

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    ndt = {}
    with open(AARHUS / "traffic_sensors.csv", newline="") as f:
        for row in csv.DictReader(f):
            ndt[row["REPORT_ID"]] = float(row["NDT_IN_KMH"])
    table = pq.read_table(
        AARHUS / "aarhus_traffic_2014-08_09.parquet", columns=["key", "ts_ms", "avg_speed", "vehicle_count"]
    )
    table = table.take(pc.sort_indices(table, sort_keys=[("ts_ms", "ascending")]))
    t0 = table.column("ts_ms")[0].as_py()
    n_days = pc.sum(pc.less(table.column("ts_ms"), t0 + int(days * DAY_MS))).as_py()
    t = table.slice(0, n_days + extra_events).to_pydict()
    out = []
    for i, (k, ms, speed, count) in enumerate(zip(t["key"], t["ts_ms"], t["avg_speed"], t["vehicle_count"])):
        attrs = {"key": k, "avg_speed": speed, "vehicle_count": count, "ndt_kmh": ndt.get(k, 0.0)}
        attrs["hour"] = ms // 3_600_000 % 24
        out.append((ms, orjson.dumps({"id": i + 1, "type": "traffic", "ts": ms, "attrs": attrs})))
    return out


def post_lines(c: httpx.Client, lines: list[tuple[int, bytes]], batch: int, rate: float | None = None) -> float:
    """POST ``lines`` as NDJSON batches (at ``rate`` events/s, or back to back); return the wall seconds."""
    start = time.perf_counter()
    for i in range(0, len(lines), batch):
        if rate:
            due = start + i / rate
            now = time.perf_counter()
            if due > now:
                time.sleep(due - now)
        body = b"\n".join(line for _, line in lines[i : i + batch])
        r = c.post("/events", content=body, headers={"content-type": "application/x-ndjson"})
        assert r.status_code == 200 and r.json()["rejected"] == 0, r.text[:300]
    return time.perf_counter() - start


def wait_la_idle(c: httpx.Client, qid: int, timeout_s: float = 600.0, *, settled: bool = False) -> dict[str, Any]:
    """The query's stats once it has no backlog and no archive request in flight; with ``settled``, also no live
    instance waiting in an open SLLAA subwindow (the type's idle timeout closes it once the stream is quiet; an ALAA
    query's live window waits for event time, so its pending instances are not waited for). Without
    it, ``results`` depends on how many instances the open subwindow held at that moment: two runs over the same data
    then report different counts (5,147 vs 5,153 for one SLLAA query; session 13's "open" difference)."""
    deadline = time.time() + timeout_s
    while True:
        stats = c.get(f"/queries/{qid}").json()["stats"]
        la = stats["live_archived"]
        open_subwindow = settled and la["algorithm"] == "sllaa" and la["pending_live_instances"]
        busy = la["backlog_events"] or la["requests_in_flight"] or open_subwindow
        if not busy or time.time() > deadline:
            return dict(stats)
        time.sleep(0.2)


def live_archived_run(args: argparse.Namespace) -> int:
    """The ``--live-archived`` benchmark (see the module docstring)."""
    print("reading the Aarhus table ...", flush=True)
    lines = aarhus_lines(args.archive_days, args.events + int(args.rate * args.seconds))
    t0 = lines[0][0]
    cut = next(i for i, (ms, _) in enumerate(lines) if ms >= t0 + args.archive_days * DAY_MS)
    archived, rest = lines[:cut], lines[cut:]
    n_paced = int(args.rate * args.seconds)
    paced, fast = rest[:n_paced], rest[n_paced : n_paced + args.events]
    rx = Receiver()
    rx.start()
    result: dict[str, Any] = {}
    with _data_dir(args.keep_dir) as d:
        # an idle timeout of 5 s (default 60): after the paced part the open SLLAA subwindows close 5 s after the
        # stream goes quiet, and the stats are read then (wait_la_idle(settled=True)); a paced stream is never idle
        svc = start_service(Path(d), ["LACE_IDLE_TIMEOUT_S=5", *args.service_env])
        try:
            with svc.client(timeout_s=120) as c:
                c.post(
                    "/event-types",
                    json={
                        "name": "traffic",
                        "attributes": {
                            "key": "string", "avg_speed": "float", "vehicle_count": "int", "ndt_kmh": "float",
                            "hour": "int",
                        },
                        "partition_key": "key",
                    },
                ).raise_for_status()
                wall = post_lines(c, archived, args.batch)
                result["ingest_no_query"] = {
                    "events": len(archived), "events_per_s": round(len(archived) / wall), "load": _load()
                }
                print(json.dumps(result), flush=True)
                ids, names = [], {}
                for name, text, algorithm in la_queries(args.queries):
                    q = c.post("/queries", json={"text": text, "algorithm": algorithm, "tolerance": "10 min"})
                    assert q.status_code == 201, q.text
                    ids.append(q.json()["id"])
                    names[ids[-1]] = name
                    c.post("/webhooks", json={"query_id": ids[-1], "url": rx.url}).raise_for_status()
                time.sleep(20)  # Spark starts in the background when the query is registered
                before = {q: wait_la_idle(c, q)["live_archived"] for q in ids}
                reads_before = _archive_reads(c)
                rx.received.clear()
                assert svc.proc is not None
                cpu_before = process_cpu(svc.proc.pid)
                wall = post_lines(c, paced, args.batch, rate=args.rate)
                cpu_paced = _cpu_since(cpu_before, svc.proc.pid)
                backlog_s = max(c.get(f"/queries/{q}").json()["stats"]["live_archived"]["backlog_s"] for q in ids)
                stats = {q: wait_la_idle(c, q, settled=True) for q in ids}
                time.sleep(3)  # the last deliveries
                # then every alert recorded so far delivered: the count is the paced part's results, not a snapshot of
                # the delivery queue (a run whose deliveries lag counted fewer: issue 43's "14,000 of 27,010")
                drained = _wait_delivered(c)
                reads_after = _archive_reads(c)
                arrivals = [
                    (rec["at"] - _iso_s(json.loads(rec["body"])["detected_at"])) * 1000 for rec in rx.ok()
                ]
                arrivals.sort()
                p99_dispatch = arrivals[min(len(arrivals) - 1, int(0.99 * len(arrivals)))] if arrivals else 0.0
                per_query = {}
                for q in ids:
                    la, b = stats[q]["live_archived"], before[q]
                    per_query[names[q]] = {
                        "algorithm": la["algorithm"],
                        "live_instances": la["live_instances"] - b["live_instances"],
                        "archive_requests": la["archive_requests"] - b["archive_requests"],
                        "close_to_commit_p50_ms": la["close_to_commit_p50_ms"],
                        "close_to_commit_p99_ms": la["close_to_commit_p99_ms"],
                        "errors": la["errors"],
                        # a query started failed (it raised MAX_QUERY_FAILURES times in its worker) delivers nothing
                        "failed": stats[q].get("failed"),
                        "worker_restarts": (la.get("worker") or {}).get("restarts", 0),
                    }
                worst = max(v["close_to_commit_p99_ms"] for v in per_query.values())
                result["paced"] = {
                    "events": len(paced),
                    "target_events_per_s": args.rate,
                    "achieved_events_per_s": round(len(paced) / wall),
                    "backlog_s_at_end": backlog_s,
                    "archive_reads": reads_after[0] - reads_before[0],
                    "archive_requests_read": reads_after[1] - reads_before[1],
                    "alerts_delivered": len(arrivals),
                    "alerts_recorded": drained[0],
                    "deliveries_drained": drained[1],
                    "close_to_commit_p99_ms_worst_query": worst,
                    "commit_to_webhook_p99_ms": round(p99_dispatch, 1),
                    "close_to_webhook_p99_bound_ms": round(worst + p99_dispatch, 1),
                    "cpu_s_while_posting": cpu_paced,
                    "cpu_s_to_caught_up": _cpu_since(cpu_before, svc.proc.pid),
                    "load": _load(),
                }
                result["per_query"] = per_query
                result["query_stats"] = stats
                print(json.dumps({k: v for k, v in result.items() if k != "query_stats"}), flush=True)
                cpu_before = process_cpu(svc.proc.pid)
                delivered_before = len(rx.received)
                wall = post_lines(c, fast, args.batch)
                result["ingest_with_queries"] = {
                    "queries": len(ids), "events": len(fast), "events_per_s": round(len(fast) / wall), "load": _load(),
                    "cpu_s_while_posting": _cpu_since(cpu_before, svc.proc.pid),
                    # the service delivers (and this process receives) the results of the events posted so far while
                    # it ingests: their number says how much of that work fell in the measured window
                    "alerts_delivered_while_posting": len(rx.received) - delivered_before,
                }
        finally:
            svc.stop(timeout_s=120)
            rx.stop()
    result.update(
        machine=f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        date=time.strftime("%Y-%m-%d"),
    )
    print(json.dumps({k: v for k, v in result.items() if k != "query_stats"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


def _metric(c: httpx.Client, name: str) -> float:
    for line in c.get("/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "_total "):
            return float(line.split()[1])
    return 0.0


def _wait_delivered(c: httpx.Client, timeout_s: float = 600.0) -> tuple[int, bool]:
    """Wait until the webhook deliveries acknowledged equal the alerts recorded (one webhook per query: one delivery
    per alert) and stay so for a second; (alerts recorded, whether they were all delivered within ``timeout_s``)."""
    deadline = time.time() + timeout_s
    same = 0
    while True:
        recorded, delivered = _metric(c, "lace_alerts"), _metric(c, "lace_alerts_delivered")
        same = same + 1 if delivered >= recorded else 0
        if same >= 5 or time.time() > deadline:
            return int(recorded), same >= 5
        time.sleep(0.2)


def _archive_reads(c: httpx.Client) -> tuple[float, float]:
    """(reads, requests they answered) of the service's shared archive scheduler, from ``/metrics``."""
    values = {
        line.split()[0]: float(line.split()[1])
        for line in c.get("/metrics").text.splitlines() if line.startswith("lace_archive_read")
    }
    return values.get("lace_archive_reads", 0.0), values.get("lace_archive_read_requests", 0.0)


def process_cpu(root: int) -> dict[str, float]:
    """CPU seconds (user + system, from ``/proc``) so far of the ``lace serve`` process ``root`` (``service``), its
    live-and-archived query processes (``query_processes``, summed) and its Spark JVM (``jvm``). Linux only."""
    tick = os.sysconf("SC_CLK_TCK")

    def cpu(pid: int) -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime

    def children(pid: int) -> list[int]:
        out: list[int] = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                out += [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue  # the thread ended meanwhile
        return out

    totals = {"service": cpu(root), "query_processes": 0.0, "jvm": 0.0}
    for kid in children(root):
        try:
            cmd = Path(f"/proc/{kid}/cmdline").read_bytes()
            if b"java" in cmd.split(b"\0")[0]:
                totals["jvm"] += cpu(kid)
            elif b"spawn_main" in cmd:
                totals["query_processes"] += cpu(kid)
        except OSError:
            continue  # gone meanwhile
    return totals


def _cpu_since(before: dict[str, float], root: int) -> dict[str, float]:
    after = process_cpu(root)
    return {k: round(after[k] - before[k], 1) for k in after}


@contextlib.contextmanager
def _data_dir(keep: Path | None) -> Iterator[str]:
    """The service's data directory: ``keep`` (created, left in place) or a temporary one (deleted)."""
    if keep is None:
        with tempfile.TemporaryDirectory(prefix="lace-bench-") as d:
            yield d
    else:
        keep.mkdir(parents=True, exist_ok=True)
        print(f"service data and log kept in {keep}", flush=True)
        yield str(keep)


def _load() -> str:
    """The 1, 5 and 15 minute load averages (what ``uptime`` prints), for the record beside each number."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _iso_s(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text).timestamp()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=200_000, help="events in the throughput run")
    ap.add_argument("--batch", type=int, default=1_000)
    ap.add_argument("--rate", type=int, default=5_000, help="events/s in the latency run")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of the latency run")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--service-env", action="append", default=[], metavar="LACE_X=V", help="extra service setting")
    ap.add_argument("--live-archived", action="store_true", help="Aarhus traffic through congested_same_hour")
    ap.add_argument("--archive-days", type=float, default=7.0, help="--live-archived: days archived first")
    ap.add_argument("--queries", type=int, default=1, help="--live-archived: queries (1: (a); 10: issue 25's (b))")
    ap.add_argument(
        "--keep-dir", type=Path, metavar="DIR",
        help="the service's data directory (its log serve.log, database, archive): kept after the run (default: a "
        "temporary directory, deleted)",
    )
    args = ap.parse_args(argv)
    if args.live_archived:
        return live_archived_run(args)
    rx = Receiver()
    rx.start()
    with _data_dir(args.keep_dir) as d:
        svc = start_service(Path(d), args.service_env)
        try:
            with svc.client(timeout_s=60) as c:
                c.post(
                    "/event-types",
                    json={"name": "Tick", "attributes": {"sym": "string", "price": "float"}, "partition_key": "sym"},
                ).raise_for_status()
                qid = c.post("/queries", json={"text": QUERY}).json()["id"]
                c.post("/webhooks", json={"query_id": qid, "url": rx.url}).raise_for_status()
                stream = Stream()
                c.post("/events", content=stream.batch(args.batch)[0], headers={"content-type": "application/x-ndjson"})
                tp = throughput(c, stream, args.events, args.batch)
                print(json.dumps({"throughput": tp}), flush=True)
                time.sleep(6)  # let the archive flush the throughput run and its deliveries drain
                rx.received.clear()
                lt = latency(c, rx, stream, args.rate, args.seconds, args.batch)
                print(json.dumps({"latency": lt}), flush=True)
                metrics = c.get("/metrics").text
        finally:
            svc.stop(timeout_s=60)
            rx.stop()
    result = {
        "throughput": tp,
        "latency": lt,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
        "archive": "on (WAL fsync per request, Delta flush every 50k events or 5 s)",
        "database": "SQLite (WAL, synchronous=FULL)",
        "delivered_total": next(
            (ln.split()[1] for ln in metrics.splitlines() if ln.startswith("lace_alerts_delivered_total")), "?"
        ),
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(f"| sustained ingest | {tp['events_per_s']:,} events/s ({tp['events']:,} events, batches of {args.batch}) |")
    print(
        f"| ingest -> webhook at {args.rate:,} ev/s | p50 {lt['p50_ms']} ms, p99 {lt['p99_ms']} ms, "
        f"max {lt['max_ms']} ms ({lt['alerts']} alerts) |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
