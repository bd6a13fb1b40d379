"""Backfill: run a live query over archived history on Spark (DESIGN.md section 11, issue 7).

:func:`run_backfill` evaluates a compiled live query over ``[from, to)`` of the archive:

1. the archived events of the query's types in ``[from - WITHIN, to)`` are read at a
   pinned snapshot version, through the file-list reader (:class:`archive.reader.ArchiveReader`
   and :meth:`archive.extractor.Extractor.frame`), with every time as int microseconds
   (no naive timestamps reach Python, ARCHIVE_NOTES.md pitfall 8);
2. the rows are repartitioned by the query's partition key (one group without
   PARTITION BY) and ``groupBy(key).applyInArrow`` runs, per key group, the SAME
   :class:`engine.matcher.Matcher` over the group's events sorted by ``(ts, id)``,
   emitting one row per match: query name, ``Match`` JSON (as ``lace match`` writes it),
   start, end;
3. matches whose start lies in ``[from, to)`` are kept, appended with delta-rs to the
   results table ``<root>/_backfills/results`` (query, backfill id, match, start, end)
   and returned.

The lookback of one window lets a match starting at ``from`` see the partial-match
state the events before it leave (contiguity, skip-till-next consumption); events at
or after ``to`` are not read, so matches are those of live detection over the events in
``[from - WITHIN, to)`` (a query without WITHIN reads from the start of the archive).

Progress (percent of the job group's tasks done, events scanned) goes to a callback;
:func:`cancel_backfill` cancels the job group; any failure raises
:class:`BackfillError` with the reason.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

RESULTS_DIR = "_backfills/results"
MIN_US = -(1 << 62)
_GROUP_COL = "__lace_group"
_OUT_SCHEMA = "query string, match string, start long, `end` long, events long"
RESULTS_SCHEMA = pa.schema(
    [
        pa.field("query", pa.string()),
        pa.field("backfill_id", pa.string()),
        pa.field("match", pa.string()),
        pa.field("start", pa.int64()),
        pa.field("end", pa.int64()),
        pa.field("created_at", pa.timestamp("us", tz="UTC")),
    ]
)


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


def _group_fn(query_text: str, attrs_by_type: dict[str, list[str]], acc: Any) -> Callable[[pa.Table], pa.Table]:
    """The per-key-group function shipped to the Python workers: Events in (ts, id) order -> match rows."""

    def run(table: pa.Table) -> pa.Table:
        from engine.compiler import compile_query
        from engine.events import Event
        from engine.io import match_line
        from engine.matcher import Matcher

        compiled = compile_query(query_text)
        matcher = Matcher(compiled)
        table = table.sort_by([("ts", "ascending"), ("id", "ascending")])
        cols = {name: table.column(name).to_pylist() for name in table.column_names}
        ids, types, tss = cols["id"], cols["type"], cols["ts"]
        found = []
        for i in range(table.num_rows):
            etype = types[i]
            attrs = {a: cols[a][i] for a in attrs_by_type.get(etype, ())}
            found.extend(matcher.push(Event(ids[i], etype, tss[i], attrs)))
        found.extend(matcher.flush())
        acc.add(table.num_rows)
        # one extra row without a match carries the group's event count
        return pa.table(
            {
                "query": pa.array([m.query for m in found] + [None], pa.string()),
                "match": pa.array([match_line(m) for m in found] + [None], pa.string()),
                "start": pa.array([m.start for m in found] + [0], pa.int64()),
                "end": pa.array([m.end for m in found] + [0], pa.int64()),
                "events": pa.array([0] * len(found) + [table.num_rows], pa.int64()),
            }
        )

    return run


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
) -> BackfillResult:
    """Evaluate a live query over the archive's events in ``[from_us, to_us)`` on Spark.

    Parameters
    ----------
    root : str | Path
        Archive root.
    query_text : str
        LQL of a live query (PATTERN ... [PARTITION BY ...] [WITHIN ...]).
    from_us, to_us : int
        The range, int microseconds UTC, half-open; matches are kept when their start lies in it.
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

    Raises
    ------
    BackfillError
        For a bad query or range, an unknown event type, a cancelled or failed job.
    """
    from engine.compiler import compile_query
    from engine.lql.errors import QueryError

    t0 = time.perf_counter()
    if to_us <= from_us:
        raise BackfillError(f"empty range: --to ({to_us}) must be after --from ({from_us})")
    try:
        compiled = compile_query(query_text)
    except QueryError as e:
        raise BackfillError(f"bad query: line {e.line}, column {e.column}: {e.reason}") from None
    backfill_id = backfill_id or uuid.uuid4().hex
    job_group = job_group or f"backfill-{backfill_id}"
    root = Path(root)
    if not root.is_dir():
        raise BackfillError(f"{root}: no such archive directory")

    from archive.extractor import Extractor
    from archive.reader import ArchiveReader
    from archive.spark import get_spark

    spark = spark if spark is not None else get_spark()
    reader = ArchiveReader(root, spark=spark)
    try:
        etypes = reader.types(sorted(compiled.types))
    except KeyError as e:
        raise BackfillError(str(e.args[0])) from None
    names = list(etypes)
    try:
        pins = reader.pin(names, version)
    except (ValueError, OSError) as e:
        raise BackfillError(f"cannot pin snapshot versions: {e}") from None
    lo = from_us - compiled.window_us if compiled.window_us is not None else MIN_US
    attrs_by_type = {n: list(t.attributes) for n, t in etypes.items()}
    empty = BackfillResult(backfill_id, compiled.name, [], [], 0, pins, None, 0.0, from_us, to_us)
    if not pins:
        empty.elapsed_s = time.perf_counter() - t0
        return empty

    sc = spark.sparkContext
    if not os.environ.get("PYSPARK_PYTHON") and not os.environ.get("PYSPARK_DRIVER_PYTHON"):
        # a session started elsewhere (a cluster session, or one made before archive.spark set
        # PYSPARK_PYTHON): the Python workers must have this interpreter's packages (engine, pyarrow)
        sc.pythonExec = sys.executable
    acc = sc.accumulator(0)
    outcome: dict[str, Any] = {}

    def job() -> None:
        try:
            sc.setJobGroup(job_group, f"lace backfill {compiled.name or ''} {backfill_id}", interruptOnCancel=True)
            with Extractor(reader).frame(list(etypes.values()), {None: [(lo, to_us)]}, version=pins) as df:
                if df is None:
                    outcome["table"] = None
                    return
                keys = [k for k in compiled.partition_by]
                missing = [k for k in keys if k not in df.columns]
                if missing:
                    raise BackfillError(f"PARTITION BY attribute(s) {', '.join(missing)} not in the archived types")
                if not keys:
                    from pyspark.sql import functions as F

                    df = df.withColumn(_GROUP_COL, F.lit(0))
                    keys = [_GROUP_COL]
                parts = int(spark.conf.get("spark.sql.shuffle.partitions") or "8")
                grouped = df.repartition(parts, *keys).groupBy(*keys)
                fn = _group_fn(query_text, attrs_by_type, acc)
                out = grouped.applyInArrow(fn, schema=_OUT_SCHEMA)
                outcome["table"] = out.toArrow()
        except BaseException as e:  # reported on the caller's thread
            outcome["error"] = e

    worker = threading.Thread(target=job, name=f"lace-{job_group}", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(poll_s)
        if progress is not None and worker.is_alive():
            progress(_progress(spark, job_group, acc.value))
    if "error" in outcome:
        e = outcome["error"]
        if isinstance(e, BackfillError):
            raise e
        raise BackfillError(f"backfill {backfill_id} failed: {_reason(e)}") from e

    table: pa.Table | None = outcome.get("table")
    if table is None:
        empty.elapsed_s = time.perf_counter() - t0
        return empty
    scanned = int(pc.sum(table.column("events")).as_py() or 0)
    starts = table.column("start")
    keep = pc.and_(
        pc.is_valid(table.column("match")), pc.and_(pc.greater_equal(starts, from_us), pc.less(starts, to_us))
    )
    table = table.filter(keep).sort_by([("start", "ascending"), ("end", "ascending"), ("match", "ascending")])
    lines = table.column("match").to_pylist()
    import orjson

    matches = [orjson.loads(s) for s in lines]
    results_uri = None
    if write_results and lines:
        results_uri = write_results_table(root, backfill_id, table)
    if progress is not None:
        progress(Progress(100.0, scanned))
    return BackfillResult(
        backfill_id, compiled.name, matches, lines, scanned, pins, results_uri, time.perf_counter() - t0, from_us, to_us
    )


def write_results_table(root: str | Path, backfill_id: str, table: pa.Table) -> str:
    """Append match rows (query, match, start, end) to ``<root>/_backfills/results`` with delta-rs."""
    from datetime import UTC, datetime

    from deltalake import write_deltalake

    n = table.num_rows
    now = datetime.now(UTC)
    rows = pa.table(
        {
            "query": table.column("query").cast(pa.string()),
            "backfill_id": pa.array([backfill_id] * n, pa.string()),
            "match": table.column("match"),
            "start": table.column("start"),
            "end": table.column("end"),
            "created_at": pa.array([now] * n, pa.timestamp("us", tz="UTC")),
        },
        schema=RESULTS_SCHEMA,
    )
    uri = str(Path(root) / RESULTS_DIR)
    Path(uri).mkdir(parents=True, exist_ok=True)
    write_deltalake(uri, rows, mode="append")
    return uri


def read_results(root: str | Path, backfill_id: str | None = None) -> pa.Table:
    """The results table (optionally one backfill's rows), read with delta-rs."""
    from deltalake import DeltaTable

    uri = str(Path(root) / RESULTS_DIR)
    if not DeltaTable.is_deltatable(uri):
        return RESULTS_SCHEMA.empty_table()
    table = DeltaTable(uri).to_pyarrow_table()
    if backfill_id is not None:
        table = table.filter(pc.equal(table.column("backfill_id"), backfill_id))
    return table
