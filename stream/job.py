"""``lace stream``'s job: a file's events through Spark Structured Streaming, matches out as ``lace match`` writes them.

1. The event file is read as ``lace match`` reads it (:func:`engine.io.open_event_file`); the events ``lace match``
   would reject as late are reported the same way and left out (:func:`accepted_events`). The others go, pickled,
   into a Delta table (the source, written by delta-rs in chunks of ``batch_events``, one table version each),
   keyed by the statement's PARTITION BY value.
2. Spark reads it with ``readStream.format("delta")`` (the connector from ``LACE_DELTA_JAR``), one version per
   micro-batch, with the allowed lateness as the watermark delay on the event time, groups by key and runs
   :class:`stream.processor.LaceProcessor` in ``transformWithStateInPandas`` (RocksDB state store; timers in
   event time). An end-of-stream marker row, far in event time, moves the watermark past every deadline; the
   no-data micro-batch Spark runs after it fires the timers, so trailing negations and held-back events come out
   (the stream's ``flush``).
3. Matches go to a Delta results table (``foreachBatch``, one Delta transaction per micro-batch: exactly once with
   the checkpoint, :func:`_results_writer`); the driver reads it, sorts it into ``lace match``'s emission order
   (:data:`stream.processor.ORDER`) and writes OUT with :class:`engine.match_files.MatchWriter`.

With a checkpoint folder the source, the results and Spark's checkpoint live in it: a driver killed mid-stream
and started again with the same folder goes on from its last committed micro-batch and writes the same OUT.

A live-and-archived statement (``job.plan``) runs its live pattern in step 2, which then gives the completed live
instances; in the file mode the source table is also the archive (every event before an instance's start is in it,
as ``lace replay`` archives each event before the live side sees it), in the archive mode the archive's tables of the
archived types are. Step 3's ``foreachBatch`` joins each micro-batch's instances with the archived side
(:func:`_archive_join`): those tables read by Spark over the instances' access ranges, grouped by archive key with the
instances (``cogroup``), and per key the engine's own join
(:func:`stream.processor.join_group`); the results, not the instances, go to the results table, and OUT is written in
``lace replay``'s order (each instance's results together, instances in the live matcher's order).

The archive mode (``job.archive``, :mod:`stream.archive_source`) skips step 1: the archive's Delta events tables are
the source, and a bounded run ends without a marker (the tail of the keys' states, flushed outside the stream); or
the query is left running (:func:`follow`), each micro-batch's matches handed over as step 3 commits them.

Timestamps are int microseconds UTC.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from engine.compiler import CompiledQuery
from engine.events import Event
from engine.live_archived.plan import LiveArchivedPlan
from engine.matcher import late_reason

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
STREAM_ROOT = Path(__file__).resolve().parents[1]
_DONE = "source.done"
progress: list[dict[str, Any]] = []
"""The last run's micro-batch progress reports (Spark's ``StreamingQuery.recentProgress``, as dicts)."""
tail_keys: set[frozenset[tuple[str, tuple[int, ...]]]] = set()
"""The identities (:meth:`engine.match.Match.key`) of the last archive-mode run's tail: the matches only the end of
the stream gives (a trailing negation whose deadline the watermark has not passed, a match of events still held
back by the lateness), in OUT but not committed; a newer event can still cancel them. Empty after a file-mode run."""
late: list[tuple[int, int]] = []
"""The events the keys' matchers rejected as late, ``(ts_end us, id)``, over every run of the checkpoint (archive
mode; the file mode leaves such events out before Spark)."""


def dropped_by_watermark(reports: Iterable[dict[str, Any]]) -> int:
    """Rows the stateful operator dropped behind the watermark in the micro-batches of ``reports`` (Spark's
    progress reports as dicts: :data:`progress`, or one report of a running query)."""
    return sum(op.get("numRowsDroppedByWatermark", 0) for p in reports for op in p.get("stateOperators", ()))


class StreamJobError(RuntimeError):
    """A stream job that cannot start or finish (no Delta connector, a checkpoint of another job, a failed
    streaming query); one line."""


@dataclass(frozen=True, slots=True)
class StreamJob:
    """One ``lace stream`` run.

    Parameters
    ----------
    text : str
        The statement's LQL text (one statement, already checked by :mod:`stream.statements`).
    query : CompiledQuery
        It, compiled in the driver (for its types, key, window and plans' layouts); of a live-and-archived statement,
        its live pattern (``plan.live``).
    strategy : str, optional
        ``--strategy`` override.
    lateness_us : int
        Allowed lateness, int microseconds >= 0.
    master : str, optional
        Spark master (default ``LACE_SPARK_MASTER``, else ``local[*]``).
    batch_events : int
        Events per source table version, i.e. per micro-batch.
    checkpoint : Path, optional
        Folder of the source, results and Spark checkpoint (kept); None: a temporary folder.
    archive : Path, optional
        Archive root: read the statement's types from its Delta tables ``<archive>/<type>`` instead of a source
        written from a file (``batch_events`` then unused).
    plan : LiveArchivedPlan, optional
        The statement compiled as a live-and-archived plan (``query`` is then ``plan.live``); None: live-only.
    trigger_s : float, optional
        Archive mode only: leave the query running (:func:`follow`), a micro-batch every ``trigger_s`` seconds (Spark's
        processing-time trigger) over what was archived since; None: a bounded run (``availableNow``).
    """

    text: str
    query: CompiledQuery
    strategy: str | None = None
    lateness_us: int = 0
    master: str | None = None
    batch_events: int = 50_000
    checkpoint: Path | None = None
    archive: Path | None = None
    plan: LiveArchivedPlan | None = None
    trigger_s: float | None = None


def accepted_events(
    events: Iterator[Event], query: CompiledQuery, lateness_us: int, on_late: Callable[[int, str], None],
    types: frozenset[str] | None = None,
) -> Iterator[Event]:
    """The events of ``query``'s types (or of ``types``: a live-and-archived statement's both sides) that ``lace
    match`` (one :class:`~engine.matcher.Matcher`, allowed lateness ``lateness_us``) accepts, in file order;
    ``on_late(position, reason)`` for each it would reject, with the matcher's own reason
    (:meth:`Matcher.check_late`)."""
    import heapq

    types = query.types if types is None else types
    clock = SimpleNamespace(
        watermark=-(1 << 63), max_seen=None, lateness={}, default_lateness=lateness_us, last_released=(-(1 << 63),) * 2
    )
    held: list[tuple[int, int]] = []
    for i, e in enumerate(events):
        if e.type not in types:
            continue
        reason = late_reason(clock, e)
        if reason is not None:
            on_late(i, reason)
            continue
        if clock.max_seen is None or e.ts_end > clock.max_seen:
            clock.max_seen = e.ts_end
        heapq.heappush(held, (e.ts_end, e.id))
        while held and held[0][0] <= clock.max_seen - lateness_us:
            clock.last_released = heapq.heappop(held)
        yield e


def _delta_ready(spark: Any) -> None:
    from archive.spark import native_delta_available

    if not native_delta_available(spark):
        raise StreamJobError(
            "lace stream reads its source with the Delta Spark connector: set LACE_DELTA_JAR to its JAR folder "
            "(make delta-jars)"
        )


def spark_session(master: str | None) -> Any:
    """The process's SparkSession (:func:`archive.spark.get_spark`) with the streaming settings: RocksDB state
    store; as many shuffle partitions (state store partitions) as the master has cores, unless ``LACE_SPARK_CONF``
    sets ``spark.sql.shuffle.partitions`` (``local[N]``: N; another master, e.g. a standalone cluster's
    ``spark://HOST:PORT``: ``spark.cores.max`` if set, else the cores of the executors registered once the session
    is up, :func:`_cluster_cores`); Python workers that import this checkout and run this interpreter.

    The Python workers, the executors' and the driver's own (``transformWithStateInPandas`` starts one in the driver
    too), run ``PYSPARK_PYTHON`` (default: this interpreter, ``sys.executable``: the same path must hold the same
    virtual environment on every worker) with this checkout's folder on ``PYTHONPATH`` (the driver's environment and
    ``spark.executorEnv.PYTHONPATH``, unless ``LACE_SPARK_CONF`` sets it), so they import engine/, stream/ and
    archive/ (deploy/stream.md)."""
    from archive.spark import SparkSettings, get_spark

    settings = SparkSettings.from_env()
    if master:
        settings = replace(settings, master=master)
    conf = {
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        "spark.executorEnv.PYTHONPATH": str(STREAM_ROOT),
    }
    local = settings.master.startswith("local")
    if local:
        conf["spark.sql.shuffle.partitions"] = _cores(settings.master)
    conf.update(settings.conf)
    settings = replace(settings, app_name="lace-stream", conf=conf)
    path = os.environ.get("PYTHONPATH", "")
    if str(STREAM_ROOT) not in path.split(os.pathsep):  # workers import engine/ and stream/ from this checkout
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(STREAM_ROOT), path) if p)
    # pyspark's default is python3 (not the virtual environment): the driver's Python runner of
    # transformWithStateInPandas and the executors' workers need pandas, pyarrow and this checkout's packages
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = get_spark(settings, warm=False)
    if not local and "spark.sql.shuffle.partitions" not in settings.conf:
        # a runtime setting: read by the stream's first micro-batch (then kept in its checkpoint's offset log)
        spark.conf.set("spark.sql.shuffle.partitions", str(_cluster_cores(spark)))
    return spark


def _cores(master: str) -> str:
    inside = master.partition("[")[2].rstrip("]")
    if master.startswith("local") and inside.isdigit():
        return inside
    return str(os.cpu_count() or 2)


def _cluster_cores(spark: Any, wait_s: float = 60.0, settle_s: float = 3.0) -> int:
    """The cores a cluster gives this application: ``spark.cores.max`` when set; else the executors' cores once
    the first executor has registered and none more came for ``settle_s`` seconds (at most ``wait_s`` seconds in
    all; Spark's ``defaultParallelism``: the executors' cores, at least 2, or ``spark.default.parallelism``)."""
    sc = spark.sparkContext
    cap = sc.getConf().get("spark.cores.max")
    if cap and cap.isdigit() and int(cap) > 0:
        return int(cap)
    executors = sc._jsc.sc().getExecutorMemoryStatus  # block managers: the driver's and one per executor
    deadline = time.monotonic() + wait_s
    seen, since = 1, time.monotonic()
    while time.monotonic() < deadline:
        n = int(executors().size())
        if n != seen:
            seen, since = n, time.monotonic()
        elif n > 1 and time.monotonic() - since >= settle_s:
            break
        time.sleep(0.5)
    return max(int(sc.defaultParallelism), 1)


def write_source(
    events: Iterator[Event], query: CompiledQuery, path: Path, batch_events: int, lateness_us: int = 0,
    plan: LiveArchivedPlan | None = None,
) -> int:
    """Write ``events`` as the stream's Delta source table at ``path`` (delta-rs), ``batch_events`` per version,
    then the end-of-stream marker (``lateness_us`` beyond every deadline); returns the number of events written.

    With ``plan`` (a live-and-archived statement; ``query`` its live pattern) the table is also the archive: a
    column ``ak`` holds each event's archive key (:func:`stream.processor.group_key` of the key plan's attribute;
    ``""`` without a key plan; null for an event of no archived type), and an event of no live type gets the
    end-of-stream key (the processor skips it)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from stream.processor import END_KEY, group_key

    fields = [
        ("k", pa.string()), ("et", pa.timestamp("us", tz="UTC")), ("ts", pa.int64()), ("id", pa.int64()),
        ("ev", pa.binary()),
    ]
    schema = pa.schema(fields if plan is None else [*fields, ("ak", pa.string())])
    key_of, dumps, proto = query.key_of, pickle.dumps, pickle.HIGHEST_PROTOCOL
    live_types = query.types
    archived_types = frozenset(plan.archived_types) if plan is not None else frozenset()
    key_attr = plan.key.attr if plan is not None and plan.key is not None else None
    n, newest = 0, -(1 << 62)
    chunk: list[Event] = []

    def row(x: Event) -> tuple[Any, ...]:
        k = repr(key_of(x)) if x.type in live_types else END_KEY
        if plan is None:
            return (k, x.ts_end, x.id, dumps(x, proto))
        ak = None if x.type not in archived_types else "" if key_attr is None else group_key(x.get(key_attr))
        return (k, x.ts_end, x.id, dumps(x, proto), ak)

    def write(rows: list[tuple[Any, ...]]) -> None:
        cols = list(zip(*rows))
        arrays = [pa.array(cols[0], pa.string()), pa.array(cols[1], pa.int64()).cast(schema.field("et").type),
                  pa.array(cols[1], pa.int64()), pa.array(cols[2], pa.int64()), pa.array(cols[3], pa.binary())]
        if plan is not None:
            arrays.append(pa.array(cols[4], pa.string()))
        write_deltalake(str(path), pa.table(arrays, schema=schema), mode="append")

    for e in events:
        chunk.append(e)
        if len(chunk) >= batch_events:
            write([row(x) for x in chunk])
            n += len(chunk)
            newest = max(newest, max(x.ts_end for x in chunk))
            chunk = []
    if chunk:
        write([row(x) for x in chunk])
        n += len(chunk)
        newest = max(newest, max(x.ts_end for x in chunk))
    # end of stream: the watermark (the marker's ts - lateness) must pass every deadline (at most a window after the
    # newest event); Spark's no-data micro-batch after the marker's fires the timers
    end = newest + (query.window_us or 0) + lateness_us + 3_600_000_000
    write([(END_KEY, end, 0, b"") + ((None,) if plan is not None else ())])
    return n


