"""Engine benchmark: the peer stream's P1-P4 (shared/bench/README.md) and a real Aarhus query.

Each case runs in a fresh subprocess (so peak memory is its own) over events already
in memory: it times ``Matcher.push`` for every event plus ``flush()`` (best of
``--repeat`` runs, wall and CPU time), checks the match count against the published
one, and reports the partial-match counters.

    python -m bench.engine                      # 1M events, every case, lace match, storage comparison
    python -m bench.engine --n 100000 --cases P1-any,P1-next
    python -m bench.engine --aarhus             # + congestion query over the whole Aarhus table
    python -m bench.engine --cases P1-any --lace-match-formats jsonl,parquet  # end to end, both outputs
    python -m bench.engine --climb --cases none --no-lace-match  # the climb stream, shared vs unshared runs

Prints one JSON object per case and a Markdown table at the end.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PATTERNS = {
    "P1": "PATTERN SEQ(A a, B b, C c) PARTITION BY key WITHIN {w}",
    "P2": "PATTERN SEQ(A a, B+ b[], C c) PARTITION BY key WITHIN {w}",
    "P3": "PATTERN SEQ(A a, !B b, C c) PARTITION BY key WITHIN {w}",
    "P4": "PATTERN SEQ(A a, B b, C c) WHERE b.price < a.price PARTITION BY key WITHIN {w}",
}
# (pattern, strategy, window) -> {n: exact count} from shared/bench/README.md
EXPECTED = {
    ("P1", "any", "1 s"): {10_000: 9_899, 100_000: 101_009, 1_000_000: 1_011_940},
    ("P1", "any", "5 s"): {10_000: 188_805, 100_000: 2_461_950, 1_000_000: 25_286_521},
    ("P2", "any", "500 ms"): {10_000: 4_179, 100_000: 39_848, 1_000_000: 402_453},
    ("P2", "any", "1 s"): {10_000: 32_882, 100_000: 279_122, 1_000_000: 2_809_082},
    ("P3", "any", "1 s"): {10_000: 3_046, 100_000: 30_894, 1_000_000: 307_490},
    ("P4", "any", "1 s"): {10_000: 5_036, 100_000: 50_003, 1_000_000: 504_842},
    ("P1", "next", "1 s"): {10_000: 2_259, 100_000: 23_362, 1_000_000: 235_073},
    ("P2", "next", "1 s"): {10_000: 2_259, 100_000: 23_362, 1_000_000: 235_073},
    ("P3", "next", "1 s"): {10_000: 1_625, 100_000: 16_568, 1_000_000: 166_594},
    ("P4", "next", "1 s"): {10_000: 1_487, 100_000: 14_947, 1_000_000: 151_005},
}
STRATEGY = {"any": "skip_till_any_match", "next": "skip_till_next_match"}
# name -> (pattern, strategy, window, storage); the targets are on the first five
CASES = {
    "P1-any": ("P1", "any", "1 s", "chain"),
    "P2-any": ("P2", "any", "500 ms", "chain"),
    "P3-any": ("P3", "any", "1 s", "chain"),
    "P4-any": ("P4", "any", "1 s", "chain"),
    "P1-next": ("P1", "next", "1 s", "runs"),
    "P2-next": ("P2", "next", "1 s", "runs"),
    "P3-next": ("P3", "next", "1 s", "runs"),
    "P4-next": ("P4", "next", "1 s", "runs"),
    "P1-any-runs": ("P1", "any", "1 s", "runs"),
    "P2-any-runs": ("P2", "any", "500 ms", "runs"),
    "P1-any-5s": ("P1", "any", "5 s", "chain"),  # 25.3M matches: the end-to-end writing case
}
# events per CPU second (issue 17; SASE 1.0 does 617k on P1-any); the 5 s window's target is 1M matches/s written
TARGETS = {"P1-any": 620_000, "P2-any": 400_000, "P3-any": 450_000, "P4-any": 400_000, "P1-next": 1_000_000}
LACE_MATCH_TARGETS = {"P1-any": ("events_per_s", 250_000), "P1-any-5s": ("matches_per_s", 1_000_000)}

CONGESTION = """NAME congestion
PATTERN SEQ(traffic a, traffic b, traffic r)
WHERE a.vehicle_count > 0 AND a.avg_speed < 0.5 * a.ndt_kmh
  AND b.vehicle_count > 0 AND b.avg_speed < 0.5 * b.ndt_kmh
  AND r.vehicle_count > 0 AND r.avg_speed >= 0.5 * r.ndt_kmh
