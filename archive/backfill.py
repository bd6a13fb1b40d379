"""Backfill: run a registered query over archived history on Spark (docs/architecture.md section 7.11, issue 7).

:func:`run_backfill` evaluates a query over ``[from, to)`` of the archive, at a pinned snapshot
version, through the file-list reader (:class:`archive.reader.ArchiveReader`,
:meth:`archive.extractor.Extractor.frame`), every time as int microseconds (no naive timestamps
reach Python, ARCHIVE_NOTES.md pitfall 8).

**Live query** (``PATTERN ...``): the events of the query's types in ``[from - span, to + span)``
(``span``: the query's WITHIN, see :attr:`engine.compiler.CompiledQuery.match_span_us`; the whole archive
when unbounded) are repartitioned by the partition key (one group without PARTITION BY) and
``groupBy(key).applyInArrow`` runs, per key group, the SAME :class:`engine.matcher.Matcher` over the
group's events sorted by ``(ts, id)``. The matches whose start lies in ``[from, to)`` are the result:
exactly the matches live detection (``lace match``) finds over the whole stream that start in the
range. The span before ``from`` gives a match starting at ``from`` the state the events before it
leave (contiguity, skip-till-next consumption); the span after ``to`` completes a match that starts
before ``to`` and ends (or waits out a trailing negation) after it. So backfills of adjacent ranges
``[a, b)``, ``[b, c)`` together give the matches of ``[a, c)``, each once.

**Live-and-archived query** (``LIVE ... ARCHIVED ... LOOKBACK ... JOIN ...``, 001 section 4;
docs/semantics.md section 6): the live side ``P_L`` runs as above over ``[from, to)``, giving the
live instances ``I`` with ``I.start`` in ``[from, to)``; the archived side ``P_A`` runs the same way
over ``[from - LOOKBACK - span_A, to)``, giving the archived instances ``J`` with ``J.start >= from -
LOOKBACK`` and ``J.end < to``. The join runs in Spark: an equi-join on the archive key when the JOIN
equates one (:attr:`engine.live_archived.plan.LiveArchivedPlan.key`), with the access-range
condition ``I.start - LOOKBACK <= J.start``, ``J.end < I.start`` (and the trailing-negation deadline)
as join conditions; ``mapInArrow`` then checks the whole JOIN on each candidate pair with
:meth:`LiveArchivedPlan.joins` and builds the result with :meth:`LiveArchivedPlan.result`. In the
grouped RETURN form (:attr:`LiveArchivedPlan.grouped`: RETURN aggregates an archived variable) the
candidate pairs are grouped by live instance instead (``groupBy`` its wire form, which holds its
events and ids) and ``applyInArrow`` checks the JOIN and builds the one result of each live instance
that joins something with :meth:`LiveArchivedPlan.group`. The results are those of ``lace replay``
over the same events whose live instance starts in the range.

Matches are appended with delta-rs to the results table ``<root>/_backfills/results`` (query,
backfill id, match, start, end) and returned. Progress (percent of the job group's tasks done,
events scanned) goes to a callback; :func:`cancel_backfill` cancels the job group; any failure
raises :class:`BackfillError` with the reason.

The functions that run on the Python workers are :mod:`archive.backfill_workers`, the Delta results table
:mod:`archive.backfill_results`; this module plans the Spark job on the driver, runs it with progress and
cancellation, and keeps every public name importable.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa

from archive.backfill_results import RESULTS_DIR, RESULTS_SCHEMA, read_results, write_results_table
from archive.backfill_workers import _group_fn, _instances_fn, _join_fn

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from archive.backfill_workers import LiveStatement
    from archive.reader import ArchiveReader, Backend
    from engine.event_type import EventType
    from engine.live_archived.plan import LiveArchivedPlan

__all__ = [
    "MAX_US",
    "MIN_US",
    "RESULTS_DIR",
    "RESULTS_SCHEMA",
    "BackfillError",
    "BackfillResult",
    "Progress",
    "cancel_backfill",
    "read_results",
    "run_backfill",
    "write_results_table",
]

MIN_US = -(1 << 62)
MAX_US = 1 << 62
_GROUP_COL = "__lace_group"
_INSTANCE_SCHEMA = "key string, start long, `end` long, payload string"
_OUT_SCHEMA = "query string, match string, start long, `end` long"


class BackfillError(RuntimeError):
    """A backfill that could not run or failed; the message says why."""


@dataclass(slots=True)
class Progress:
    """A progress report: ``percent`` of the job group's known tasks done, ``events`` scanned so far."""

    percent: float
    events: int
    tasks_done: int = 0
    tasks_total: int = 0