def _archive_join(frame: Any, archived: Callable[[Any, int, int, Any], Any], text: str) -> Any:
    """The results (:data:`stream.processor.RESULT_SCHEMA`) of a micro-batch's live instances ``frame``
    (:data:`stream.processor.LA_OUTPUT_SCHEMA`): a Spark join with the archive.

    ``archived(spark, lo, hi, instances)`` reads the archived side (rows ``ak``, ``ev``) over the union of the
    instances' access ranges (one range from the smallest ``lo`` to the largest ``hi``: a filter Delta prunes files
    by), only the archive keys of ``instances``: the file mode's :func:`_source_archive` or the archive mode's
    :func:`_archive_tables`. Archived rows and instances are grouped by archive key (``cogroup``): per key,
    :func:`stream.processor.join_group` matches the archived pattern over the key's events in the key's merged ranges
    and joins (SLLAA with the micro-batch as the subwindow, 001 section 4.3). Without a key plan every row has the
    key ``""``: one group, no parallelism. Rows of events rejected as late (archive mode, kind
    :data:`stream.processor.LATE`) are passed on as they are (``r`` 0), not joined."""
    from pyspark.sql import functions as F

    from stream.processor import LATE, RESULT_SCHEMA, join_group

    spark = frame.sparkSession
    late = frame.where(F.col("kind") == LATE).select(*[F.lit(0).cast("long").alias(f.name) if f.name == "r"
                                                       else F.col(f.name) for f in RESULT_SCHEMA.fields])
    instances = frame.where(F.col("kind") != LATE)
    lo, hi = instances.agg(F.min("lo"), F.max("hi")).first()
    if lo is None:  # no instance
        return late
    joined = instances.groupBy("ak").cogroup(archived(spark, lo, hi, instances).groupBy("ak")).applyInPandas(
        join_group(text), schema=RESULT_SCHEMA
    )
    return joined.unionByName(late)