PARTITION BY key
STRATEGY partition_contiguity
WITHIN 30 min
RETURN a.key AS segment, a.avg_speed AS speed, r.ts AS recovered"""
AARHUS = next(
    (d / "shared" / "data" / "aarhus" for d in Path(__file__).resolve().parents if (d / "shared" / "data").is_dir()),
    Path(__file__).resolve().parents[2] / "shared" / "data" / "aarhus",
)  # ../shared beside the checkout (/work/shared for /work/main and for worktrees under /work/wt)

CLIMB = """PATTERN SEQ(E a, E+ b[], E c)
WHERE b[1].x > a.x AND b[i].x > b[i-1].x AND c.x <= b[last].x
PARTITION BY key
STRATEGY skip_till_next_match
WITHIN 10 min"""
CLIMB_TARGET = 50_000


def query_text(case: str) -> str:
    pattern, strategy, window, _ = CASES[case]
    return PATTERNS[pattern].format(w=window) + f" STRATEGY {STRATEGY[strategy]}"


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _best_of(make_matcher: Callable[[], Any], events: list, repeat: int) -> tuple[Any, int, float, float]:
    """``repeat`` timed runs, each with a fresh ``make_matcher()`` over ``events`` then ``flush``:
    (the last matcher, its match count, best wall seconds, best CPU seconds of this process)."""
    runs = []
    for _ in range(repeat):
        matcher = make_matcher()
        count = 0
        push = matcher.push
        t0 = time.perf_counter()
        c0 = time.process_time()
        for e in events:
            count += len(push(e))
        count += len(matcher.flush())
        runs.append((time.perf_counter() - t0, time.process_time() - c0))
    return matcher, count, min(r[0] for r in runs), min(r[1] for r in runs)


def run_case(case: str, n: int, repeat: int = 3) -> dict:
    """Run one case ``repeat`` times in this process (fresh matcher each time); best times."""
    from bench.streams import generate_events
    from engine.compiler import compile_query
    from engine.matcher import Matcher

    pattern, strategy, window, storage = CASES[case]
    events = generate_events(n)
    gc.collect()
    gc.freeze()  # the stream is long-lived input, not the engine's garbage
    rss_before = _rss_mb()
    query = compile_query(query_text(case))
    matcher, count, seconds, cpu_seconds = _best_of(
        lambda: Matcher(query, storage=storage), events, repeat  # type: ignore[arg-type]
    )
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    stats = matcher.stats()
    expected = EXPECTED[(pattern, strategy, window)].get(n)
    return {
        "case": case,
        "n": n,
        "storage": storage,
        "matches": count,
        "expected": expected,
        "exact": expected is None or count == expected,
        "seconds": round(seconds, 3),
        "cpu_seconds": round(cpu_seconds, 3),
        "events_per_s": int(n / seconds),
        "events_per_cpu_s": int(n / cpu_seconds),
        "created": stats["created"],
        "copied": stats["copied"],
        "peak_live": stats["peak_live"],
        "engine_peak_mb": round(max(0.0, peak_mb - rss_before), 1),
    }


ROOT = Path(__file__).resolve().parents[1]


def _cli_module() -> str:
    """``cli`` once the commands live in the top-level package, else ``service.cli``."""
    return "cli" if (ROOT / "cli" / "__main__.py").exists() else "service.cli"


def run_lace_match(case: str, n: int, repeat: int = 3, fmt: str = "jsonl") -> dict:
    """``lace match`` end to end (read the CSV, match, write every match to a file), best of ``repeat``.

    Runs this checkout's CLI (``python -m ...`` from the repository root), wall and CPU time
    (user + system of the child process) of the whole process, start-up and imports included.
    """
    from bench.streams import bench_csv

    csv = bench_csv(n)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        q = Path(tmp) / "q.lql"
        q.write_text(query_text(case))
        out = Path(tmp) / f"out.{fmt}"
        cmd = [sys.executable, "-m", _cli_module(), "match", "--query", str(q), "--events", str(csv),
               "--out", str(out), "--format", fmt]
        for _ in range(repeat):
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
            seconds = time.perf_counter() - t0
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            runs.append((seconds, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)))
        if fmt == "parquet":
            import pyarrow.parquet as pq

            lines = pq.ParquetFile(out).metadata.num_rows
        else:
            lines = sum(1 for _ in out.open())
    seconds = min(r[0] for r in runs)
    cpu = min(r[1] for r in runs)
    pattern, strategy, window, _ = CASES[case]
    expected = EXPECTED[(pattern, strategy, window)].get(n)
    return {"case": f"lace match {case} ({fmt})", "n": n, "matches": lines,
            "exact": expected is None or lines == expected, "seconds": round(seconds, 3),
            "cpu_seconds": round(cpu, 3), "events_per_s": int(n / seconds), "events_per_cpu_s": int(n / cpu),
            "matches_per_s": int(lines / seconds)}


def aarhus_tables():
    """The whole Aarhus traffic table as typed columns, one :class:`engine.event_files.EventTable` per Parquet row
    group (about 1M readings each; the file is in ts order; id = row number in the file, ts = ``ts_ms`` x 1000 us).

    Attributes: ``key`` (segment, string), ``avg_speed`` and ``vehicle_count`` (int), and ``ndt_kmh`` (float, the
    segment's normal driving speed, joined in Arrow from the sensor metadata; missing for a segment without one).
    The string columns stay dictionary-encoded as read (449 segments, one type): no 7M strings are built.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from engine.event_files import EventTable

    sensors = pacsv.read_csv(
        AARHUS / "traffic_sensors.csv",
        convert_options=pacsv.ConvertOptions(
            include_columns=["REPORT_ID", "NDT_IN_KMH"],
            column_types={"REPORT_ID": pa.string(), "NDT_IN_KMH": pa.float64()},
        ),
    )
    report_ids, ndt = sensors["REPORT_ID"].combine_chunks(), sensors["NDT_IN_KMH"].combine_chunks()
    pf = pq.ParquetFile(AARHUS / "aarhus_traffic_2014-08_09.parquet", read_dictionary=["event_type", "key"])
    cols = ["event_type", "key", "ts_ms", "avg_speed", "vehicle_count"]
    thousand = pa.Array.from_buffers(pa.int64(), 1, [None, pa.py_buffer(np.array([1000], dtype=np.int64))])[0]
    first = 1
    for group in range(pf.num_row_groups):
        t = pf.read_row_group(group, columns=cols).unify_dictionaries()
        key = t["key"].combine_chunks()
        n = len(key)
        yield EventTable(
            # from buffers: pa.array() of a numpy array, or a Python int in pc.multiply, would import pandas (0.2 s)
            pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(np.arange(first, first + n, dtype=np.int64))]),
            t["event_type"].combine_chunks(),
            pc.multiply(t["ts_ms"], thousand).combine_chunks(),
            {
                "key": key,
                "avg_speed": t["avg_speed"].combine_chunks(),
                "vehicle_count": t["vehicle_count"].combine_chunks(),
                "ndt_kmh": ndt.take(pc.index_in(key.dictionary, value_set=report_ids)).take(key.indices),
            },
            {"key": "string", "avg_speed": "int", "vehicle_count": "int", "ndt_kmh": "float"},
        )
        first += n


