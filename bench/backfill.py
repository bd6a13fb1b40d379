"""Backfill benchmark (issue 7): the Aarhus congestion query over the whole traffic table on Spark.

    python -m bench.backfill                 # local[2] vs local[1] vs single-process lace match
    python -m bench.backfill --rows 500000   # a prefix of the table (quick check)
    python -m bench.backfill --masters 'local[2]' --readers native,filelist --skip-match --docs   # the two readers

Steps:

1. the whole Aarhus traffic table (7,137,361 readings, ``shared/data/aarhus``) is archived once
   with :class:`archive.writer.ArchiveWriter` (Delta, partitioned by UTC date, 50k-event commits)
   under ``bench/.cache/backfill/`` (``--rebuild`` to redo it), with the attributes of
   :func:`bench.engine.aarhus_batches` (``ndt_kmh`` joined from the sensor metadata) and the same ids;
   the same events are written once as a CSV file for ``lace match``;
2. ``lace backfill``'s core (:func:`archive.backfill.run_backfill`) runs :data:`bench.engine.CONGESTION`
   over the whole range, in a fresh process per Spark master (``local[2]``, then ``local[1]``, each
   pinned to that many CPUs): wall time of the backfill alone (the session is started and warmed
   first, and its start is reported), then of the same backfill again in the same session ("warm":
   the JVM's JIT and the Python workers are ready, as in a long-running service);
3. ``lace match`` runs the same query over the CSV file in one process (wall time, end to end);
4. every run's matches are compared with ``lace match``'s (identical lines, as sets).

Prints a JSON summary and, with ``--docs``, a Markdown table for docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.engine import AARHUS, CONGESTION

CACHE = Path(__file__).resolve().parent / ".cache" / "backfill"


def _load_avg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def build(rows: int | None, rebuild: bool) -> tuple[Path, Path, int, int, int]:
    """Archive (and write as CSV) the first ``rows`` readings; returns (archive, csv, n, min ts, max ts)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from archive.writer import ArchiveWriter
    from engine.event_type import EventType

    tag = "all" if rows is None else str(rows)
    root, csv_path, meta_path = CACHE / f"archive-{tag}", CACHE / f"events-{tag}.csv", CACHE / f"meta-{tag}.json"
    if meta_path.exists() and not rebuild:
        meta = json.loads(meta_path.read_text())
        return root, csv_path, meta["n"], meta["lo"], meta["hi"]
    shutil.rmtree(root, ignore_errors=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    ndt: dict[str, float] = {}
    with open(AARHUS / "traffic_sensors.csv", newline="") as f:
        for row in csv.DictReader(f):
            ndt[row["REPORT_ID"]] = float(row["NDT_IN_KMH"])
    table = pq.read_table(AARHUS / "aarhus_traffic_2014-08_09.parquet",
                          columns=["key", "ts_ms", "avg_speed", "vehicle_count"])
    if rows is not None:
        table = table.slice(0, rows)
    n = table.num_rows
    keys = table.column("key").to_pylist()
    events = pa.table({
        "id": pa.array(range(1, n + 1), pa.int64()),
        "ts": pc.multiply(table.column("ts_ms").cast(pa.int64()), 1000),
        "key": pa.array([int(k) for k in keys], pa.int64()),  # int, as lace match types the CSV cell
        "avg_speed": table.column("avg_speed").cast(pa.int64()),
        "vehicle_count": table.column("vehicle_count").cast(pa.int64()),
        "ndt_kmh": pa.array([ndt.get(k) for k in keys], pa.float64()),
    })
    etype = EventType("traffic", {"key": "int", "avg_speed": "int", "vehicle_count": "int", "ndt_kmh": "float"},
                      partition_key="key")
    t0 = time.perf_counter()
    with ArchiveWriter(root, types=[etype], flush_rows=50_000, flush_age_s=3600.0, fsync=False) as writer:
        for start in range(0, n, 100_000):
            writer.append_table("traffic", events.slice(start, 100_000))
        writer.flush()
    ingest_s = time.perf_counter() - t0
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "type", "ts", "key", "avg_speed", "vehicle_count", "ndt_kmh"])
        cols = [events.column(c).to_pylist() for c in ("id", "ts", "key", "avg_speed", "vehicle_count", "ndt_kmh")]
        for i, ts_us, k, s, c, d in zip(*cols):
            # lace match reads numeric ts as epoch ms: write ISO-8601 to keep the microseconds exact
            w.writerow([i, "traffic", _iso(ts_us), k, s, c, "" if d is None else repr(d)])
    ts = events.column("ts")
    lo, hi = pc.min(ts).as_py(), pc.max(ts).as_py() + 1
    meta_path.write_text(json.dumps({"n": n, "lo": lo, "hi": hi, "ingest_s": ingest_s}))
    return root, csv_path, n, lo, hi


def _iso(ts_us: int) -> str:
    from datetime import UTC, datetime, timedelta

    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=ts_us)).isoformat()


