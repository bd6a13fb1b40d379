"""A one-event archived pattern matched once per archived event vs once per request (issue 25).

``python -m bench.archived_memo [--days 8] [--llaa 600] [--subwindows 60] [--rounds 2]``

The demo's ``congested_same_hour`` (``LOOKBACK 7 days``) over the first ``--days`` of the Aarhus table in an
in-memory archive (:class:`engine.live_archived.source.MemoryArchive`, no Spark) of the readings that match ``P_A``
(what a request returns after the service's pushdown of its WHERE). The live instances of the last day are found by
the live matcher, then answered the way the service's query processes answer them: LLAA one request per instance
(``answer_one``), SLLAA one request per subwindow of 15 instances (``answer``), each as now (the memo,
:class:`engine.live_archived.memo.ArchivedMemo`, and the JOIN's equalities evaluated once per side,
``LiveArchivedPlan.join_equi``) and as before (``archived_memo = None``: a fresh matcher over every request's rows;
``join_equi`` empty: every JOIN conjunct on every pair), alternating, ``--rounds`` times. Prints CPU seconds
(``time.process_time``: the machine is shared) and checks both give the same results.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
AARHUS = REPO.parent / "shared" / "data" / "aarhus"
QUERY = REPO / "cli" / "demo_data" / "queries" / "congested_same_hour.lql"
DAY_MS = 86_400_000


def main(argv: list[str] | None = None) -> int:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from engine.events import Event
    from engine.live_archived.base import LiveInstance
    from engine.live_archived.llaa import LLAA
    from engine.live_archived.plan import compile_live_archived
    from engine.live_archived.sllaa import SLLAA
    from engine.live_archived.source import MemoryArchive
    from engine.matcher import Matcher

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=int, default=8)
    ap.add_argument("--llaa", type=int, default=600, help="LLAA requests (live instances)")
    ap.add_argument("--subwindows", type=int, default=60, help="SLLAA requests (15 instances each)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)

    with open(AARHUS / "traffic_sensors.csv", newline="") as f:
        ndt = {r["REPORT_ID"]: float(r["NDT_IN_KMH"]) for r in csv.DictReader(f)}
    columns = ["key", "ts_ms", "avg_speed", "vehicle_count"]
    t = pq.read_table(AARHUS / "aarhus_traffic_2014-08_09.parquet", columns=columns)
    t = t.take(pc.sort_indices(t, sort_keys=[("ts_ms", "ascending")]))
    t0 = t.column("ts_ms")[0].as_py()
    d = t.filter(pc.less(t.column("ts_ms"), t0 + args.days * DAY_MS)).to_pydict()
    events = [
        Event(i + 1, "traffic", ms * 1000,
              {"key": k, "avg_speed": s, "vehicle_count": c, "ndt_kmh": ndt.get(k, 0.0), "hour": ms // 3_600_000 % 24})
        for i, (k, ms, s, c) in enumerate(zip(d["key"], d["ts_ms"], d["avg_speed"], d["vehicle_count"]))
    ]
    plan = compile_live_archived(QUERY.read_text())
    # the archive holds what a request returns after the service's pushdown of P_A's WHERE (archive/pushdown.py,
    # exact for this WHERE): the readings that match P_A; unfiltered, every request would return every reading
    pa_matcher = Matcher(plan.archived)
    archive = MemoryArchive()
    archive.extend(e for e in events if pa_matcher.push(e))
    cut = (t0 + (args.days - 1) * DAY_MS) * 1000
    live = Matcher(plan.live)
    found = [m for e in events if e.ts >= cut for m in live.push(e)] + live.flush()
    insts = [LiveInstance(m, m.end, 0.0) for m in found]

    before = compile_live_archived(QUERY.read_text())  # every JOIN conjunct on every pair, as before issue 25's
    before.join_equi, before.join_rest = [], before.join_same_key  # equalities were taken apart

    def run(algorithm: str, memo: bool) -> tuple[float, list[Any], dict[str, int] | None]:
        chosen = plan if memo else before
        if algorithm == "llaa":
            runner: Any = LLAA(chosen, archive)
            groups, answer = [[i] for i in insts[: args.llaa]], runner.answer_one
        else:
            runner = SLLAA(chosen, archive, tolerance_us=600_000_000)
            groups = [insts[i : i + 15] for i in range(0, len(insts), 15)][: args.subwindows]
            answer = runner.answer
        if not memo:
            runner.archived_memo = None
        cpu = time.process_time()  # CPU seconds of this (single-threaded) work: what a shared machine's load spares
        results = [r for g in groups for r in answer(g)]
        cpu = time.process_time() - cpu
        return cpu, results, runner.archived_memo.stats() if runner.archived_memo else None

    out: dict[str, Any] = {"events": len(events), "live_instances": len(insts), "rounds": []}
    for _ in range(args.rounds):
        row: dict[str, Any] = {}
        for algorithm in ("llaa", "sllaa"):
            off, want, _ = run(algorithm, False)
            on, got, stats = run(algorithm, True)
            assert [(r.ids(), r.fields) for r in got] == [(r.ids(), r.fields) for r in want], algorithm
            row[algorithm] = {"results": len(got), "before_cpu_s": round(off, 2), "now_cpu_s": round(on, 2),
                              "memo": stats, "load": " ".join(f"{x:.1f}" for x in os.getloadavg())}
        out["rounds"].append(row)
        print(json.dumps(row), flush=True)
    out["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    out["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
