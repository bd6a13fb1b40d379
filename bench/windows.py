"""Window operator throughput: the issue-14 ``segment_load`` statement over the whole Aarhus traffic table.

    PYTHONPATH=. python bench/windows.py [--limit N] [--query TEXT]

Reads ``aarhus_traffic_2014-08_09.parquet`` (7,137,361 readings) column by column into an
:class:`engine.event_files.EventTable` (type = ``event_type``, ts = ``ts_ms`` in microseconds, attributes
``key``, ``avg_speed``, ``vehicle_count``), makes the events batch by batch and times only
:meth:`WindowedAggregate.push` / ``flush`` over them (the reading is timed apart). Prints one JSON line:
events, results, operator wall and CPU seconds (process time) and events/s, reading seconds, the load average.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from engine.event_files import EventTable  # noqa: E402
from engine.lql.parser import parse  # noqa: E402
from engine.rules import windows  # noqa: E402
from engine.rules.windows import WindowedAggregate  # noqa: E402

_SHARED = [Path(__file__).resolve().parents[2] / "shared", Path("/work/shared")]  # beside main; from a worktree
AARHUS = next((p for p in _SHARED if p.exists()), _SHARED[0]) / "data" / "aarhus" / "aarhus_traffic_2014-08_09.parquet"
SEGMENT_LOAD = (
    "NAME segment_load AGGREGATE traffic t WHERE t.vehicle_count > 0 GROUP BY key"
    " WINDOW SLIDING 30 min EVERY 5 min HAVING avg(t.avg_speed) < 25"
    " RETURN t.key AS segment, avg(t.avg_speed) AS speed, sum(t.vehicle_count) AS vehicles, count(t) AS n"
    " EMIT INTO segment_load"
)


def load(limit: int | None) -> EventTable:
    """The traffic table as typed columns (file order: sorted by ts_ms, key)."""
    table = pq.read_table(AARHUS, columns=["event_type", "key", "ts_ms", "avg_speed", "vehicle_count"])
    if limit is not None:
        table = table.slice(0, limit)
    col = lambda n: table.column(n).combine_chunks()  # noqa: E731
    ts = pc.multiply(col("ts_ms"), 1000)
    attrs = {"key": col("key").cast("string"), "avg_speed": col("avg_speed"), "vehicle_count": col("vehicle_count")}
    kinds = {"key": "string", "avg_speed": "int", "vehicle_count": "int"}
    return EventTable(None, col("event_type").cast("string"), ts, attrs, kinds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="only the first N readings")
    ap.add_argument("--query", default=SEGMENT_LOAD, help="the AGGREGATE statement")
    ap.add_argument("--two-stacks", choices=["auto", "always", "never"], default="auto",
                    help="how windows merge panes: Two-Stacks beyond TWO_STACKS_PANES panes (auto), always, never")
    args = ap.parse_args()
    if args.two_stacks != "auto":
        windows.TWO_STACKS_PANES = 0 if args.two_stacks == "always" else 1 << 30
    t0 = time.perf_counter()
    table = load(args.limit)
    read_s = time.perf_counter() - t0
    op = WindowedAggregate(parse(args.query))
    n = results = 0
    op_s = op_cpu = 0.0
    make_s = 0.0
    t1 = time.perf_counter()
    for batch in table.batches():
        t2, c2 = time.perf_counter(), time.process_time()
        make_s += t2 - t1
        push = op.push
        for e in batch:
            results += len(push(e))
        n += len(batch)
        t1 = time.perf_counter()
        op_s += t1 - t2
        op_cpu += time.process_time() - c2
    t2, c2 = time.perf_counter(), time.process_time()
    results += len(op.flush())
    op_s += time.perf_counter() - t2
    op_cpu += time.process_time() - c2
    print(json.dumps({
        "events": n,
        "results": results,
        "operator_s": round(op_s, 2),
        "events_per_s": round(n / op_s),
        "operator_cpu_s": round(op_cpu, 2),
        "events_per_cpu_s": round(n / op_cpu),
        "two_stacks": args.two_stacks,
        "read_s": round(read_s + make_s, 2),
        "stats": op.stats(),
        "loadavg": os.getloadavg(),
    }))


if __name__ == "__main__":
    main()
