"""``lace stream`` vs ``lace match`` (issue 26): events/s of the peer stream's P1-any, P2-any, P1-next on Spark
Structured Streaming with 1 and 2 cores (local[1], local[2]).

One child process per master starts Spark once, runs a small warm-up stream (the first streaming query of a
session pays class loading and code generation), then each case through :mod:`stream.job` exactly as ``lace
stream`` runs it: the source table written (``prepare_s``), the streaming query until the source is consumed
(``detect_s``, the events/s figure), the results sorted and written as JSONL (``write_s``). It checks the match
count against the published one, and reports the micro-batches' duration p50/p99 and the state store's size
after the last one. ``lace match`` runs the same cases end to end (``bench.engine.run_lace_match``).

    python -m bench.stream --n 100000 --batch-events 50000
    python -m bench.stream --n 1000000 --cases P1-any --masters 'local[2]'

Prints one JSON object per run and a Markdown table at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.engine import CASES, EXPECTED, query_text, run_lace_match

CASE_NAMES = ("P1-any", "P2-any", "P1-next")


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def batch_seconds(reports: list[dict]) -> tuple[list[float], list[float]]:
    """The durations (s) of the micro-batches in Spark's progress ``reports`` (dicts): (those with events, those
    with one row or none: the end markers' and the no-data ones, i.e. what a micro-batch costs with no events)."""
    data, empty = [], []
    for p in reports:
        (data if p.get("numInputRows", 0) > 1 else empty).append(p["durationMs"].get("triggerExecution", 0) / 1000)
    return data, empty


def run_stream_case(case: str, n: int, master: str, batch_events: int) -> dict:
    """One case through the stream job on this process's session (``master``); timings in seconds."""
    from bench.streams import bench_csv
    from engine.compiler import compile_query
    from engine.io import open_event_file
    from engine.match_files import MatchWriter
    from stream import job as J
    from stream.job import StreamJob, accepted_events, ordered_matches, prepare, run_detection

    text = query_text(case)
    query = compile_query(text)
    run = StreamJob(text=text, query=query, master=master, batch_events=batch_events)
    with tempfile.TemporaryDirectory(prefix="lace-bench-stream-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        source = open_event_file(bench_csv(n))
        prepare(run, work, accepted_events(source.events(), query, 0, lambda i, r: None))
        t1 = time.perf_counter()
        results = run_detection(run, work)
        t2 = time.perf_counter()
        with MatchWriter(work / "out.jsonl") as sink:
            sink.write(list(ordered_matches(results, query)))
        matches = sink.written
        t3 = time.perf_counter()
    durations = [p["durationMs"].get("triggerExecution", 0) / 1000 for p in J.progress]
    batches, fixed = batch_seconds(J.progress)
    last = J.progress[-1]["stateOperators"][0] if J.progress and J.progress[-1].get("stateOperators") else {}
    peak_state = max((p["stateOperators"][0].get("memoryUsedBytes", 0) for p in J.progress if p.get("stateOperators")),
                     default=0)
    pattern, strategy, window, _ = CASES[case]
    expected = EXPECTED[(pattern, strategy, window)].get(n)
    return {
        "case": f"lace stream {case}", "master": master, "n": n, "matches": matches,
        "exact": expected is None or matches == expected, "expected": expected,
        "micro_batches": len(J.progress), "data_batches": len(batches), "batch_events": batch_events,
        "prepare_s": round(t1 - t0, 2), "detect_s": round(t2 - t1, 2), "write_s": round(t3 - t2, 2),
        "events_per_s": int(n / (t2 - t1)), "events_per_s_end_to_end": int(n / (t3 - t0)),
        "batch_p50_s": round(_pct(durations, 0.5), 2), "batch_p99_s": round(_pct(durations, 0.99), 2),
        "empty_batch_s": round(_pct(fixed, 0.5), 2),
        "state_peak_bytes": peak_state, "state_rows_after": last.get("numRowsTotal"),
    }


def run_master(master: str, cases: list[str], n: int, batch_events: int) -> list[dict]:
    """Start Spark with ``master``, warm it up, run ``cases``; one result per case."""
    from stream.job import spark_session

    t0 = time.perf_counter()
    spark_session(master)
    started = time.perf_counter() - t0
    t1 = time.perf_counter()
    run_stream_case("P1-any", 10_000, master, 10_000)  # warm-up: the session's first streaming query
    warm = time.perf_counter() - t1
    out = []
    for case in cases:
        r = run_stream_case(case, n, master, batch_events)
        r.update(spark_start_s=round(started, 1), warm_up_s=round(warm, 1))
        out.append(r)
        print(json.dumps(r), flush=True)
    return out


def per_master(module: str, masters: list[str], args: list[str]) -> list[dict]:
    """``python -m module --one-master M *args`` for each master M in turn (one process, so one Spark session, per
    master); the JSON objects their lines print, echoed as they come.

    Raises
    ------
    SystemExit
        When a child fails (its stderr's tail written first).
    """
    results = []
    for master in masters:
        proc = subprocess.run([sys.executable, "-m", module, "--one-master", master, *args],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit(f"{module} --one-master {master} failed (exit {proc.returncode})")
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                results.append(json.loads(line))
                print(line, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000, help="events of the seed-42 stream")
    ap.add_argument("--cases", default=",".join(CASE_NAMES))
    ap.add_argument("--masters", default="local[1],local[2]")
    ap.add_argument("--batch-events", type=int, default=50_000, help="events per micro-batch")
    ap.add_argument("--no-lace-match", action="store_true")
    ap.add_argument("--one-master", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    cases = a.cases.split(",")
    if a.one_master:
        run_master(a.one_master, cases, a.n, a.batch_events)
        return 0
    results = per_master("bench.stream", a.masters.split(","),
                         ["--cases", a.cases, "--n", str(a.n), "--batch-events", str(a.batch_events)])
    if not a.no_lace_match:
        for case in cases:
            r = run_lace_match(case, a.n, repeat=1)
            results.append(r)
            print(json.dumps(r), flush=True)
    print(f"\n{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, n={a.n}, batch_events={a.batch_events}\n")
    print("| run | master | matches | exact | events/s (detect) | events/s (end to end) | batch p50 / p99 s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['case']} | {r.get('master', '-')} | {r['matches']:,} | {r['exact']} | "
              f"{r['events_per_s']:,} | {r.get('events_per_s_end_to_end', r['events_per_s']):,} | "
              f"{r.get('batch_p50_s', '-')} / {r.get('batch_p99_s', '-')} |")
    return 0 if all(r["exact"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
