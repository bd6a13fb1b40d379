"""What Spark's ``transformWithStateInPandas`` allows on this machine, whatever the processor does (issue 26).

``lace stream``'s detection is a streaming query of fixed shape: the Delta source table (the seed-42 stream's
events, pickled, keyed by ``key``), the watermark, ``groupBy("k")``, a stateful processor per key, a
``foreachBatch`` sink. This bench runs that same shape with processors that do less and less than
:class:`stream.processor.LaceProcessor`, so the events/s of the emptiest one is the ceiling of any detector in
this design on this machine:

* ``noop``: reads the key's rows (Arrow -> pandas) and yields nothing; no state;
* ``state``: as ``noop``, plus the one ``ValueState`` read and write per key per micro-batch that a detector
  needs at least;
* ``unpickle``: as ``state``, plus unpickling every event (the engine's input);
* ``lace``: ``lace stream`` itself (the P1-any matcher; every match pickled into the results table).

One child process per master starts Spark, warms up with a small stream, then runs each processor over the same
source table (written once). The events/s figure is the streaming query's wall time until the source is consumed
(Spark's start and the source's writing excluded), as ``bench.stream``'s ``detect``.

    python -m bench.stream_ceiling --n 200000 --batch-events 100000 --masters 'local[1],local[2]'
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

KINDS = ("noop", "state", "unpickle", "lace")


def _processor(kind: str) -> Any:
    import pickle

    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
    from pyspark.sql.types import BinaryType, LongType, StructField, StructType

    schema = StructType([StructField("s", BinaryType()), StructField("n", LongType())])

    class Ceiling(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.value = handle.getValueState("s", schema)

        def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
            n = 0
            for frame in rows:
                n += len(frame)
                if kind == "unpickle":
                    loads = pickle.loads
                    for blob in frame["ev"]:
                        if blob:
                            loads(blob)
            if kind != "noop":
                old = self.value.get() if self.value.exists() else None
                self.value.update((b"x" * 1000, n + (int(old[1]) if old else 0)))
            return iter(())

        def close(self) -> None:
            pass

    return Ceiling()


def run_ceiling(kind: str, source: Path, work: Path) -> tuple[float, list[dict[str, Any]]]:
    """The streaming query of ``lace stream``'s shape over ``source`` with processor ``kind`` (not ``lace``):
    (wall seconds until the source is consumed, the micro-batches' progress reports as dicts)."""
    from stream.job import spark_session
    from stream.processor import OUTPUT_SCHEMA

    spark = spark_session(None)
    frame = (
        spark.readStream.format("delta").option("maxFilesPerTrigger", 1).load(str(source))
        .withWatermark("et", "1 milliseconds")
        .groupBy("k")
        .transformWithStateInPandas(statefulProcessor=_processor(kind), outputStructType=OUTPUT_SCHEMA,
                                    outputMode="Append", timeMode="EventTime")
    )
    t0 = time.perf_counter()
    q = (frame.writeStream.foreachBatch(lambda df, i: df.count())
         .option("checkpointLocation", str(work / f"cp-{kind}")).trigger(availableNow=True).start())
    q.awaitTermination()
    return time.perf_counter() - t0, [json.loads(p.json) for p in q.recentProgress]


def run_master(master: str, kinds: list[str], n: int, batch_events: int) -> list[dict]:
    """Start Spark with ``master``, warm up, write the source once, run ``kinds``; one result per kind."""
    os.environ["LACE_SPARK_MASTER"] = master
    from bench.engine import query_text
    from bench.stream import batch_seconds, run_stream_case
    from bench.streams import bench_csv
    from engine.compiler import compile_query
    from engine.io import open_event_file
    from stream.job import accepted_events, spark_session, write_source

    spark_session(master)
    run_stream_case("P1-any", 10_000, master, 10_000)  # warm-up
    out = []
    with tempfile.TemporaryDirectory(prefix="lace-bench-ceiling-") as tmp:
        work = Path(tmp)
        query = compile_query(query_text("P1-any"))
        events = accepted_events(open_event_file(bench_csv(n)).events(), query, 0, lambda i, r: None)
        write_source(events, query, work / "source", batch_events)
        for kind in kinds:
            if kind == "lace":
                from stream import job as J

                r = run_stream_case("P1-any", n, master, batch_events)
                secs, reports = r["detect_s"], list(J.progress)
            else:
                secs, reports = run_ceiling(kind, work / "source", work)
            data, empty = batch_seconds(reports)
            row = {"kind": kind, "master": master, "n": n, "batch_events": batch_events, "detect_s": round(secs, 2),
                   "events_per_s": int(n / secs), "micro_batches": len(reports),
                   "data_batch_s": [round(x, 2) for x in data], "empty_batch_s": [round(x, 2) for x in empty],
                   "events_per_s_in_data_batches": int(n / sum(data)) if data else None}
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    from bench.stream import per_master

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200_000, help="events of the seed-42 stream")
    ap.add_argument("--batch-events", type=int, default=100_000, help="events per micro-batch")
    ap.add_argument("--masters", default="local[1],local[2]")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--one-master", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    kinds = args.kinds.split(",")
    if args.one_master:
        run_master(args.one_master, kinds, args.n, args.batch_events)
        return 0
    rows = per_master("bench.stream_ceiling", args.masters.split(","),
                      ["--kinds", args.kinds, "--n", str(args.n), "--batch-events", str(args.batch_events)])
    print(f"\n{platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"n={args.n}, batch_events={args.batch_events}\n")
    print("| processor | master | detect s | events/s | events/s in the data micro-batches | data micro-batches s "
          "| empty micro-batches s |\n| --- | --- | ---: | ---: | ---: | --- | --- |")
    for r in rows:
        print(f"| {r['kind']} | {r['master']} | {r['detect_s']} | {r['events_per_s']:,} "
              f"| {r['events_per_s_in_data_batches']:,} | {' '.join(map(str, r['data_batch_s']))} "
              f"| {' '.join(map(str, r['empty_batch_s']))} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
