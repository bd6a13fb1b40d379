"""Rule-index benchmark (issue 14 "Benchmark"; engine/rules/index.py): dispatch with the index against a linear scan.

Workloads (real data, ``shared/data``, read with :mod:`engine.event_files`):

- **Aarhus**: rules generated from the sensor metadata (``traffic_sensors.csv``): per segment, speed bands
  relative to its ``NDT_IN_KMH`` and vehicle-count bands, ``m = n / 449`` rules per segment
  (50: the congestion rule on the first 50 segments; 449: the congestion rule
  ``t.key = K AND t.vehicle_count > 0 AND t.avg_speed < 0.5 * NDT`` on every segment; 4,490: 10 speed bands of
  0.15 NDT per segment with ``vehicle_count > 0``; 44,900: 10 speed bands x 10 count bands), over the whole traffic
  table (7,137,361 readings).
- **Equity**: 1,000 price-band rules (250 overlapping bands per ticker over its week's price range:
  ``t.key = S AND t.price >= lo AND t.price < hi``) over the 2,793,812 trade ticks.

Per workload: index dispatch events/s (``RuleIndex.reached``) over the whole table; the linear scan
(``RuleIndex.scan``: every statement's compiled conjunction, what dispatch costs without an index) over a
prefix, with the index timed on the same prefix side by side; statements reached and candidates verified per
event; add and remove cost per statement; update-to-effect (remove a statement and add its new version,
parsed from LQL text, until the next ``reached`` sees it). Only dispatch is timed (events are built from
the table beforehand, batch by batch). Every event's ``reached`` equals ``scan`` on the prefix (checked).

    python -m bench.rules                                   # every size
    python -m bench.rules --sizes 449,4490 --no-equity --limit 1000000
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import random
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.event_files import EventTable
from engine.events import Event
from engine.lql import ast as A
from engine.lql.parser import parse
from engine.rules.index import RuleIndex

_HERE = Path(__file__).resolve()
DATA = next(
    (p / "shared" / "data" for p in _HERE.parents if (p / "shared" / "data").is_dir()),
    _HERE.parents[2] / "shared" / "data",
)
AARHUS = DATA / "aarhus"
EQUITY = DATA / "equity"
SPEED_BANDS = 10
SPEED_STEP = 0.15  # of NDT_IN_KMH
COUNT_BANDS = 10
COUNT_STEP = 2  # vehicles


def table(path: Path, attrs: list[str], limit: int | None = None) -> EventTable:
    """An :class:`EventTable` over the columns ``event_type`` -> type, ``ts_ms`` -> ts (int us) and ``attrs``."""
    t = pq.read_table(path, columns=["event_type", "ts_ms", *attrs])
    if limit is not None:
        t = t.slice(0, limit)
    ts = pc.multiply(t.column("ts_ms").combine_chunks().cast(pa.int64()), 1000)
    cols = {a: t.column(a).combine_chunks() for a in attrs}
    for a, c in cols.items():
        if pa.types.is_large_string(c.type):
            cols[a] = c.cast(pa.string())
    kinds = {a: "string" if pa.types.is_string(c.type) else "float" if pa.types.is_floating(c.type) else "int"
             for a, c in cols.items()}
    types = t.column("event_type").combine_chunks().cast(pa.string())
    return EventTable(None, types, ts, cols, kinds)


def sensors() -> list[tuple[str, float]]:
    """(REPORT_ID, NDT_IN_KMH) of every segment, in file order."""
    with open(AARHUS / "traffic_sensors.csv", newline="") as f:
        return [(row["REPORT_ID"], float(row["NDT_IN_KMH"])) for row in csv.DictReader(f)]


def _t(attr: str) -> A.AttrRef:
    return A.AttrRef("t", attr)


def _rule(type_name: str, conds: list[tuple[str, str, object]]) -> A.PatternQuery:
    where = A.BoolOp("and", tuple(A.Compare(op, _t(a), A.Literal(v)) for a, op, v in conds))  # type: ignore[arg-type]
    return A.PatternQuery(A.Seq((A.Component("single", (type_name,), "t"),)), where)


def _text(type_name: str, conds: list[tuple[str, str, object]]) -> str:
    lits = [f"'{v}'" if isinstance(v, str) else repr(v) for _a, _op, v in conds]
    where = " AND ".join(f"t.{a} {op} {lit}" for (a, op, _v), lit in zip(conds, lits))
    return f"PATTERN SEQ({type_name} t) WHERE {where}"


def aarhus_rules(n: int) -> list[list[tuple[str, str, object]]]:
    """``n`` rules (as condition lists) from the sensor metadata (module docstring)."""
    segs = sensors()
    if n <= len(segs):
        return [
            [("key", "=", k), ("vehicle_count", ">", 0), ("avg_speed", "<", round(0.5 * ndt, 3))] for k, ndt in segs[:n]
        ]
    per = n // len(segs)
    rules = []
    for k, ndt in segs:
        for j in range(per):
            sb, cb = j % SPEED_BANDS, j // SPEED_BANDS
            conds: list[tuple[str, str, object]] = [
                ("key", "=", k),
                ("avg_speed", ">=", round(sb * SPEED_STEP * ndt, 3)),
                ("avg_speed", "<", round((sb + 1) * SPEED_STEP * ndt, 3)),
            ]
            if per <= SPEED_BANDS:
                conds.append(("vehicle_count", ">", 0))
            else:
                conds.append(("vehicle_count", ">=", cb * COUNT_STEP))
                if cb < COUNT_BANDS - 1:
                    conds.append(("vehicle_count", "<", (cb + 1) * COUNT_STEP))
            rules.append(conds)
    return rules


def equity_rules(n: int = 1000) -> list[list[tuple[str, str, object]]]:
    """``n`` price-band rules, ``n / 4`` per ticker, each band two steps wide (bands overlap by half)."""
    t = pq.read_table(EQUITY / "lean_trades_tick.parquet", columns=["key", "price"])
    agg = t.group_by("key").aggregate([("price", "min"), ("price", "max")]).to_pylist()
    per = n // len(agg)
    rules = []
    for row in sorted(agg, key=lambda r: r["key"]):
        lo, hi = row["price_min"], row["price_max"]
        step = (hi - lo) / per
        for j in range(per):
            rules.append([("key", "=", row["key"]), ("price", ">=", round(lo + (j - 1) * step, 4)),
                          ("price", "<", round(lo + (j + 1) * step, 4))])
    return rules


def batches(t: EventTable, limit: int | None = None) -> Iterator[list[Event]]:
    n = 0
    for batch in t.batches():
        if limit is not None and n + len(batch) > limit:
            batch = batch[: limit - n]
        n += len(batch)
        if batch:
            yield batch
        if limit is not None and n >= limit:
            return


def time_dispatch(fn, t: EventTable, limit: int | None) -> tuple[int, float, float, int]:
    """(events, wall seconds of dispatch only, CPU seconds of it, statements reached in total)."""
    n = reached = 0
    seconds = cpu = 0.0
    for batch in batches(t, limit):
        start, start_cpu = time.perf_counter(), time.process_time()
        for e in batch:
            reached += len(fn(e))
        seconds += time.perf_counter() - start
        cpu += time.process_time() - start_cpu
        n += len(batch)
    return n, seconds, cpu, reached


def update_costs(index: RuleIndex, type_name: str, rules: list, sample: list[Event], k: int = 200) -> dict:
    """Remove a statement and add its new version from LQL text (parse + add), then the next lookup sees it."""
    rng = random.Random(1)
    lat, parse_us, cpu = [], [], []
    for _ in range(k):
        j = rng.randrange(len(rules))
        text = _text(type_name, rules[j])
        start, start_cpu = time.perf_counter(), time.process_time()
        tree = parse(text)
        parsed = time.perf_counter()
        index.remove(f"r{j}")
        index.add(f"r{j}", tree)
        index.reached(sample[j % len(sample)])
        done = time.perf_counter()
        cpu.append((time.process_time() - start_cpu) * 1e6)
        lat.append((done - start) * 1e6)
        parse_us.append((parsed - start) * 1e6)
    lat.sort()
    cpu.sort()
    return {
        "update_to_effect_p50_us": round(statistics.median(lat), 1),
        "update_to_effect_p99_us": round(lat[int(0.99 * (k - 1))], 1),
        "update_cpu_p50_us": round(statistics.median(cpu), 1),
        "update_cpu_p99_us": round(cpu[int(0.99 * (k - 1))], 1),
        "of_which_parse_p50_us": round(statistics.median(parse_us), 1),
    }


def run(name: str, type_name: str, rules: list, t: EventTable, limit: int | None, linear_events: int) -> dict:
    trees = [_rule(type_name, r) for r in rules]
    # the generated trees are what the parser makes of the rules' text (checked on a few)
    probe = RuleIndex()
    for j in range(0, len(rules), max(1, len(rules) // 5)):
        probe.add(f"r{j}", parse(_text(type_name, rules[j])))
    index = RuleIndex()
    start = time.perf_counter()
    for j, tree in enumerate(trees):
        index.add(f"r{j}", tree)
    add_us = (time.perf_counter() - start) / len(trees) * 1e6
    prefix = next(batches(t, 2000))
    for e in prefix[:200]:
        assert index.reached(e) == index.scan(e)
        assert probe.reached(e) == [r for r in index.reached(e) if r in probe]
    n_lin = min(linear_events, len(t) if limit is None else limit)
    # side by side on the prefix: index, then linear scan
    n_p, s_idx_p, c_idx_p, reached_p = time_dispatch(index.reached, t, n_lin)
    _, s_lin, c_lin, reached_lin = time_dispatch(index.scan, t, n_lin)
    assert reached_p == reached_lin
    index.candidates = index.events = index.reached_total = 0
    n, s_idx, c_idx, reached = time_dispatch(index.reached, t, limit)
    stats = index.stats()
    updates = update_costs(index, type_name, rules, prefix)
    start = time.perf_counter()
    for j in range(len(trees)):
        index.remove(f"r{j}")
    remove_us = (time.perf_counter() - start) / len(trees) * 1e6
    out = {
        "workload": name, "statements": len(trees), "events": n,
        "index_events_per_s": int(n / s_idx), "index_events_per_cpu_s": int(n / c_idx),
        "index_seconds": round(s_idx, 1),
        "reached_per_event": round(reached / n, 3), "candidates_per_event": round(stats["candidates_per_event"], 3),
        "prefix_events": n_p, "prefix_index_events_per_s": int(n_p / s_idx_p),
        "prefix_linear_events_per_s": int(n_p / s_lin), "speedup": round(s_lin / s_idx_p, 1),
        "prefix_index_events_per_cpu_s": int(n_p / c_idx_p), "prefix_linear_events_per_cpu_s": int(n_p / c_lin),
        "speedup_cpu": round(c_lin / c_idx_p, 1),
        "add_us": round(add_us, 1), "remove_us": round(remove_us, 1), **updates,
        "load": os.getloadavg()[0],
    }
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="50,449,4490,44900", help="Aarhus statement counts")
    ap.add_argument("--limit", type=int, default=None, help="events per table for the index (default: all)")
    ap.add_argument("--linear-budget", type=int, default=9_000_000,
                    help="linear-scan prefix = budget / statements events (300 to 200,000)")
    ap.add_argument("--no-equity", action="store_true")
    a = ap.parse_args()
    print(json.dumps({"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
                      "load": os.getloadavg()}), flush=True)
    results = []
    sizes = [int(s) for s in a.sizes.split(",") if s]
    if sizes:
        traffic = table(AARHUS / "aarhus_traffic_2014-08_09.parquet", ["key", "avg_speed", "vehicle_count"], a.limit)
        for n in sizes:
            lin = max(300, min(200_000, a.linear_budget // n))
            results.append(run("aarhus", "traffic", aarhus_rules(n), traffic, a.limit, lin))
        del traffic
    if not a.no_equity:
        ticks = table(EQUITY / "lean_trades_tick.parquet", ["key", "price", "size"], a.limit)
        lin = max(300, min(200_000, a.linear_budget // 1000))
        results.append(run("equity", "trade", equity_rules(1000), ticks, a.limit, lin))
    print("\n| workload | statements | events | index ev/s (ev/CPU-s) | reached/ev | candidates/ev | prefix "
          "| index ev/s (prefix) | linear ev/s (prefix) | speedup (CPU) | add µs | remove µs "
          "| update-to-effect p50/p99 µs | load |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['workload']} | {r['statements']:,} | {r['events']:,} | "
              f"{r['index_events_per_s']:,} ({r['index_events_per_cpu_s']:,}) | "
              f"{r['reached_per_event']} | {r['candidates_per_event']} | {r['prefix_events']:,} | "
              f"{r['prefix_index_events_per_s']:,} | {r['prefix_linear_events_per_s']:,} | "
              f"{r['speedup']}x ({r['speedup_cpu']}x) | "
              f"{r['add_us']} | {r['remove_us']} | {r['update_to_effect_p50_us']}/{r['update_to_effect_p99_us']} "
              f"(CPU {r['update_cpu_p50_us']}/{r['update_cpu_p99_us']}) | "
              f"{r['load']:.1f} |")


if __name__ == "__main__":
    main()