def _source_archive(spark: Any, lo: int, hi: int, instances: Any, source: Path) -> Any:
    """The file mode's archived side (:func:`_archive_join`): the source table's rows with an archive key (events
    of an archived type) whose ``ts`` (= ts_end) is in ``[lo, hi)``, of the keys of ``instances`` (a broadcast semi
    join)."""
    from pyspark.sql import functions as F

    return (
        spark.read.format("delta").load(str(source))
        .where(F.col("ak").isNotNull() & (F.col("ts") >= lo) & (F.col("ts") < hi))
        .select("ak", "ev")
        .join(F.broadcast(instances.select("ak").distinct()), "ak", "left_semi")
    )


def _archive_tables(spark: Any, lo: int, hi: int, instances: Any, root: Path, text: str) -> Any:
    """The archive mode's archived side (:func:`_archive_join`): the archive's tables of the archived types,
    :func:`stream.archive_source.archived_frame`, of the keys of ``instances`` (collected to the driver: one per
    live key of the micro-batch, passed to the workers that build events)."""
    from stream.archive_source import archived_frame

    keys = {row[0] for row in instances.select("ak").distinct().collect()}
    return archived_frame(spark, root, text, lo, hi, keys)


def _results_writer(
    checkpoint: Path, results: Path, join: Callable[[Any], Any] | None = None,
    on_batch: Callable[[Any, int], None] | None = None,
) -> Callable[[Any, int], None]:
    """The ``foreachBatch`` function appending a micro-batch's rows to the Delta table ``results``, exactly once.

    The micro-batch is always computed, then written as a Delta transaction of the query (``txnAppId`` the id in
    Spark's checkpoint ``metadata``, ``txnVersion`` the batch id: Delta skips a batch it already holds). Spark's Delta
    sink does the same check but before running the batch: a batch replayed after a kill between the sink's commit
    and Spark's commit (``commits/N``) was then not run at all, so Spark's watermark did not take its event times
    (it stayed at the previous batches', and the no-data batch of the timers the batch's events set never ran).

    ``join``: what is written instead of the batch's rows, computed from them (a live-and-archived statement's
    :func:`_archive_join`; deterministic, so a replayed batch gives the same rows, which Delta then skips).

    ``on_batch(table, batch_id)``: called with the batch's rows (an Arrow table) once they are in ``results``, before
    Spark commits the batch (:func:`follow`): a kill in between runs the batch again and calls it again with the
    same rows."""

    def write(frame: Any, batch_id: int) -> None:
        app = json.loads((checkpoint / "metadata").read_text())["id"]
        frame.persist()
        rows = frame
        try:
            frame.count()  # the batch runs (its state, its event times for the watermark) even when already written
            if join is not None:
                rows = join(frame)
                if on_batch is not None:  # read twice: the append, then on_batch
                    rows.persist()
            (rows.write.format("delta").mode("append").option("txnAppId", app).option("txnVersion", batch_id)
             .save(str(results)))
            if on_batch is not None:
                on_batch(rows.toArrow(), batch_id)
        finally:
            if rows is not frame and on_batch is not None:
                rows.unpersist()
            frame.unpersist()

    return write