def aarhus_batches(batch_size: int = 200_000):
    """The whole Aarhus traffic table as lists of events (ts order; id = row number; see :func:`aarhus_tables`),
    built from Arrow columns ``batch_size`` at a time (``engine.event_files``, the path of ``lace match``)."""
    for table in aarhus_tables():
        yield from table.batches(batch_size)


def aarhus_events():
    """Every Aarhus traffic reading as an event (see :func:`aarhus_batches`)."""
    for batch in aarhus_batches():
        yield from batch


def run_aarhus() -> dict:
    """The congestion query over the whole Aarhus traffic table (7.1M readings): seconds reading the table into
    Arrow columns, building events from them, and matching (wall), the process's CPU seconds and peak RSS."""
    import resource

    from engine.compiler import compile_query
    from engine.matcher import Matcher

    matcher = Matcher(compile_query(CONGESTION))
    t_engine = 0.0
    n = matches = 0
    t0, c0 = time.perf_counter(), time.process_time()
    t_read = 0.0
    tables = aarhus_tables()
    while True:
        t1 = time.perf_counter()
        table = next(tables, None)
        t_read += time.perf_counter() - t1
        if table is None:
            break
        for events in table.batches(200_000):
            n += len(events)
            t2 = time.perf_counter()
            push = matcher.push
            for e in events:
                matches += len(push(e))
            t_engine += time.perf_counter() - t2
    t2 = time.perf_counter()
    matches += len(matcher.flush())
    t_engine += time.perf_counter() - t2
    total = time.perf_counter() - t0
    return {"case": "aarhus congestion", "n": n, "matches": matches, "seconds": round(total, 1),
            "cpu_seconds": round(time.process_time() - c0, 1), "engine_seconds": round(t_engine, 1),
            "load_seconds": round(total - t_engine, 2), "read_seconds": round(t_read, 2),
            "events_per_s": int(n / t_engine), "peak_live": matcher.stats()["peak_live"],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}


