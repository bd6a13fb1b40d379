"""Archive benchmark (issue 3): the whole Aarhus traffic table through the archive.

    python -m bench.archive [--rows N] [--batch 10000] [--lookups 50] [--root DIR] [--keep]
    LACE_DELTA_JAR=none python -m bench.archive ...   # the filelist reader (default: native, with the connector)

Measures, on this machine:

1. ingest rate into the archive: ``ArchiveWriter.append_table`` in batches (WAL with
   fsync, recent buffer, 50k-event delta-rs appends), events/s including the last flush;
2. Spark session start and warm-up time (one session for the whole process);
3. one key + range lookup through the extractor, warm (median);
4. the same number of key + range lookups as ONE batched extractor call vs one call each
   (the SLLAA argument), on the table as ingested and after compacting the closed days
   z-ordered by key;
5. driver JVM memory (heap, and the JVM process's resident set).

Results print as a markdown section for docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from archive.schema import EventType

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "aarhus" / "aarhus_traffic_2014-08_09.parquet"
TRAFFIC = EventType(
    "traffic",
    {
        "key": "string",
        "avg_speed": "int",
        "vehicle_count": "int",
        "avg_measured_time": "int",
        "median_measured_time": "int",
        "status": "string",
        "report_id": "int",
    },
    key="key",
)
HOUR_US = 3_600_000_000


def load_events(path: Path, rows: int | None) -> pa.Table:
    """The traffic table as events: ``id`` = row number in ts order, ``ts`` from ``ts_ms`` (int us)."""
    cols = ["ts_ms", *TRAFFIC.attributes]
    table = pq.read_table(path, columns=cols)
    if rows is not None:
        table = table.slice(0, rows)
    ts = pc.multiply(table.column("ts_ms"), 1_000)
    out = {"id": pa.array(range(table.num_rows), pa.int64()), "ts": ts}
    for attr in TRAFFIC.attributes:
        out[attr] = table.column(attr).cast(pa.string() if TRAFFIC.attributes[attr] == "string" else pa.int64())
    return pa.table(out).combine_chunks()


def ingest(root: Path, events: pa.Table, *, batch: int) -> dict[str, float]:
    from archive.writer import ArchiveWriter

    t0 = time.perf_counter()
    with ArchiveWriter(root, types=[TRAFFIC], flush_rows=50_000, flush_age_s=5.0) as writer:
        for start in range(0, events.num_rows, batch):
            writer.append_table("traffic", events.slice(start, batch))
        writer.flush()
        stats = writer.stats()
    elapsed = time.perf_counter() - t0
    n = events.num_rows
    return {"events": n, "seconds": elapsed, "rate": n / elapsed, "commits": stats["commits"]}


def requests(events: pa.Table, n: int, *, seed: int, width_us: int) -> list[tuple[str, int, int]]:
    """``n`` random (key, lo, hi) lookups of ``width_us`` inside the data's time span."""
    rng = random.Random(seed)
    keys = sorted(set(events.column("key").to_pylist()[:: max(1, events.num_rows // 20_000)]))
    lo_all, hi_all = pc.min(events.column("ts")).as_py(), pc.max(events.column("ts")).as_py()
    out = []
    for _ in range(n):
        lo = rng.randrange(lo_all, max(lo_all + 1, hi_all - width_us))
        out.append((rng.choice(keys), lo, lo + width_us))
    return out


def lookups(extractor, reqs: list[tuple[str, int, int]], *, repeat: int) -> dict[str, float]:
    """Median seconds of one lookup (warm), of ``len(reqs)`` lookups batched into one call, and one call each."""
    k, lo, hi = reqs[0]
    for _ in range(2):
        extractor.extract("traffic", [k], [(lo, hi)])
    single = []
    for key, lo, hi in reqs[:repeat]:
        t0 = time.perf_counter()
        extractor.extract("traffic", [key], [(lo, hi)])
        single.append(time.perf_counter() - t0)
    by_key: dict[str, list[tuple[int, int]]] = {}
    for key, lo, hi in reqs:
        by_key.setdefault(key, []).append((lo, hi))
    batched = []
    for _ in range(3):
        t0 = time.perf_counter()
        together = extractor.extract("traffic", None, by_key)
        batched.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    apart = [extractor.extract("traffic", [key], [(lo, hi)]) for key, lo, hi in reqs]
    separate = time.perf_counter() - t0
    ids_apart = sorted(i for t in apart for i in t.column("id").to_pylist())
    assert sorted(together.column("id").to_pylist()) == ids_apart, "batched and separate lookups disagree"
    return {
        "single_s": statistics.median(single),
        "batched_s": statistics.median(batched),
        "separate_s": separate,
        "rows": together.num_rows,
        "ratio": separate / statistics.median(batched),
    }


def jvm_rss_bytes(spark) -> dict[str, int]:
    pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            name, value = line.split(":")
            out[name] = int(value.split()[0]) * 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--rows", type=int, default=None, help="first N events only (default: all)")
    ap.add_argument("--batch", type=int, default=10_000, help="events per append call")
    ap.add_argument("--lookups", type=int, default=50)
    ap.add_argument("--width-h", type=float, default=6.0, help="hours per lookup range")
    ap.add_argument("--root", type=Path, default=None, help="archive directory (default: a temp dir, removed)")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--no-compact", action="store_true", help="skip the compacted-layout lookups")
    ap.add_argument("--target-kib", type=int, default=256, help="compaction target file size, KiB (z-ordered by key)")
    args = ap.parse_args()

    root = args.root or Path(tempfile.mkdtemp(prefix="lace-bench-archive-"))
    if root.exists() and any(root.iterdir()):
        raise SystemExit(f"{root} is not empty")
    load = os.getloadavg()
    events = load_events(args.data, args.rows)
    print(f"loaded {events.num_rows:,} events; ingesting into {root}", flush=True)
    try:
        ing = ingest(root, events, batch=args.batch)
        print(f"ingest: {ing['rate']:,.0f} events/s ({ing['seconds']:.1f} s, {ing['commits']} commits)", flush=True)

        from archive.extractor import Extractor
        from archive.maintenance import compact
        from archive.reader import ArchiveReader
        from archive.spark import SparkSettings, get_spark, jvm_memory, timings

        t0 = time.perf_counter()
        spark = get_spark(SparkSettings.from_env())
        start_total = time.perf_counter() - t0
        tm = timings()
        print(f"spark: start {tm['start_s']:.1f} s, warm-up {tm['warm_up_s']:.1f} s", flush=True)
        extractor = Extractor(ArchiveReader(root, spark=spark))
        print(f"archive reader: {extractor.reader.backend} (LACE_DELTA_JAR=none for filelist)", flush=True)
        reqs = requests(events, args.lookups, seed=7, width_us=int(args.width_h * HOUR_US))
        files_before = len(extractor.reader.files("traffic", version=extractor.reader.snapshot()["traffic"]))
        as_ingested = lookups(extractor, reqs, repeat=10)
        print(f"lookups as ingested ({files_before} files): {as_ingested}", flush=True)
        compacted = None
        if not args.no_compact:
            t0 = time.perf_counter()
            compact(root, before="2100-01-01", z_order=True, target_size=args.target_kib * 1024)
            compact_s = time.perf_counter() - t0
            files_after = len(extractor.reader.files("traffic", version=extractor.reader.snapshot()["traffic"]))
            compacted = lookups(extractor, reqs, repeat=10)
            print(f"compaction {compact_s:.1f} s -> {files_after} files; lookups: {compacted}", flush=True)
        heap = jvm_memory(spark)
        rss = jvm_rss_bytes(spark)
    finally:
        if not args.keep and args.root is None:
            shutil.rmtree(root, ignore_errors=True)

    gib = 1 << 30
    lines = [
        "## Archive (bench/archive.py)",
        "",
        f"`python -m bench.archive{' --rows ' + str(args.rows) if args.rows else ''}` on "
        f"{datetime.now(UTC):%Y-%m-%d}, {os.cpu_count()} cores, {platform.machine()}, "
        f"Python {platform.python_version()}, pyspark 4.2.0 local[*], deltalake 1.6.6, "
        f"**{extractor.reader.backend}** archive reader; "
        f"load average at start {load[0]:.1f} (the machine is shared: expect ±2x).",
        f"Data: Aarhus traffic Aug-Sep 2014, {ing['events']:,} events, 449 keys; lookups: {args.lookups} random "
        f"(key, {args.width_h:g} h range) pairs.",
        "",
        "| measure | result | target |",
        "| --- | --- | --- |",
        f"| ingest (WAL fsync + buffer + 50k delta-rs appends), {args.batch:,}-event appends "
        f"| {ing['rate']:,.0f} events/s ({ing['seconds']:.1f} s, {ing['commits']} commits) | ≥ 100,000 events/s |",
        f"| Spark session start / warm-up | {tm['start_s']:.1f} s / {tm['warm_up_s']:.1f} s "
        f"(total {start_total:.1f} s) | once per process |",
    ]
    layouts = [("as ingested", files_before, as_ingested)]
    if compacted is not None:
        layouts.append((f"compacted, z-ordered by key, {args.target_kib} KiB files", files_after, compacted))
    for name, files, r in layouts:
        lines += [
            f"| one key+range lookup, warm, median ({name}, {files} files) | {r['single_s'] * 1000:.0f} ms | |",
            f"| {args.lookups} lookups as one batched call ({name}) | {r['batched_s']:.2f} s ({r['rows']:,} rows) | |",
            f"| {args.lookups} lookups as {args.lookups} calls ({name}) | {r['separate_s']:.2f} s "
            f"| batched ≥ 5x faster: **{r['ratio']:.1f}x** |",
        ]
    if compacted is not None:
        lines.append(f"| compaction of all days, z-ordered by key, {args.target_kib} KiB files | {compact_s:.1f} s | |")
    lines.append(
        f"| driver JVM memory | heap used {heap['used'] / gib:.2f} GiB of {heap['max'] / gib:.2f} GiB max; "
        f"RSS {rss.get('VmRSS', 0) / gib:.2f} GiB (peak {rss.get('VmHWM', 0) / gib:.2f} GiB) | |"
    )
    print("\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