@dataclass(slots=True)
class BackfillResult:
    """What a backfill found.

    Attributes
    ----------
    backfill_id : str
    query : str | None
        The query's NAME.
    matches : list[dict]
        ``Match.to_json()`` objects with start in ``[from, to)``, in (start, end, JSON) order.
    lines : list[str]
        The same matches as ``lace match`` JSON lines.
    events_scanned : int
        Events the matchers read (the lookback included).
    versions : dict[str, int]
        The pinned snapshot version of each type's table.
    results_uri : str | None
        The Delta results table (None when nothing was written).
    elapsed_s : float
    """

    backfill_id: str
    query: str | None
    matches: list[dict[str, Any]]
    lines: list[str]
    events_scanned: int
    versions: dict[str, int]
    results_uri: str | None
    elapsed_s: float
    from_us: int = 0
    to_us: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def cancel_backfill(job_group: str, *, spark: SparkSession | None = None) -> None:
    """Cancel the running Spark jobs of a backfill's job group (its ``run_backfill`` raises BackfillError)."""
    from archive.spark import get_spark

    (spark or get_spark()).sparkContext.cancelJobGroup(job_group)


def _progress(spark: SparkSession, job_group: str, events: int) -> Progress:
    tracker = spark.sparkContext.statusTracker()
    done = total = 0
    for job_id in tracker.getJobIdsForGroup(job_group):
        job = tracker.getJobInfo(job_id)
        if job is None:
            continue
        for stage_id in job.stageIds:
            stage = tracker.getStageInfo(stage_id)
            if stage is not None:
                done += stage.numCompletedTasks
                total += stage.numTasks
    return Progress(100.0 * done / total if total else 0.0, events, done, total)


def _reason(exc: BaseException) -> str:
    """A one-line reason from a Spark / Python-worker failure."""
    text = str(exc)
    if "cancel" in text.lower() and ("job group" in text.lower() or "cancelled" in text.lower()):
        return "cancelled"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):  # the Python worker's exception line, e.g. "ValueError: ..."
        head = ln.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and " " not in head and "Py4J" not in head:
            return ln
    return lines[0] if lines else type(exc).__name__


@dataclass(slots=True)
class _Job:
    """What the Spark side of one backfill needs (built on the driver, before the job starts)."""

    spark: SparkSession
    reader: ArchiveReader
    query_text: str
    pins: dict[str, int]
    etypes: dict[str, EventType]
    acc: Any
    partitions: int
    views: ExitStack = field(default_factory=ExitStack)
    """Keeps the temporary views of the scans open until the action is done."""

    def instances(self, compiled: LiveStatement, side: str | None, lo: int, hi: int) -> DataFrame | None:
        """Instance rows ``(key, start, end, payload)`` of one side over the events in ``[lo, hi)``."""
        from pyspark.sql import functions as F

        from archive.extractor import Extractor

        types = [self.etypes[t] for t in sorted(compiled.types) if t in self.pins]
        if not types:
            return None
        df = self.views.enter_context(Extractor(self.reader).frame(types, {None: [(lo, hi)]}, version=self.pins))
        if df is None:
            return None
        keys = list(compiled.partition_by)
        missing = [k for k in keys if k not in df.columns]
        if missing:
            raise BackfillError(f"PARTITION BY attribute(s) {', '.join(missing)} not in the archived types")
        if not keys:
            df = df.withColumn(_GROUP_COL, F.lit(0))
            keys = [_GROUP_COL]
        attrs = {n: list(t.attributes) for n, t in self.etypes.items()}
        fn = _instances_fn(self.query_text, side, attrs, self.acc)
        return df.repartition(self.partitions, *keys).groupBy(*keys).applyInArrow(fn, schema=_INSTANCE_SCHEMA)

    def close(self) -> None:
        """Drop the temporary views."""
        self.views.close()


def _read_range(compiled: LiveStatement, from_us: int, to_us: int) -> tuple[int, int]:
    """The events to read for the matches of ``compiled`` that start in ``[from_us, to_us)``: one span
    (what the statement declares, ``match_span_us``: an INTERVAL statement's runs have no bound) on each side,
    everything when unbounded."""
    span = compiled.match_span_us
    return (MIN_US, MAX_US) if span is None else (from_us - span, to_us + span)


