"""Interval benchmark (issue 15): derivation, the 002 query shapes under its 7 relations, native vs point types.

    python -m bench.intervals [--rows N] [--query-intervals N] [--within-min 120]

Measures, on this machine (one process, one core):

1. derivation: the issue's ``congestion_episode`` INTERVAL statement (vehicle_count > 0 and avg_speed <
   0.5 * NDT_IN_KMH, PARTITION BY key, COVER 5 min, MAX GAP 10 min, MIN DURATION 10 min) over the Aarhus
   traffic table (the first N rows, default all 7.1 M), readings/s of ``IntervalDeriver.push`` (events are
   built from Arrow batches outside the timed loop); plus the episode counts of humid spells (weather,
   humidity >= 85 %), garage-full intervals (parking, free_spaces < 5 % of total_spaces) and falling runs
   (1-min equity bars, close < open), each derived the same way;
2. the 002 query shapes Q2.1 ``A,B``, Q3.3 ``A,B,C*``, Q3.5 ``A,B,C,D``, Q3.8 ``(A|B)*,(C|D)`` written as
   ``SEQ(...) BY rel WITHIN w`` under each of 002's 7 relations (before, meets, overlaps, finished by,
   contains, starts, equals) over the congestion episodes, typed A..D by segment (key mod 4) and fed in
   ts_end order: intervals/s, matches, and the event-time delay of each result (the ts_end of the event
   whose push emitted it minus the match's end: 0 = emitted when its deciding endpoint arrived);
3. native intervals vs the same Q2.1 written today with two point types per interval (start and end events,
   an ``iid`` attribute joining them, WHERE on their timestamps), BEFORE and OVERLAPS; equal match counts
   are checked.

Results print as a markdown section for docs/benchmarks.md. Timestamps are int microseconds UTC.
"""
from __future__ import annotations

import argparse
import csv
import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from engine.compiler import compile_query
from engine.events import Event
from engine.intervals.derive import IntervalDeriver
from engine.lql.parser import parse
from engine.matcher import Matcher

ROOT = next(
    (p / "shared" / "data" for p in Path(__file__).resolve().parents[1:4] if (p / "shared" / "data").is_dir()),
    Path("/work/shared/data"),
)
AARHUS = ROOT / "aarhus"
BARS = ROOT / "equity" / "lean_trade_bars_1m.parquet"
MS = 1_000
MIN = 60_000_000

CONGESTION = """NAME congestion_episode
INTERVAL traffic t WHEN t.vehicle_count > 0 AND t.avg_speed < 0.5 * t.ndt_kmh
PARTITION BY key COVER 5 min MAX GAP 10 min MIN DURATION 10 min
RETURN min(t.avg_speed) AS low, count(t) AS readings"""
HUMID = "INTERVAL weather w WHEN w.humidity >= 85 COVER 20 min MAX GAP 40 min RETURN count(w) AS n"
GARAGE = ("INTERVAL parking p WHEN p.free_spaces < 0.05 * p.total_spaces PARTITION BY key COVER 30 min "
          "MAX GAP 60 min RETURN count(p) AS n")
FALLING = "INTERVAL bar b WHEN b.close < b.open PARTITION BY key COVER 1 min RETURN count(b) AS n"

RELATIONS = ("BEFORE", "MEETS", "OVERLAPS", "FINISHED_BY", "CONTAINS", "STARTS", "EQUALS")
SHAPES = {
    "Q2.1 A,B": "SEQ(A a, B b)",
    "Q3.3 A,B,C*": "SEQ(A a, B b, C* c[])",
    "Q3.5 A,B,C,D": "SEQ(A a, B b, C c, D d)",
    "Q3.8 (A|B)*,(C|D)": "SEQ(ANY(A, B)+ ab[], ANY(C, D) cd)",
}