def spark_run(root: Path, lo: int, hi: int, master: str, out: Path, *, pin: bool, reader: str = "native") -> dict:
    """One backfill in a fresh process with ``master`` (the session is started before the clock starts).

    With ``pin``, ``local[N]`` runs under ``taskset`` on CPUs 0..N-1, the JVM and the Python workers
    included: ``local[1]`` alone would still let the JVM's scan, shuffle and GC threads use the other core.
    """
    env = {**os.environ, "LACE_SPARK_MASTER": master}
    if reader == "filelist":
        env["LACE_DELTA_JAR"] = "none"  # no connector in that process: the filelist reader, as deployed without Maven
    cmd = [sys.executable, "-m", "bench.backfill", "--worker", str(root), str(lo), str(hi), str(out)]
    cores = master[len("local["):-1] if master.startswith("local[") else ""
    if pin and cores.isdigit() and int(cores) <= (os.cpu_count() or 1) and shutil.which("taskset"):
        cmd = ["taskset", "-c", f"0-{int(cores) - 1}", *cmd]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"backfill on {master} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def worker(root: str, lo: int, hi: int, out: str) -> None:
    from archive.backfill import run_backfill
    from archive.spark import get_spark, native_delta_available, timings

    t0 = time.perf_counter()
    spark = get_spark()
    start_s = time.perf_counter() - t0
    load0 = _load_avg()
    cpu0 = os.times()
    result = run_backfill(root, CONGESTION, lo, hi, spark=spark, write_results=False)
    cpu1 = os.times()
    Path(out).write_text("".join(line + "\n" for line in result.lines))
    again = run_backfill(root, CONGESTION, lo, hi, spark=spark, write_results=False)
    assert again.lines == result.lines
    print(json.dumps({
        "master": spark.sparkContext.master,
        "reader": "native" if native_delta_available(spark) else "filelist",
        "seconds": round(result.elapsed_s, 1),
        "warm_seconds": round(again.elapsed_s, 1),
        "events": result.events_scanned,
        "events_per_s": int(result.events_scanned / result.elapsed_s),
        "warm_events_per_s": int(again.events_scanned / again.elapsed_s),
        "matches": len(result.lines),
        "spark_start_s": round(start_s, 1),
        "spark_timings": {k: round(v, 1) for k, v in timings().items()},
        "driver_cpu_s": round((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system), 1),
        "load_avg": f"{load0} -> {_load_avg()}",
    }))


def lace_match(csv_path: Path, out: Path) -> dict:
    qfile = CACHE / "congestion.lql"
    qfile.write_text(CONGESTION)
    lace = Path(sys.executable).with_name("lace")
    load0 = _load_avg()
    t0 = time.perf_counter()
    subprocess.run([str(lace), "match", "--query", str(qfile), "--events", str(csv_path), "--out", str(out)],
                   check=True)
    seconds = time.perf_counter() - t0
    return {"seconds": round(seconds, 1), "matches": sum(1 for _ in out.open()),
            "load_avg": f"{load0} -> {_load_avg()}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=None, help="first N readings only (default: the whole table)")
    ap.add_argument("--masters", default="local[2],local[1]", help="Spark masters to compare")
    ap.add_argument("--rebuild", action="store_true", help="rebuild the cached archive and CSV")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="do not pin local[N] to N CPUs with taskset (default: pinned)")
    ap.add_argument("--readers", default="native",
                    help="archive readers to compare, e.g. native,filelist (filelist: LACE_DELTA_JAR=none)")
    ap.add_argument("--skip-match", action="store_true", help="do not run the single-process lace match")
    ap.add_argument("--docs", action="store_true", help="also print a Markdown table")
    ap.add_argument("--worker", nargs=4, metavar=("ROOT", "LO", "HI", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        root, lo, hi, out = a.worker
        worker(root, int(lo), int(hi), out)
        return 0
    root, csv_path, n, lo, hi = build(a.rows, a.rebuild)
    summary: dict = {"events": n, "machine": f"{platform.machine()}, {os.cpu_count()} cores", "pinned": a.pin,
                     "date": time.strftime("%Y-%m-%d"), "runs": {}}
    outputs = {}
    readers = a.readers.split(",")
    for master in a.masters.split(","):
        for reader in readers:
            name = master if len(readers) == 1 else f"{master} {reader}"
            out = CACHE / f"out-{master.replace('[', '').replace(']', '')}-{reader}.jsonl"
            summary["runs"][name] = spark_run(root, lo, hi, master, out, pin=a.pin, reader=reader)
            outputs[name] = out
            print(name, summary["runs"][name], file=sys.stderr)
    if not a.skip_match:
        out = CACHE / "out-lace-match.jsonl"
        summary["runs"]["lace match"] = lace_match(csv_path, out)
        outputs["lace match"] = out
        print("lace match", summary["runs"]["lace match"], file=sys.stderr)
    reference = sorted(next(iter(outputs.values())).read_text().splitlines())
    summary["identical"] = all(sorted(p.read_text().splitlines()) == reference for p in outputs.values())
    runs = summary["runs"]
    if "local[2]" in runs and "local[1]" in runs:
        summary["speedup_2_over_1"] = round(runs["local[1]"]["seconds"] / runs["local[2]"]["seconds"], 2)
        summary["warm_speedup_2_over_1"] = round(runs["local[1]"]["warm_seconds"] / runs["local[2]"]["warm_seconds"], 2)
    if "local[2]" in runs and "lace match" in runs:
        summary["speedup_2_over_lace_match"] = round(runs["lace match"]["seconds"] / runs["local[2]"]["seconds"], 2)
    print(json.dumps(summary, indent=2))
    if a.docs:
        print("\n| run | wall s | events/s | warm wall s | warm events/s | matches | Spark start s | load avg |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, r in runs.items():
            eps = r.get("events_per_s", int(n / r["seconds"]))
            warm = (f"{r['warm_seconds']} | {r['warm_events_per_s']:,}" if "warm_seconds" in r else " | ")
            print(f"| {name} | {r['seconds']} | {eps:,} | {warm} | {r['matches']:,} | {r.get('spark_start_s', '')} "
                  f"| {r['load_avg']} |")
    return 0 if summary["identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
