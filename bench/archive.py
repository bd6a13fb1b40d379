"""Archive benchmark (issue 3): the whole Aarhus traffic table through the archive.

    python -m bench.archive [--rows N] [--batch 10000] [--lookups 50] [--root DIR] [--keep] [--reuse]
    LACE_DELTA_JAR=none python -m bench.archive ...   # the filelist reader (default: native, with the connector)
    LACE_ARCHIVE_LOCAL_READ_MB=0 python -m bench.archive ...   # every lookup a Spark job (issue 25's "before")
    PYTHONPATH=../main python bench/archive.py ...    # this script over another checkout's archive package

Measures, on this machine:

1. ingest rate into the archive: ``ArchiveWriter.append_table`` in batches (WAL with
   fsync, recent buffer, 50k-event delta-rs appends), events/s including the last flush;
2. Spark session start and warm-up time (one session for the whole process);
3. one key + range lookup through the extractor, warm (median);
4. the same number of key + range lookups as ONE batched extractor call vs one call each
   (the SLLAA argument), on the table as ingested and after compacting the closed days
   z-ordered by key;
5. the fixed cost of one lookup (issue 25): wall, driver (Python process) CPU and JVM CPU, medians over
   ``--repeat`` lookups of each shape: one key x 6 h; the 449 keys x the same 10 min of one day (a
   subwindow of SLLAA); the 449 keys x a random hour each within one day; the 449 keys x the whole day;
6. with ``--breakdown``, where one lookup's time goes, step by step, on the Spark path and without Spark;
7. driver JVM memory (heap, and the JVM process's resident set).

``--reuse`` reads an archive ``--root`` a previous ``--keep`` run left (no ingest), so two checkouts can be
compared back to back on the same files (run with ``--no-compact`` then, or on a copy: compaction rewrites it).

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

from engine.event_type import EventType

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
    partition_key="key",
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


SHAPES = ("1 key x 6 h", "all keys x 10 min", "all keys x 1 h each", "all keys x 1 day")
DAY_US = 24 * HOUR_US


def shape_request(shape: str, keys: list[str], day_us: int, rng: random.Random) -> dict[str, list[tuple[int, int]]]:
    """One lookup of ``shape`` (see :data:`SHAPES`) within the UTC day starting at ``day_us``."""
    if shape == SHAPES[0]:
        lo = day_us + rng.randrange(DAY_US - 6 * HOUR_US)
        return {rng.choice(keys): [(lo, lo + 6 * HOUR_US)]}
    if shape == SHAPES[1]:
        lo = day_us + rng.randrange(DAY_US - HOUR_US)
        return {k: [(lo, lo + 10 * 60_000_000)] for k in keys}
    if shape == SHAPES[2]:
        out = {}
        for k in keys:
            lo = day_us + rng.randrange(DAY_US - HOUR_US)
            out[k] = [(lo, lo + HOUR_US)]
        return out
    return {k: [(day_us, day_us + DAY_US)] for k in keys}


class CpuClock:
    """Wall, this process's CPU and the Spark driver JVM's CPU (local mode: a child process), in seconds."""

    def __init__(self, spark) -> None:
        self.jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
        self.tick = os.sysconf("SC_CLK_TCK")

    def jvm_s(self) -> float:
        fields = Path(f"/proc/{self.jvm_pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.tick

    def now(self) -> tuple[float, float, float]:
        return time.perf_counter(), time.process_time(), self.jvm_s()

    def since(self, start: tuple[float, float, float]) -> tuple[float, float, float]:
        now = self.now()
        return now[0] - start[0], now[1] - start[1], now[2] - start[2]


def event_days(events: pa.Table) -> list[int]:
    """The UTC days (start, int us) of the data, without the first and the last (partial ones)."""
    lo, hi = pc.min(events.column("ts")).as_py(), pc.max(events.column("ts")).as_py()
    first, last = lo // DAY_US + 1, hi // DAY_US - 1
    return [d * DAY_US for d in range(first, max(first + 1, last))]


def fixed_costs(extractor, clock: CpuClock, keys: list[str], days: list[int], *, repeat: int) -> dict[str, dict]:
    """Median wall / driver CPU / JVM CPU (ms) and rows of one lookup of each shape, warm (two lookups first)."""
    out = {}
    for shape in SHAPES:
        rng = random.Random(11)
        for i in range(2):
            extractor.extract("traffic", None, shape_request(shape, keys, days[-1 - i % len(days)], rng))
        costs, rows = [], []
        for i in range(repeat):
            req = shape_request(shape, keys, days[(7 * i) % len(days)], rng)
            start = clock.now()
            rows.append(extractor.extract("traffic", None, req).num_rows)
            costs.append(clock.since(start))
        out[shape] = {
            "wall_ms": statistics.median(c[0] for c in costs) * 1000,
            "driver_ms": statistics.median(c[1] for c in costs) * 1000,
            "jvm_ms": statistics.median(c[2] for c in costs) * 1000,
            "rows": statistics.median(rows),
            "load": os.getloadavg()[0],
        }
        print(f"  {shape}: {out[shape]}", flush=True)
    return out


def breakdown(extractor, clock: CpuClock, keys: list[str], days: list[int], *, repeat: int) -> list[tuple[str, ...]]:
    """Where one lookup (all keys x 10 min) goes: each step's median wall / driver CPU / JVM CPU, ms.

    The Spark path: pin the versions, select the files, the DataFrame over them, the SQL (temporary view,
    parse, analysis), optimization and physical planning, execution and collection (``toArrow``: the jobs,
    code generation, Arrow batches to Python). Without Spark (when the extractor has ``read_arrow``): file
    selection and Arrow read, and the conversion to the output shape.
    """
    from archive.schema import conform, output_schema

    reader = extractor.reader
    etype = reader.types(["traffic"])["traffic"]
    out_schema = output_schema([etype])
    steps: dict[str, list[tuple[float, float, float]]] = {}

    def step(name: str, fn, *args, **kw):
        start = clock.now()
        value = fn(*args, **kw)
        steps.setdefault(name, []).append(clock.since(start))
        return value

    rng = random.Random(5)
    for i in range(repeat + 2):
        req = shape_request(SHAPES[1], keys, days[(7 * i) % len(days)], rng)
        pins = step("pin the table version (delta-rs)", reader.pin, ["traffic"], None)
        version = pins["traffic"]
        step("select files (Spark path: filelist only)", reader.files, "traffic", version=version, request=req)
        step("DataFrame over the files / the Delta table", reader.scan, "traffic", version=version, request=req)
        frame = extractor.frame([etype], req, version=pins)
        df = step("temp view + SQL parse + analysis", frame.__enter__)
        try:
            step("optimize + physical plan", df._jdf.queryExecution().executedPlan)
            table = step("execute + collect (toArrow)", df.toArrow)
        finally:
            step("drop the temp view", frame.__exit__, None, None, None)
        step("to the output shape", conform, table, out_schema)
        if hasattr(reader, "read_arrow"):
            step("without Spark: select files + Arrow read + exact filter",
                 reader.read_arrow, "traffic", version=version, request=req)
    rows = []
    for name, costs in steps.items():
        costs = costs[2:]  # warm
        med = [statistics.median(c[j] for c in costs) * 1000 for j in range(3)]
        rows.append((name, *(f"{m:.0f}" for m in med)))
    return rows


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
    ap.add_argument("--lookups", type=int, default=50, help="random (key, range) lookups batched vs apart (0: skip)")
    ap.add_argument("--width-h", type=float, default=6.0, help="hours per lookup range")
    ap.add_argument("--repeat", type=int, default=15, help="lookups per shape for the fixed cost (0: skip)")
    ap.add_argument("--breakdown", action="store_true", help="time one lookup's steps")
    ap.add_argument("--root", type=Path, default=None, help="archive directory (default: a temp dir, removed)")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--reuse", action="store_true", help="read the archive already at --root (no ingest)")
    ap.add_argument("--no-compact", action="store_true", help="skip the compacted-layout lookups")
    ap.add_argument("--target-kib", type=int, default=256, help="compaction target file size, KiB (z-ordered by key)")
    args = ap.parse_args()

    root = args.root or Path(tempfile.mkdtemp(prefix="lace-bench-archive-"))
    if args.reuse and args.root is None:
        raise SystemExit("--reuse needs --root")
    if not args.reuse and root.exists() and any(root.iterdir()):
        raise SystemExit(f"{root} is not empty")
    load = os.getloadavg()
    events = load_events(args.data, args.rows)
    keys = sorted(set(events.column("key").to_pylist()))
    days = event_days(events)
    ing = None
    layouts = []
    try:
        if not args.reuse:
            print(f"loaded {events.num_rows:,} events; ingesting into {root}", flush=True)
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
        clock = CpuClock(spark)
        local = getattr(extractor, "local_read_bytes", 0)
        path = f"lookups up to {local / (1 << 20):g} MiB read without Spark" if local else "every lookup a Spark job"
        print(f"archive reader: {extractor.reader.backend}; {path}", flush=True)
        reqs = requests(events, args.lookups, seed=7, width_us=int(args.width_h * HOUR_US))

        def measure(name: str) -> None:
            files = len(extractor.reader.files("traffic", version=extractor.reader.snapshot()["traffic"]))
            print(f"{name} ({files} files):", flush=True)
            costs = fixed_costs(extractor, clock, keys, days, repeat=args.repeat) if args.repeat else {}
            calls = lookups(extractor, reqs, repeat=10) if args.lookups else None
            print(f"  lookups: {calls}", flush=True)
            steps = breakdown(extractor, clock, keys, days, repeat=args.repeat or 10) if args.breakdown else []
            layouts.append((name, files, costs, calls, steps))

        measure("as ingested")
        compact_s = None
        if not args.no_compact:
            t0 = time.perf_counter()
            compact(root, before="2100-01-01", z_order=True, target_size=args.target_kib * 1024)
            compact_s = time.perf_counter() - t0
            measure(f"compacted, z-ordered by key, {args.target_kib} KiB files")
        heap = jvm_memory(spark)
        rss = jvm_rss_bytes(spark)
    finally:
        if not args.keep and args.root is None:
            shutil.rmtree(root, ignore_errors=True)
    load_end = os.getloadavg()

    gib = 1 << 30
    lines = [
        "## Archive (bench/archive.py)",
        "",
        f"`python -m bench.archive{' --rows ' + str(args.rows) if args.rows else ''}` on "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, {platform.machine()}, "
        f"Python {platform.python_version()}, pyspark 4.2.0 local[*], deltalake 1.6.6, "
        f"**{extractor.reader.backend}** archive reader, {path}; load average (1/5/15 min) "
        f"{' '.join(f'{x:.1f}' for x in load)} at start, {' '.join(f'{x:.1f}' for x in load_end)} at the end.",
        f"Data: Aarhus traffic Aug-Sep 2014, {events.num_rows:,} events, {len(keys)} keys; lookups: {args.lookups} "
        f"random (key, {args.width_h:g} h range) pairs.",
        "",
        "| measure | result | target |",
        "| --- | --- | --- |",
    ]
    if ing is not None:
        lines.append(
            f"| ingest (WAL fsync + buffer + 50k delta-rs appends), {args.batch:,}-event appends "
            f"| {ing['rate']:,.0f} events/s ({ing['seconds']:.1f} s, {ing['commits']} commits) | ≥ 100,000 events/s |"
        )
    lines.append(
        f"| Spark session start / warm-up | {tm['start_s']:.1f} s / {tm['warm_up_s']:.1f} s "
        f"(total {start_total:.1f} s) | once per process |"
    )
    for name, files, costs, r, _ in layouts:
        for shape, c in costs.items():
            lines.append(
                f"| lookup {shape}, warm, median of {args.repeat} ({name}, {files} files): wall / driver CPU / JVM CPU "
                f"| **{c['wall_ms']:.0f} ms** / {c['driver_ms']:.0f} ms / {c['jvm_ms']:.0f} ms ({c['rows']:,.0f} rows) "
                f"| {'≤ 150 ms wall' if shape != SHAPES[0] else ''} |"
            )
        if r is not None:
            lines += [
                f"| one key+range lookup, warm, median ({name}, {files} files) | {r['single_s'] * 1000:.0f} ms | |",
                f"| {args.lookups} lookups as one batched call ({name}) | {r['batched_s']:.2f} s ({r['rows']:,} rows) "
                "| |",
                f"| {args.lookups} lookups as {args.lookups} calls ({name}) | {r['separate_s']:.2f} s "
                f"| batched ≥ 5x faster: **{r['ratio']:.1f}x** |",
            ]
    if compact_s is not None:
        lines.append(f"| compaction of all days, z-ordered by key, {args.target_kib} KiB files | {compact_s:.1f} s | |")
    lines.append(
        f"| driver JVM memory | heap used {heap['used'] / gib:.2f} GiB of {heap['max'] / gib:.2f} GiB max; "
        f"RSS {rss.get('VmRSS', 0) / gib:.2f} GiB (peak {rss.get('VmHWM', 0) / gib:.2f} GiB) | |"
    )
    for name, files, _, _, steps in layouts:
        if steps:
            lines += [
                "",
                f"One lookup of {SHAPES[1]}, step by step ({name}, {files} files; medians, ms):",
                "",
                "| step | wall | driver CPU | JVM CPU |",
                "| --- | --- | --- | --- |",
                *(f"| {' | '.join(row)} |" for row in steps),
            ]
    print("\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