def _live_results(job: _Job, compiled: LiveStatement, from_us: int, to_us: int) -> DataFrame | None:
    from pyspark.sql import functions as F

    df = job.instances(compiled, None, *_read_range(compiled, from_us, to_us))
    if df is None:
        return None
    df = df.where((F.col("start") >= from_us) & (F.col("start") < to_us))
    name = F.lit(compiled.name).cast("string").alias("query")
    return df.select(name, F.col("payload").alias("match"), "start", "end")


def _live_archived_results(job: _Job, plan: LiveArchivedPlan, from_us: int, to_us: int) -> DataFrame | None:
    from pyspark.sql import functions as F


    # archived instances start at or after from - LOOKBACK and end before to
    lo_a = _read_range(plan.archived, from_us - plan.lookback_us, to_us)[0]
    live = job.instances(plan.live, "live", *_read_range(plan.live, from_us, to_us))
    archived = job.instances(plan.archived, "archived", lo_a, to_us)
    if live is None or archived is None:
        return None
    live = live.where((F.col("start") >= from_us) & (F.col("start") < to_us))
    archived = archived.where((F.col("start") >= from_us - plan.lookback_us) & (F.col("end") < to_us))
    L = live.select(F.col("key").alias("lk"), F.col("start").alias("ls"), F.col("payload").alias("lp"))
    A = archived.select(
        F.col("key").alias("ak"), F.col("start").alias("as"), F.col("end").alias("ae"), F.col("payload").alias("ap")
    )
    cond = (F.col("as") >= F.col("ls") - plan.lookback_us) & (F.col("ae") < F.col("ls"))
    if plan.archived_deadline_us is not None:
        cond = cond & (F.col("as") + plan.archived_deadline_us < F.col("ls"))
    if plan.key is not None:
        cond = (F.col("lk") == F.col("ak")) & cond
    pairs = L.join(A, cond, "inner").select("lp", "ap")
    if plan.grouped:  # one result per live instance: its candidate pairs grouped by its identity (wire form)
        return pairs.groupBy("lp").applyInArrow(_group_fn(job.query_text), schema=_OUT_SCHEMA)
    return pairs.mapInArrow(_join_fn(job.query_text), schema=_OUT_SCHEMA)