def _ndt() -> dict[int, float]:
    with open(AARHUS / "traffic_sensors.csv", newline="", encoding="utf-8") as f:
        return {int(r["REPORT_ID"]): float(r["NDT_IN_KMH"]) for r in csv.DictReader(f)}


def traffic_batches(rows: int | None) -> Iterator[list[Event]]:
    """The traffic table as Events (ts = ts_ms * 1000), 200k rows at a time, in file order ((ts, key))."""
    ndt = _ndt()
    table = pq.ParquetFile(AARHUS / "aarhus_traffic_2014-08_09.parquet")
    seen = 0
    cols = ["report_id", "ts_ms", "avg_speed", "vehicle_count"]
    for batch in table.iter_batches(batch_size=200_000, columns=cols):
        d = batch.to_pydict()
        n = len(d["ts_ms"]) if rows is None else min(len(d["ts_ms"]), rows - seen)
        out = [
            Event(seen + i + 1, "traffic", d["ts_ms"][i] * MS,
                  {"key": d["report_id"][i], "avg_speed": d["avg_speed"][i], "vehicle_count": d["vehicle_count"][i],
                   "ndt_kmh": ndt.get(d["report_id"][i])})
            for i in range(n)
        ]
        seen += n
        yield out
        if rows is not None and seen >= rows:
            return


def table_events(path: Path, etype: str, columns: list[str], key: str = "key") -> list[Event]:
    t = pq.read_table(path, columns=["ts_ms", key, *columns]).sort_by([("ts_ms", "ascending")]).to_pydict()
    return [
        Event(i + 1, etype, t["ts_ms"][i] * MS, {"key": t[key][i], **{c: t[c][i] for c in columns}})
        for i in range(len(t["ts_ms"]))
    ]


def derive(text: str, batches: Iterator[list[Event]]) -> tuple[list[Any], int, float]:
    d = IntervalDeriver(parse(text))
    out: list[Any] = []
    n = 0
    elapsed = 0.0
    for batch in batches:
        t0 = time.process_time()
        push = d.push
        for e in batch:
            r = push(e)
            if r:
                out += r
        elapsed += time.process_time() - t0
        n += len(batch)
    t0 = time.process_time()
    out += d.flush()
    elapsed += time.process_time() - t0
    return out, n, elapsed


def interval_stream(episodes: list[Any], limit: int) -> list[Event]:
    """Episodes as interval events typed A..D by segment (key mod 4), in the matcher's (ts_end, id) order."""
    evs = sorted(episodes, key=lambda m: (m.end, m.start))[:limit]
    keys = [m.events["t"][0].attrs["key"] for m in evs]
    return [Event(i + 1, "ABCD"[int(k) % 4], m.start, {"key": k}, m.end) for i, (m, k) in enumerate(zip(evs, keys))]


def run_query(text: str, events: list[Event], strategy: str | None = None) -> tuple[int, float, int]:
    """(matches, CPU seconds, max event-time delay in us) of one query over ``events``."""
    m = Matcher(compile_query(text, strategy=strategy))
    n = 0
    delay = 0
    push = m.push
    t0 = time.process_time()
    for e in events:
        for r in push(e):
            n += 1
            delay = max(delay, e.ts_end - r.end)
    n += len(m.flush())
    return n, time.process_time() - t0, delay


def point_stream(intervals: list[Event]) -> list[Event]:
    """Each interval as a start event (type AS, BS...) and an end event (AE, BE...) sharing ``iid``, by (ts, id)."""
    rows = []
    for e in intervals:
        if e.type in "AB":
            rows.append((e.ts, 0, e.type + "S", e.id))
            rows.append((e.ts_end, 1, e.type + "E", e.id))
    rows.sort()
    return [Event(i + 1, t, ts, {"iid": iid}) for i, (ts, _, t, iid) in enumerate(rows)]