def _start(job: StreamJob, workdir: Path, on_batch: Callable[[Any, int], None] | None = None) -> tuple[Any, Any, Any]:
    """Start the streaming query of ``job`` over ``workdir/source`` (archive mode: the archive's tables), results into
    ``workdir/results``: ``availableNow``, or every ``job.trigger_s`` seconds. Returns (the Spark session, the
    running query, the live-and-archived join or None).

    Raises
    ------
    StreamJobError
        Without the Delta connector, or (archive mode) an event type's table is missing.
    """
    from stream.processor import LA_OUTPUT_SCHEMA, OUTPUT_SCHEMA, LaceProcessor

    tail_keys.clear()
    spark = spark_session(job.master)
    _delta_ready(spark)
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)  # also on a session built before
    lateness_ms = -(-job.lateness_us // 1000)
    if job.archive is not None:
        # Spark drops a row whose event time is at or before the watermark (the newest event time of the earlier
        # micro-batches minus the delay), while the engine takes an event at exactly the newest ts minus the
        # lateness: one millisecond more, and the key's matcher decides (a file's source holds only such events)
        lateness_ms += 1
        from stream.archive_source import MissingTableError, source_frame

        try:
            source = source_frame(spark, job.archive, job.text, job.strategy, job.query)
        except MissingTableError as e:
            raise StreamJobError(str(e)) from None
    else:
        source = spark.readStream.format("delta").option("maxFilesPerTrigger", 1).load(str(workdir / "source"))
    join = None
    if job.plan is not None:
        archived = (partial(_source_archive, source=workdir / "source") if job.archive is None
                    else partial(_archive_tables, root=job.archive, text=job.text))
        join = partial(_archive_join, archived=archived, text=job.text)
    frame = (
        source
        .withWatermark("et", f"{lateness_ms} milliseconds")
        .groupBy("k")
        .transformWithStateInPandas(
            statefulProcessor=LaceProcessor(job.text, job.strategy, job.lateness_us),
            outputStructType=OUTPUT_SCHEMA if job.plan is None else LA_OUTPUT_SCHEMA,
            outputMode="Append",
            timeMode="EventTime",
        )
    )
    writer = (
        frame.writeStream.foreachBatch(_results_writer(workdir / "stream", workdir / "results", join, on_batch))
        .option("checkpointLocation", str(workdir / "stream"))
    )
    if job.trigger_s is None:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{round(job.trigger_s * 1000)} milliseconds")
    return spark, writer.start(), join


def _failed(e: Exception) -> StreamJobError:
    """A worker's error (e.g. a plug-in function raising, a delivery refused) ends the query: one line."""
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return StreamJobError(f"the streaming query failed: {lines[-1] if lines else type(e).__name__}")


def run_detection(job: StreamJob, workdir: Path) -> Any:
    """Run the streaming query over ``workdir/source`` (archive mode: the archive's tables) until it is consumed
    (``availableNow``); returns the results as an Arrow table (columns :data:`stream.processor.OUTPUT_SCHEMA`, not
    sorted; archive mode: with the tail, :func:`stream.archive_source.tail_rows`).

    Raises
    ------
    StreamJobError
        Without the Delta connector, when the streaming query fails, or (archive mode) an event type's table is
        missing.
    """
    from deltalake import DeltaTable

    from stream.processor import OUTPUT_SCHEMA, RESULT_SCHEMA, output_table

    spark, query, join = _start(job, workdir)
    try:
        query.awaitTermination()
    except Exception as e:
        raise _failed(e) from e
    progress.clear()
    progress.extend(p if isinstance(p, dict) else json.loads(p.json) for p in query.recentProgress)
    results = OUTPUT_SCHEMA if job.plan is None else RESULT_SCHEMA
    if (workdir / "results" / "_delta_log").is_dir():
        table = DeltaTable(str(workdir / "results")).to_pyarrow_table()
    else:
        table = output_table([], results)
    if job.archive is not None:
        import pyarrow as pa

        from stream.archive_source import tail_rows

        tail = tail_rows(spark, workdir / "stream", job.text, job.strategy, job.lateness_us, join)
        tail_keys.update(pickle.loads(blob).key() for blob in tail.column("m").to_pylist())
        names = [f.name for f in results.fields]
        table = table.select(names)
        table = pa.concat_tables([table, tail.select(names).cast(table.schema)])
    return table


def follow(
    job: StreamJob,
    on_matches: Callable[[list[Any], int, int], None],
    stop: threading.Event,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> int:
    """Leave ``job``'s query running over the archive (archive mode, ``job.trigger_s`` and ``job.checkpoint`` set)
    until ``stop`` is set, then stop it; returns the micro-batches it ran (those with results to hand over).

    Each micro-batch reads what was archived since the last one (nothing: no micro-batch, unless the watermark
    moved and timers are due). Its results, once appended to the results table and before Spark commits the
    micro-batch, go to ``on_matches(matches, late, batch_id)``: the matches in ``lace match``'s (``lace replay``'s)
    order within the micro-batch, and how many of its events the keys' matchers rejected as late (left out,
    :data:`late` lists them). A kill between the two runs the micro-batch again from the checkpoint: the same
    matches go to ``on_matches`` again (the service's de-duplication absorbs them: ``POST /queries/{id}/results``).
    Nothing is held back as a tail: a match waiting on a trailing negation or on the lateness comes out in the
    micro-batch whose events move the watermark past it. ``on_progress``: each new micro-batch's progress report
    (Spark's ``StreamingQueryProgress`` as a dict).

    Raises
    ------
    StreamJobError
        As :func:`run_detection`, or when the query fails while running (an error raised by ``on_matches`` too).
    """
    if job.archive is None or job.trigger_s is None or job.checkpoint is None:
        raise StreamJobError("a query left running reads the archive (--archive) and needs --checkpoint")
    prepare(job, job.checkpoint, iter(()))

    ran = [0]

    def on_batch(table: Any, batch_id: int) -> None:
        matches = list(ordered_matches(table, job.query))
        on_matches(matches, len(late), batch_id)
        ran[0] += 1

    _, query, _ = _start(job, job.checkpoint, on_batch)
    seen = -1
    try:
        while not stop.is_set():
            ended = query.awaitTermination(1)
            last = query.lastProgress
            if last is not None:
                report = last if isinstance(last, dict) else json.loads(last.json)
                if report.get("batchId", -1) > seen:
                    seen = report["batchId"]
                    if on_progress is not None:
                        on_progress(report)
            if ended:
                break
    except Exception as e:
        raise _failed(e) from e
    finally:
        _stop_between_batches(query)
    progress.clear()
    progress.extend(p if isinstance(p, dict) else json.loads(p.json) for p in query.recentProgress)
    return ran[0]


def _stop_between_batches(query: Any, wait_s: float = 60.0) -> None:
    """Stop ``query`` once no micro-batch is running (at most ``wait_s`` seconds of waiting): a stop inside one
    cancels its Spark jobs, which the next run repeats anyway but which fill the log with their errors."""
    deadline = time.monotonic() + wait_s
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.05)
    if query.isActive:
        query.stop()


def prepare(job: StreamJob, workdir: Path, events: Iterator[Event]) -> None:
    """The job's folder: the source table (written once; a restart with the same checkpoint reuses it) and
    ``job.json`` (the statement and options; a checkpoint of another job is refused).

    Raises
    ------
    StreamJobError
        When ``workdir`` holds another job's checkpoint.
    """
    stamp: dict[str, Any] = {"text": job.text, "strategy": job.strategy, "lateness_us": job.lateness_us}
    stamp |= {"archive": str(job.archive.resolve())} if job.archive is not None else {"batch": job.batch_events}
    marker = workdir / "job.json"
    if marker.exists():
        if json.loads(marker.read_text()) != stamp:
            raise StreamJobError(f"{workdir}: a checkpoint of another statement or other options")
    if job.archive is not None:  # the archive's tables are the source; Spark's checkpoint says what was read
        workdir.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps(stamp))
        return
    if (workdir / _DONE).exists():
        for _ in events:  # late events are reported on every run, as lace match would
            pass
        return
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("source", "stream", "results"):  # a source not finished: nothing ran from it yet
        shutil.rmtree(workdir / name, ignore_errors=True)
    marker.write_text(json.dumps(stamp))
    write_source(events, job.query, workdir / "source", job.batch_events, job.lateness_us, job.plan)
    (workdir / _DONE).write_text(str(time.time()))


