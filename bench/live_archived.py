"""ALAA, LLAA, OLLAA and SLLAA: experiments 1-3 of 001_e24f905c15fdf08b.txt (section 6), plus Aarhus.

Workloads (001 Table 2 parameters):

- ``rfid``: the discrete RFID stream of ``bench/stpm.py`` (``N_E`` types, ``M_Ratio``,
  ``p(B | A, Δt)``, ``N_S``; objects pass readers A, B, C, D again and again). The query: an object
  passes C then D now; did it pass A then B within the last ``ΔR`` (LOOKBACK)?
- ``sel``: one stream of readings ``T(key, v)``; ``P_L = SEQ(T l)`` (every reading: ``Sel_PL = 1``)
  and ``P_A = SEQ(T a) WHERE a.v < θ`` (``Sel_PA = θ``), joined on the key (experiment 2).
- ``aarhus``: the bundled Aarhus traffic slice (40 road segments, 14 days, 134,770 readings): a
  segment congested now (two readings) joined with the same segment congested in the previous 7
  days at the same hour of day (the bench adds ``hour``, the UTC hour of each reading).

Experiments: (1) ALAA vs LLAA CPU over N_S; (2) LLAA vs OLLAA while Sel_PA goes 0.05-1 with Sel_PL
= 1; (3) LLAA vs SLLAA across tolerances T_L (subwindow sizes) at M_Ratio = 1, in memory and,
end to end, on the Delta archive read through Spark (local[2]). Every run of one workload must give
the same results (checked). CPU is ``time.process_time`` of this process (Spark's JVM not
included: for Spark runs the wall time is the measure).

    python -m bench.live_archived                 # everything; tables on stdout, plots in docs/img/
    python -m bench.live_archived --quick --no-spark
    python -m bench.live_archived --docs          # also rewrite the section of docs/benchmarks.md
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.la_report import CACHE, FLUSH_ROWS, plots, tables, write_docs
from bench.la_workloads import AARHUS, RFID, SEL, aarhus, rfid, sel_stream
from engine.events import Event
from engine.live_archived import MemoryArchive, compile_live_archived, make_runner, replay

S = 1_000_000

# ------------------------------------------------------------------ one run


class SparkBench:
    """One warmed Spark session; a fresh Delta archive per run (fsync off: the read path is measured)."""

    def __init__(self) -> None:
        from archive.spark import SparkSettings, get_spark, timings

        self.spark = get_spark(SparkSettings(master="local[2]", app_name="lace-bench-la"))
        self.start_s = timings().get("start_s", 0.0) + timings().get("warm_up_s", 0.0)
        self.tmp = Path(tempfile.mkdtemp(prefix="lace-bench-la-"))
        self.runs = 0

    def archive(self, events: list[Event]) -> Any:
        from archive.archived_source import GrowingDeltaArchive
        from archive.writer import ArchiveWriter
        from cli.replay import infer_event_types

        self.runs += 1
        types = infer_event_types(events, "key")
        root = self.tmp / f"run{self.runs}"
        writer = ArchiveWriter(root, types=types, flush_rows=FLUSH_ROWS, flush_age_s=3_600, fsync=False)
        return GrowingDeltaArchive(writer, batch=50)  # ingest every 50 events, whatever the algorithm reads


def run(query: str, algorithm: str, events: list[Event], spark: SparkBench | None = None, **opts: Any) -> dict:
    """Replay ``events`` through ``algorithm``; counters, CPU and wall seconds, and a digest of the results."""
    plan = compile_live_archived(query)
    if spark is None:
        archive: Any = MemoryArchive()
        source: Any = archive
    else:
        archive = spark.archive(events)
        source = archive.source(spark=spark.spark)
    runner = make_runner(algorithm, plan, source, **opts)
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    results = list(replay(events, runner, archive.append))
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    if spark is not None:
        archive.writer.close()
    digest = hashlib.sha256()
    for k in sorted(json.dumps(sorted(r.ids().items())) for r in results):
        digest.update(k.encode())
    c = runner.stats()
    out = {k: c[k] for k in ("live_instances", "archive_requests", "archived_events_scanned", "archived_instances",
                             "join_pairs_tried", "results", "stat_requests")}
    out.update(algorithm=algorithm, cpu_s=round(cpu, 3), wall_s=round(wall, 3), digest=digest.hexdigest()[:12])
    out.update(delay_event_s=round(c["delay_event_us"]["mean"] / S, 3),
               delay_wall_ms=round(c["delay_wall_s"]["mean"] * 1e3, 2))
    if "ollaa" in c:
        decided = [d for d in c["ollaa"]["decisions"] if "sel_live" in d]
        out["mode"] = c["ollaa"]["mode"]
        out["filtered"] = c["ollaa"]["live_events_filtered"]
        if decided:
            out["sel_live"] = round(sum(d["sel_live"] for d in decided) / len(decided), 3)
            out["sel_archived"] = round(sum(d["sel_archived"] for d in decided) / len(decided), 3)
    if "sllaa" in c:
        out["subwindows"] = c["sllaa"]["subwindows"]
    if spark is not None:
        out["delta_commits"] = archive.writer.counters["commits"]
    print(json.dumps(out), file=sys.stderr, flush=True)
    return out


def same(rows: list[dict]) -> None:
    digests = {r["digest"] for r in rows}
    assert len(digests) == 1, f"results differ between runs: {rows}"


# ------------------------------------------------------------------ experiments


def experiment1(sizes: list[int], lookback_s: int, n_keys: int) -> list[dict]:
    """ALAA vs LLAA CPU over N_S (M_Ratio = 0.5, ΔR fixed)."""
    rows = []
    for n in sizes:
        events = rfid(n, 0.5, n_keys)
        q = RFID.format(lookback_s=lookback_s, live_keys=n_keys)
        pair = [run(q, "alaa", events), run(q, "llaa", events)]
        same(pair)
        rows.append({"N_S": n, "alaa": pair[0], "llaa": pair[1]})
    return rows


def experiment1b(n: int, fractions: list[float], lookback_s: int, n_keys: int) -> list[dict]:
    """ALAA vs LLAA CPU as the live pattern watches a growing fraction of the objects (N_S fixed)."""
    events = rfid(n, 0.5, n_keys)
    rows = []
    for f in fractions:
        q = RFID.format(lookback_s=lookback_s, live_keys=max(1, int(f * n_keys)))
        pair = [run(q, "alaa", events), run(q, "llaa", events)]
        same(pair)
        rows.append({"fraction": f, "alaa": pair[0], "llaa": pair[1]})
    return rows


def experiment2(n: int, thetas: list[float]) -> list[dict]:
    """LLAA vs OLLAA while Sel_PA = θ goes up, Sel_PL = 1 (every reading is a live instance)."""
    events = sel_stream(n)
    rows = []
    for theta in thetas:
        q = SEL.format(theta=theta)
        pair = [run(q, "llaa", events), run(q, "ollaa", events, tolerance_us=10 * S, decide_every_us=300 * S)]
        same(pair)
        rows.append({"theta": theta, "llaa": pair[0], "ollaa": pair[1]})
    return rows


def experiment3(
    n: int, tolerances_s: list[float], lookback_s: int, n_keys: int, spark: SparkBench | None = None,
    within: tuple[int, int] | None = None,
) -> list[dict]:
    """LLAA vs SLLAA across tolerances T_L at M_Ratio = 1 (``within``: replay only events[lo:hi] of the stream)."""
    events = rfid(n, 1.0, n_keys)
    if within is not None:
        events = events[within[0] : within[1]]  # a steady stretch: no ramp-up, no cut-off tail
    q = RFID.format(lookback_s=lookback_s, live_keys=n_keys)
    base = run(q, "llaa", events, spark=spark)
    rows = []
    for tol in tolerances_s:
        r = run(q, "sllaa", events, spark=spark, tolerance_us=int(tol * S))
        same([base, r])
        rows.append({"T_L_s": tol, "llaa": base, "sllaa": r})
    return rows


def aarhus_runs(tolerance_s: float) -> list[dict]:
    events = aarhus()
    rows = [run(AARHUS, alg, events, tolerance_us=int(tolerance_s * S)) for alg in ("alaa", "llaa", "ollaa", "sllaa")]
    same(rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--no-spark", action="store_true", help="skip the Spark part of experiment 3")
    ap.add_argument("--no-aarhus", action="store_true")
    ap.add_argument("--docs", action="store_true", help="rewrite this bench's section of docs/benchmarks.md")
    ap.add_argument("--lookback", type=int, default=300, help="ΔR (LOOKBACK) of the RFID query, seconds")
    ap.add_argument("--keys", type=int, default=500, help="objects of the RFID stream (experiment 1)")
    ap.add_argument("--sizes", default="10000,20000,30000,40000,50000", help="N_S of experiment 1")
    ap.add_argument("--n1b", type=int, default=50_000, help="N_S of experiment 1b")
    ap.add_argument("--fractions", default="0.01,0.05,0.2,0.5,1.0", help="watched objects, experiment 1b")
    ap.add_argument("--sel-n", type=int, default=20_000, help="N_S of experiment 2")
    ap.add_argument("--thetas", default="0.05,0.1,0.2,0.4,0.6,0.8,1.0")
    ap.add_argument("--n3", type=int, default=50_000, help="N_S of experiment 3 (memory)")
    ap.add_argument("--keys3", type=int, default=100, help="objects of the RFID stream (experiment 3)")
    ap.add_argument("--tolerances", default="10,30,60,120,300,600", help="T_L of experiment 3, seconds")
    ap.add_argument("--spark-n", type=int, default=1_500, help="events of experiment 3 on Spark (a stretch of --n3)")
    ap.add_argument("--spark-tolerances", default="5,10,30")
    ap.add_argument("--aarhus-tolerance", type=float, default=3600.0)
    ap.add_argument("--render", action="store_true", help=f"only redo tables and plots from {CACHE.name}")
    a = ap.parse_args(argv)
    a.date = f"{datetime.now(UTC):%Y-%m-%d}"
    if a.render:
        saved = json.loads(CACHE.read_text(encoding="utf-8"))
        a = argparse.Namespace(**{**vars(a), **saved["args"], "docs": a.docs})
        return finish(saved["res"], a)
    if a.quick:
        a.sizes, a.n1b, a.sel_n, a.n3, a.spark_n = "5000,10000", 10_000, 5_000, 10_000, 400
        a.thetas, a.tolerances, a.fractions = "0.1,0.5,1.0", "10,300", "0.05,1.0"
    floats = lambda text: [float(x) for x in text.split(",")]  # noqa: E731
    res: dict[str, Any] = {
        "exp1": experiment1([int(x) for x in a.sizes.split(",")], a.lookback, a.keys),
        "exp1b": experiment1b(a.n1b, floats(a.fractions), a.lookback, a.keys),
        "exp2": experiment2(a.sel_n, floats(a.thetas)),
        "exp3": experiment3(a.n3, floats(a.tolerances), a.lookback, a.keys3),
    }
    if not a.no_spark:
        sb = SparkBench()
        res["spark_start_s"] = sb.start_s
        stretch = (a.n3 * 2 // 5, a.n3 * 2 // 5 + a.spark_n)
        res["exp3s"] = experiment3(a.n3, floats(a.spark_tolerances), a.lookback, a.keys3, spark=sb, within=stretch)
    if not a.no_aarhus:
        res["aarhus"] = aarhus_runs(a.aarhus_tolerance)
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    CACHE.write_text(json.dumps({"args": {k: v for k, v in vars(a).items() if k not in ("docs", "render")},
                                 "res": res}), encoding="utf-8")
    return finish(res, a)


def finish(res: dict, a: argparse.Namespace) -> int:
    plots(res)
    text = tables(res, a)
    print(text)
    if a.docs:
        write_docs(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