POINT_QUERIES = {
    "BEFORE": "SEQ(AS s1, AE e1, BS s2, BE e2) WHERE e1.iid = s1.iid AND e2.iid = s2.iid AND e1.ts < s2.ts",
    "OVERLAPS": "SEQ(AS s1, BS s2, AE e1, BE e2) WHERE e1.iid = s1.iid AND e2.iid = s2.iid AND s1.ts < s2.ts "
    "AND s2.ts < e1.ts AND e1.ts < e2.ts",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=None, help="traffic rows to derive from (default: all)")
    ap.add_argument("--query-intervals", type=int, default=20_000, help="episodes fed to each query")
    ap.add_argument("--within-min", type=int, default=120, help="WITHIN of the query shapes, minutes")
    ap.add_argument("--strategy", default="skip_till_next_match", help="selection strategy of the query shapes")
    args = ap.parse_args()
    load = os.getloadavg()
    print(f"## Interval events (issue 15): `python -m bench.intervals {' '.join(os.sys.argv[1:])}`\n")
    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; date 2026-11-23; load average at start {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f}.\n")

    episodes, n, secs = derive(CONGESTION, traffic_batches(args.rows))
    print("### Derivation\n")
    print("Seconds are CPU seconds of this process (time.process_time): the machine is shared, so wall time\n"
          "counts other engineers' work; rates are per core.\n")
    print("| statement | input rows | intervals | CPU s (push loop) | readings/s |")
    print("|---|---|---|---|---|")
    print(f"| congestion_episode (traffic) | {n:,} | {len(episodes):,} | {secs:.2f} | {n / secs:,.0f} |")
    for name, text, events in (
        ("humid spell (weather)", HUMID, table_events(AARHUS / "aarhus_weather_2014-08_09.parquet", "weather",
                                                      ["humidity"])),
        ("garage full (parking)", GARAGE, table_events(AARHUS / "aarhus_parking_2014.parquet", "parking",
                                                       ["free_spaces", "total_spaces"])),
        ("falling run (1-min bars)", FALLING, table_events(BARS, "bar", ["open", "close"])
         if BARS.exists() else []),
    ):
        out, k, s = derive(text, iter([events]))
        print(f"| {name} | {k:,} | {len(out):,} | {s:.2f} | {k / s if s else 0:,.0f} |")

    stream = interval_stream(episodes, args.query_intervals)
    w = f"WITHIN {args.within_min} min"
    print(f"\n### 002's query shapes over {len(stream):,} congestion episodes (A..D = key mod 4), {w}, "
          f"STRATEGY {args.strategy}\n")
    print("| shape | relation | matches | CPU s | intervals/s | max event-time delay (us) |")
    print("|---|---|---|---|---|---|")
    for shape, pattern in SHAPES.items():
        for rel in RELATIONS:
            matches, s, delay = run_query(f"PATTERN {pattern} BY {rel} {w}", stream, args.strategy)
            print(f"| {shape} | {rel} | {matches:,} | {s:.2f} | {len(stream) / s:,.0f} | {delay} |")

    points = point_stream(stream)
    print(f"\n### Native intervals vs two point types (Q2.1, {w}, STRATEGY skip_till_any_match; {len(points):,} "
          "point events for the A/B intervals)\n")
    print("| relation | native matches | native CPU s | point-type matches | point-type CPU s | speed-up |")
    print("|---|---|---|---|---|---|")
    for rel, point_where in POINT_QUERIES.items():
        # skip_till_any_match: both forms then have exactly the same matches (checked)
        nm, ns, _ = run_query(f"PATTERN SEQ(A a, B b) WHERE a {rel} b {w}", stream, "skip_till_any_match")
        pm, ps, _ = run_query(f"PATTERN {point_where} {w}", points, "skip_till_any_match")
        assert nm == pm, (rel, nm, pm)
        print(f"| {rel} | {nm:,} | {ns:.2f} | {pm:,} | {ps:.2f} | {ps / ns:.1f}x |")
    load = os.getloadavg()
    print(f"\nLoad average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}.")


if __name__ == "__main__":
    main()