def ordered_matches(results: Any, query: CompiledQuery) -> Iterator[Any]:
    """The matches of a results table, unpickled, in ``lace match``'s emission order; each match's layout is the
    driver's plan's (so :class:`~engine.match_files.MatchWriter` formats them as it formats ``lace match``'s). The
    rows of late events (kind :data:`stream.processor.LATE`) are left out, into :data:`late`. A live-and-archived
    statement's results (a column ``r``) come in ``lace replay``'s order: by their live instance's place, then ``r``."""
    import pyarrow.compute as pc

    from stream.processor import LATE, ORDER

    layouts = {p.layout: p.layout for p in query.plans}
    is_late = pc.equal(results.column("kind"), LATE)
    rejected = results.filter(is_late).sort_by([("pts", "ascending"), ("pid", "ascending")])
    late.clear()
    late.extend(zip(rejected.column("pts").to_pylist(), rejected.column("pid").to_pylist()))
    order = (*ORDER, "r") if "r" in results.column_names else ORDER  # a live-and-archived statement's results
    table = results.filter(pc.invert(is_late)).sort_by([(c, "ascending") for c in order])
    loads = pickle.loads
    for blob in table.column("m").to_pylist():
        m = loads(blob)
        m._layout = layouts.get(m._layout, m._layout)
        yield m


def run(job: StreamJob, events: Iterator[Event]) -> Iterator[Any]:
    """Prepare, detect and return the ordered matches. ``events``: the accepted events (:func:`accepted_events`;
    archive mode: unused, pass an empty iterator).

    Raises
    ------
    StreamJobError
        As :func:`prepare`, or without the Delta connector.
    """
    if job.checkpoint is not None:
        prepare(job, job.checkpoint, events)
        return ordered_matches(run_detection(job, job.checkpoint), job.query)
    with tempfile.TemporaryDirectory(prefix="lace-stream-") as tmp:
        prepare(job, Path(tmp), events)
        return iter(list(ordered_matches(run_detection(job, Path(tmp)), job.query)))