def run_backfill(
    root: str | Path,
    query_text: str,
    from_us: int,
    to_us: int,
    *,
    spark: SparkSession | None = None,
    version: int | dict[str, int] | None = None,
    job_group: str | None = None,
    progress: Callable[[Progress], None] | None = None,
    backfill_id: str | None = None,
    write_results: bool = True,
    poll_s: float = 0.25,
    cancel: threading.Event | None = None,
    query_id: int | None = None,
    partitions: int | None = None,
    backend: Backend = "auto",
) -> BackfillResult:
    """Evaluate a query (live, or live-and-archived) over the archive's events in ``[from_us, to_us)`` on Spark.

    See the module docstring for what is read and which matches are kept.

    Parameters
    ----------
    root : str | Path
        Archive root.
    query_text : str
        LQL: a live query (``PATTERN ...``) or a live-and-archived one (``LIVE ... ARCHIVED ...``).
    from_us, to_us : int
        The range, int microseconds UTC, half-open; a match (a live instance, for a live-and-archived
        query) is kept when its start lies in it.
    spark : SparkSession, optional
        Default: the process's session (:func:`archive.spark.get_spark`).
    version : int | dict[str, int], optional
        Snapshot pin (default: the current versions, pinned at the start).
    job_group : str, optional
        Spark job group (default ``backfill-<id>``): pass it to :func:`cancel_backfill`.
    progress : callable, optional
        Called with a :class:`Progress` while the job runs, and once at 100% at the end.
    backfill_id : str, optional
        Default: a new UUID hex.
    write_results : bool
        Append the matches to the Delta results table ``<root>/_backfills/results``.
    query_id : int, optional
        The service's id of the query, stored with the results.
    partitions : int, optional
        Partitions of the key groups (default: ``spark.sql.shuffle.partitions``, at least 4 per task slot).
    backend : {"auto", "native", "filelist"}
        The archive reader (:class:`archive.reader.ArchiveReader`); ``auto``: native when the connector is there.
    poll_s : float
        Seconds between progress reports (and cancel checks).
    cancel : threading.Event, optional
        Set it (from any thread) to stop the backfill: its Spark jobs are cancelled (again at every
        poll, so a job submitted after the request is cancelled too) and ``BackfillError("cancelled")``
        is raised, also when the job had already finished. Ctrl-C in the calling thread does the same.

    Raises
    ------
    BackfillError
        For a bad query or range, an unknown event type, a cancelled or failed job.
    """
    from engine.detector import compile_statement
    from engine.lql.errors import QueryError

    t0 = time.perf_counter()
    if to_us <= from_us:
        raise BackfillError(f"empty range: --to ({to_us}) must be after --from ({from_us})")
    try:
        statement = compile_statement(query_text)
        if not statement.backfills:  # what its class declares
            reason = "backfills run pattern queries and INTERVAL statements; FILTER and AGGREGATE run live"
            raise BackfillError(reason)
        # a live-and-archived query (it reads the archive) needs a second side and a join in Spark
        plan = cast("LiveArchivedPlan", statement) if statement.reads_archive else None
        compiled = None if statement.reads_archive else cast("LiveStatement", statement)
        name, wanted = statement.name, sorted(statement.stream_types)
    except QueryError as e:
        raise BackfillError(f"bad query: line {e.line}, column {e.column}: {e.reason}") from None
    backfill_id = backfill_id or uuid.uuid4().hex
    job_group = job_group or f"backfill-{backfill_id}"
    root = Path(root)
    if not root.is_dir():
        raise BackfillError(f"{root}: no such archive directory")

    from archive.reader import ArchiveReader
    from archive.spark import get_spark

    spark = spark if spark is not None else get_spark()
    reader = ArchiveReader(root, spark=spark, backend=backend)
    try:
        etypes = reader.types(wanted)
    except KeyError as e:
        raise BackfillError(str(e.args[0])) from None
    try:
        pins = reader.pin(list(etypes), version)
    except (ValueError, OSError) as e:
        raise BackfillError(f"cannot pin snapshot versions: {e}") from None
    empty = BackfillResult(backfill_id, name, [], [], 0, pins, None, 0.0, from_us, to_us)
    if not pins:
        empty.elapsed_s = time.perf_counter() - t0
        return empty

    sc = spark.sparkContext
    if not os.environ.get("PYSPARK_PYTHON") and not os.environ.get("PYSPARK_DRIVER_PYTHON"):
        # a session started elsewhere (a cluster session, or one made before archive.spark set
        # PYSPARK_PYTHON): the Python workers must have this interpreter's packages (engine, pyarrow)
        sc.pythonExec = sys.executable
    # several key-group partitions per task slot: a few heavy keys do not leave a slot idle at the end
    parts = partitions or max(int(spark.conf.get("spark.sql.shuffle.partitions") or "8"), 4 * sc.defaultParallelism)
    job = _Job(spark, reader, query_text, pins, etypes, sc.accumulator(0), parts)
    outcome: dict[str, Any] = {}
    stop = cancel if cancel is not None else threading.Event()

    def work() -> None:
        try:
            sc.setJobGroup(job_group, f"lace backfill {name or ''} {backfill_id}", interruptOnCancel=True)
            if plan is not None:
                df = _live_archived_results(job, plan, from_us, to_us)
            else:
                assert compiled is not None
                df = _live_results(job, compiled, from_us, to_us)
            outcome["table"] = None if df is None or stop.is_set() else df.toArrow()
        except BaseException as e:  # reported on the caller's thread
            outcome["error"] = e
        finally:
            job.close()

    worker = threading.Thread(target=work, name=f"lace-{job_group}", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(poll_s)
            if stop.is_set():
                sc.cancelJobGroup(job_group)
            elif progress is not None and worker.is_alive():
                progress(_progress(spark, job_group, job.acc.value))
    except KeyboardInterrupt:
        stop.set()
        sc.cancelJobGroup(job_group)
        worker.join()
    if stop.is_set():
        raise BackfillError(f"backfill {backfill_id} cancelled")
    if "error" in outcome:
        err = outcome["error"]
        if isinstance(err, BackfillError):
            raise err
        raise BackfillError(f"backfill {backfill_id} failed: {_reason(err)}") from err

    table: pa.Table | None = outcome.get("table")
    scanned = int(job.acc.value)
    if table is None:
        empty.events_scanned, empty.elapsed_s = scanned, time.perf_counter() - t0
        return empty
    table = table.sort_by([("start", "ascending"), ("end", "ascending"), ("match", "ascending")])
    lines = table.column("match").to_pylist()
    import orjson

    matches = [orjson.loads(s) for s in lines]
    results_uri = None
    if write_results and lines:
        results_uri = write_results_table(root, backfill_id, table, query_id=query_id)
    if progress is not None:
        progress(Progress(100.0, scanned))
    return BackfillResult(
        backfill_id, name, matches, lines, scanned, pins, results_uri, time.perf_counter() - t0, from_us, to_us
    )