def run_climb(n: int = 60_000, repeat: int = 3, share: bool = True) -> dict:
    """The climb query (:data:`CLIMB`) over :func:`bench.streams.climb_events` (issue 17), best of ``repeat``.

    ``share`` False: one run per partial match (``Matcher(share_runs=False)``). Also reports the
    largest number of groups (runs actually advanced) held at once, sampled every 1,000 events.
    """
    from bench.streams import climb_events
    from engine.compiler import compile_query
    from engine.matcher import Matcher

    events = climb_events(n)
    gc.collect()
    gc.freeze()
    rss_before = _rss_mb()
    query = compile_query(CLIMB)
    peak_groups = 0
    share_runs = None if share else False  # None: the default
    matcher, count, seconds, cpu_seconds = _best_of(
        lambda: Matcher(query, storage="runs", share_runs=share_runs), events, repeat
    )
    if share:  # an extra, untimed pass that samples the groups held
        matcher = Matcher(query, storage="runs")
        for i, e in enumerate(events):
            matcher.push(e)
            if i % 1000 == 999:
                held = sum(st.groups() for sts in matcher.states.values() for st in sts)
                peak_groups = max(peak_groups, held)
        matcher.flush()
    stats = matcher.stats()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"case": f"climb ({'shared' if share else 'unshared'} runs)", "n": n, "matches": count,
            "seconds": round(seconds, 3), "cpu_seconds": round(cpu_seconds, 3),
            "events_per_s": int(n / seconds), "events_per_cpu_s": int(n / cpu_seconds),
            "created": stats["created"], "merged": stats["merged"], "peak_live": stats["peak_live"],
            "peak_groups": peak_groups if share else stats["peak_live"],
            "engine_peak_mb": round(max(0.0, peak_mb - rss_before), 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000, help="events of the seed-42 stream")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    ap.add_argument("--repeat", type=int, default=3, help="runs per case; the best time is reported")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--no-lace-match", action="store_true", help="skip the lace match end-to-end run")
    ap.add_argument("--lace-match-formats", default="jsonl", help="output formats of the end-to-end run: jsonl,parquet")
    ap.add_argument("--lace-match-cases", default="P1-any",
                    help="cases of the end-to-end run: P1-any (1M matches), P1-any-5s (25.3M matches)")
    ap.add_argument("--aarhus", action="store_true", help="also run the congestion query on the Aarhus table")
    ap.add_argument("--climb", action="store_true", help="also run the climb query, shared and unshared runs")
    ap.add_argument("--climb-n", type=int, default=60_000, help="events of the climb stream")
    ap.add_argument("--climb-unshared-n", type=int, default=60_000,
                    help="events of the climb stream for the unshared run (a prefix: it is slow)")
    ap.add_argument("--climb-one", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(run_case(a.one, a.n, a.repeat)))
        return 0
    if a.climb_one:
        share = a.climb_one == "shared"
        print(json.dumps(run_climb(a.climb_n if share else a.climb_unshared_n, a.repeat, share)))
        return 0
    results = []
    for case in [c for c in a.cases.split(",") if c != "none"]:
        proc = subprocess.run([sys.executable, "-m", "bench.engine", "--one", case, "--n", str(a.n),
                               "--repeat", str(a.repeat)],
                              check=True, capture_output=True, text=True)
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    extra = []
    if not a.no_lace_match:
        for case in a.lace_match_cases.split(","):
            for fmt in a.lace_match_formats.split(","):
                r = run_lace_match(case, a.n, a.repeat, fmt)
                field, target = LACE_MATCH_TARGETS.get(case, (None, None))
                if field:
                    r["target"] = f"{field} >= {target:,}"
                extra.append(r)
                print(json.dumps(extra[-1]), flush=True)
    if a.aarhus:
        extra.append(run_aarhus())
        print(json.dumps(extra[-1]), flush=True)
    exact = True
    if a.climb:
        climb = {}
        for mode in ("shared", "unshared"):
            proc = subprocess.run([sys.executable, "-m", "bench.engine", "--climb-one", mode, "--climb-n",
                                   str(a.climb_n), "--climb-unshared-n", str(a.climb_unshared_n),
                                   "--repeat", str(a.repeat)], check=True, capture_output=True, text=True)
            climb[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(json.dumps(climb[mode]), flush=True)
        if a.climb_unshared_n != a.climb_n:  # exactness on the prefix the unshared run covers
            proc = subprocess.run([sys.executable, "-m", "bench.engine", "--climb-one", "shared", "--climb-n",
                                   str(a.climb_unshared_n), "--repeat", "1"],
                                  check=True, capture_output=True, text=True)
            prefix = json.loads(proc.stdout.strip().splitlines()[-1])
        else:
            prefix = climb["shared"]
        exact = prefix["matches"] == climb["unshared"]["matches"]
        print(f"\nclimb: shared runs give {prefix['matches']:,} matches on the first {prefix['n']:,} events, "
              f"unshared {climb['unshared']['matches']:,}: {'exact' if exact else 'DIFFERENT'}; "
              f"target {CLIMB_TARGET:,} events/s")
        print("| climb | events | events/s (wall) | events/s (CPU) | CPU s | wall s | matches | runs created "
              "| merged | peak live partial matches | peak runs held |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in climb.values():
            print(f"| {r['case']} | {r['n']:,} | {r['events_per_s']:,} | {r['events_per_cpu_s']:,} | "
                  f"{r['cpu_seconds']} | {r['seconds']} | {r['matches']:,} | {r['created']:,} | {r['merged']:,} | "
                  f"{r['peak_live']:,} | {r['peak_groups']:,} |")
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    print(f"\n{machine}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}, n = {a.n:,}\n")
    print("| case | storage | events/s (wall) | events/s (CPU) | target | matches | exact | created | copied "
          "| peak live | engine MB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        target = TARGETS.get(r["case"])
        print(f"| {r['case']} | {r['storage']} | {r['events_per_s']:,} | {r['events_per_cpu_s']:,} | "
              f"{f'{target:,}' if target else ''} | "
              f"{r['matches']:,} | {'yes' if r['exact'] else 'NO'} | {r['created']:,} | {r['copied']:,} | "
              f"{r['peak_live']:,} | {r['engine_peak_mb']} |")
    for r in extra:
        print(f"\n{r['case']}: {json.dumps(r)}")
    return 0 if exact and all(r["exact"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
