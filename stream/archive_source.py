"""``lace stream --archive``: the archive's Delta events tables as the stream's source, and the end of a bounded run.

The service's archive (:mod:`archive.writer`) holds one Delta table per event type at ``<root>/<type>``, partitioned
by ``date``, with the columns of :func:`archive.schema.table_schema` (``id``, ``ts`` timestamp[us, UTC], ``ts_end``
for interval types, the attributes, ``ingested_at``, ``ingest_seq``, ``date``).

Source (:func:`source_frame`): for each event type the statement reads, ``spark.readStream.format("delta")`` over
``<root>/<type>``; each micro-batch's rows become the engine's events in a Python worker (``mapInArrow``, with the
archive's own conversion :func:`archive.schema.record_to_output` and :func:`archive.schema.output_to_events`, as the
service reads archived events) and leave in the file mode's source shape (:data:`stream.processor.INPUT_COLUMNS`:
key, event time = ts_end, ts_end, id, pickled event); the types are unioned. From there on the query is the file
mode's: the allowed lateness as the watermark delay, grouped by the PARTITION BY value,
:class:`stream.processor.LaceProcessor`, a Delta results table.

A live-and-archived statement's archived side (:func:`archived_frame`): per micro-batch, its archived types'
tables read by a batch job over the micro-batch's access ranges (by ``date`` and end), keyed by the archive key in
the workers (:func:`to_archived_rows`), only the keys of the micro-batch's live instances becoming events; the live
side is the source above with the live pattern.

End of a bounded run (:func:`tail_rows`): the run reads what the tables hold when it starts
(``trigger(availableNow=True)``) and stops. The file mode ends its stream with a marker row far in event time, but
the watermark is kept in the checkpoint and never goes back: after such a marker, every event archived later would
be behind the watermark, dropped, and a rerun could read nothing. So the stream itself is never ended. Instead,
once the query has stopped, the driver reads each key's matcher state from the checkpoint's last committed batch
(Spark's state data source, ``format("statestore")``), and the keys' matchers are flushed (``Matcher.flush``: end
of stream, what ``lace match`` does at the end of its file) in a batch job that leaves the checkpoint as it was.
Those matches (the tail: trailing negations whose deadline the watermark has not passed, matches completed by
events still held back by the lateness) are written to OUT with the committed results, but are not committed: a
rerun after more events were archived goes on from the unflushed state, where newer events may still complete,
extend or cancel them.

Timestamps are int microseconds UTC.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from engine.compiler import CompiledQuery
from engine.event_type import EventType

SOURCE_SCHEMA = "k string, et timestamp, ts long, id long, ev binary"
"""The rows :func:`source_frame` gives (:data:`stream.processor.INPUT_COLUMNS`), as a Spark DDL string."""


class MissingTableError(RuntimeError):
    """An event type the statement reads has no Delta table in the archive; one line naming the path."""


def event_tables(root: Path, types: Iterable[str]) -> dict[str, Path]:
    """The Delta table of each event type in ``types`` (a statement's), ``{type: <root>/<type>}``, types sorted.

    Raises
    ------
    MissingTableError
        When ``<root>/<type>/_delta_log`` is missing for a type (nothing of it archived yet, or another root).
    """
    tables = {}
    for name in sorted(types):
        path = root / name
        if not (path / "_delta_log").is_dir():
            raise MissingTableError(
                f"{path}: no Delta table of event type {name!r} (the statement reads it; is {root} the archive root "
                "and has an event of that type been archived?)"
            )
        tables[name] = path
    return tables


def archive_types(root: Path, names: list[str]) -> dict[str, EventType]:
    """The archive catalog's event types (``<root>/_lace/types.json``, the writer's) of ``names``.

    Raises
    ------
    MissingTableError
        When one is not in the catalog (a table not written by the archive writer).
    """
    from archive.schema import CATALOG_FILE, load_catalog

    catalog = load_catalog(root)
    for n in names:
        if n not in catalog:
            raise MissingTableError(f"{root / CATALOG_FILE}: event type {n!r} is not registered in the archive")
    return {n: catalog[n] for n in names}


def to_source_rows(text: str, strategy: str | None, etype: EventType) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function of one event type: Arrow record batches of its table's rows -> record batches
    of :data:`SOURCE_SCHEMA` (the grouping key ``repr(query.key_of(event))``, the event time and ts_end, the id, the
    pickled :class:`~engine.events.Event`). Runs in Spark's Python workers (the statement compiled once per
    worker)."""

    def convert(batches: Iterator[Any]) -> Iterator[Any]:
        import pickle

        import pyarrow as pa

        from archive.schema import TS_TYPE, output_to_events, record_to_output
        from stream.processor import compiled_query

        key_of = compiled_query(text, strategy).key_of
        dumps, proto = pickle.dumps, pickle.HIGHEST_PROTOCOL
        for batch in batches:
            events = output_to_events(record_to_output(etype, pa.Table.from_batches([batch])))
            ends = pa.array([e.ts_end for e in events], pa.int64())
            yield pa.RecordBatch.from_arrays(
                [pa.array([repr(key_of(e)) for e in events], pa.string()), ends.cast(TS_TYPE), ends,
                 pa.array([e.id for e in events], pa.int64()),
                 pa.array([dumps(e, proto) for e in events], pa.binary())],
                names=["k", "et", "ts", "id", "ev"],
            )

    return convert


def _record_columns(etype: EventType, present: list[str]) -> list[str]:
    """The columns of ``etype``'s table that :func:`archive.schema.record_to_output` reads (``id``, ``ts``,
    ``ts_end`` of an interval type, the attributes the table has: ``present``)."""
    return ["id", "ts", *(["ts_end"] if etype.interval else []), *(a for a in etype.attributes if a in present)]


def source_frame(spark: Any, root: Path, text: str, strategy: str | None, query: CompiledQuery) -> Any:
    """The streaming DataFrame of the archive's events of ``query``'s types (rows of :data:`SOURCE_SCHEMA`).

    Every source is read without a rate limit (Delta's default is 1,000 files per micro-batch), so a micro-batch
    holds everything the tables gained since the last one. With a limit, one type's files could run ahead of
    another's, and a table's first snapshot is read in file modification order, in which a compacted day's files
    come after the newer days' files: the watermark (the newest event time read so far) would then drop the older
    events as late.

    Raises
    ------
    MissingTableError
        As :func:`event_tables`.
    """
    tables = event_tables(root, query.stream_types)
    types = archive_types(root, list(tables))
    frame = None
    for name, path in tables.items():
        etype = types[name]
        reader = spark.readStream.format("delta").option("ignoreDeletes", "true").option("maxFilesPerTrigger", 1 << 30)
        rows = reader.load(str(path))
        columns = _record_columns(etype, rows.columns)
        part = rows.select(*columns).mapInArrow(to_source_rows(text, strategy, etype), SOURCE_SCHEMA)
        frame = part if frame is None else frame.unionByName(part)
    return frame


ARCHIVED_SCHEMA = "ak string, ev binary"
"""The rows :func:`archived_frame` gives: the event's archive key (:func:`stream.processor.group_key`), the pickled
event."""


def archived_frame(spark: Any, root: Path, text: str, lo: int, hi: int, keys: set[str]) -> Any:
    """A batch DataFrame (:data:`ARCHIVED_SCHEMA`) of the archived side of live-and-archived statement ``text``: the
    events of its archived types in the archive at ``root`` that end in ``[lo, hi)`` (int us; ``ts_end`` of an
    interval type, else ``ts``: as the service's archive requests select, :mod:`archive.extractor`) and whose archive
    key (the key plan's attribute, :meth:`~engine.live_archived.plan.LiveArchivedPlan.key_of`) is one of ``keys``
    (all of them without a key plan: every row then has the key ``""``).

    Spark prunes whole days by the ``date`` partition (the UTC date of ``ts``: at most the date of ``hi``; at least
    the date of ``lo`` for a point type, whose ``ts`` is its end) and files by their ``ts`` statistics; the rows
    left become events in a Python worker (:func:`to_archived_rows`), only those of a wanted key.

    Raises
    ------
    MissingTableError
        As :func:`event_tables` and :func:`archive_types`.
    """
    from pyspark.sql import functions as F

    from archive.reader import iso_us
    from stream.processor import live_archived_plan

    plan = live_archived_plan(text)
    assert plan is not None
    tables = event_tables(root, plan.archived_types)
    types = archive_types(root, list(tables))
    start, stop = F.timestamp_micros(F.lit(lo)), F.timestamp_micros(F.lit(hi))
    last_day, first_day = (iso_us(hi - 1) or "9999")[:10], (iso_us(lo) or "0001")[:10]
    frame = None
    for name, path in tables.items():
        etype = types[name]
        rows = spark.read.format("delta").load(str(path))
        end = F.col("ts_end") if etype.interval else F.col("ts")
        where = (end >= start) & (end < stop) & (F.col("ts") < stop) & (F.col("date") <= last_day)
        if not etype.interval:  # an interval ending in range may start days before
            where = where & (F.col("date") >= first_day)
        columns = _record_columns(etype, rows.columns)
        part = rows.where(where).select(*columns).mapInArrow(to_archived_rows(text, etype, keys), ARCHIVED_SCHEMA)
        frame = part if frame is None else frame.unionByName(part)
    return frame


def to_archived_rows(text: str, etype: EventType, keys: set[str]) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function of one archived event type: Arrow record batches of its table's rows -> record
    batches of :data:`ARCHIVED_SCHEMA`, only the rows whose archive key is in ``keys`` (every row, key ``""``,
    without a key plan). The key is read from the archive's conversion (:func:`archive.schema.record_to_output`,
    timestamps as int us) before any event is built; events as the service reads them
    (:func:`archive.schema.output_to_events`). Runs in Spark's Python workers."""

    def convert(batches: Iterator[Any]) -> Iterator[Any]:
        import pickle

        import pyarrow as pa

        from archive.schema import output_to_events, record_to_output
        from stream.processor import group_key, live_archived_plan

        plan = live_archived_plan(text)
        assert plan is not None
        attr = None if plan.key is None else plan.key.attr
        dumps, proto = pickle.dumps, pickle.HIGHEST_PROTOCOL
        for batch in batches:
            table = record_to_output(etype, pa.Table.from_batches([batch]))
            aks: list[str | None] = [""] * table.num_rows
            if attr is not None:  # an event without the key's value joins nothing
                values = table.column(attr).to_pylist() if attr in table.column_names else [None] * table.num_rows
                aks = [None if v is None else group_key(v) for v in values]
                wanted = [a in keys for a in aks]
                table = table.filter(pa.array(wanted, pa.bool_()))
                aks = [a for a, w in zip(aks, wanted) if w]
            events = output_to_events(table)
            yield pa.RecordBatch.from_arrays(
                [pa.array(aks, pa.string()), pa.array([dumps(e, proto) for e in events], pa.binary())],
                names=["ak", "ev"],
            )

    return convert


def tail_rows(
    spark: Any, checkpoint: Path, text: str, strategy: str | None, lateness_us: int,
    join: Callable[[Any], Any] | None = None,
) -> Any:
    """The matches the keys' states would give at the end of the stream (module docstring), as an Arrow table of
    :data:`stream.processor.OUTPUT_SCHEMA` rows; the state in ``checkpoint`` (Spark's checkpoint folder of the
    query, its last committed batch) is read, not changed. A live-and-archived statement's: its live instances
    (:data:`~stream.processor.LA_OUTPUT_SCHEMA`) joined by ``join`` (the micro-batches' join,
    :func:`stream.job._archive_join`), rows of :data:`~stream.processor.RESULT_SCHEMA`."""
    from stream.processor import LA_OUTPUT_SCHEMA, OUTPUT_SCHEMA, RESULT_SCHEMA, output_table

    schema = OUTPUT_SCHEMA if join is None else LA_OUTPUT_SCHEMA
    if not (checkpoint / "state").is_dir():
        return output_table([], OUTPUT_SCHEMA if join is None else RESULT_SCHEMA)
    spark.streams.active  # noqa: B018 - the state store coordinator the state reader asks for is made with it
    states = (
        spark.read.format("statestore").option("stateVarName", "matcher").load(str(checkpoint))
        .selectExpr("value.matcher AS matcher", "value.n AS n")
    )
    flushed = states.mapInArrow(_flush_states(text, strategy, lateness_us), schema)
    if join is None:
        return flushed.toArrow()
    flushed.persist()  # the join reads the instances more than once (their ranges, keys, groups)
    try:
        return join(flushed).toArrow()
    finally:
        flushed.unpersist()


def _flush_states(text: str, strategy: str | None, lateness_us: int) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def flush(batches: Iterator[Any]) -> Iterator[Any]:
        from engine.matcher import Matcher
        from stream import processor as p
        from stream import state

        query, plan = p.compiled_query(text, strategy), p.live_archived_plan(text)
        for batch in batches:
            rows: list[tuple[Any, ...]] = []
            for blob, n in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
                if blob is None:
                    continue
                matcher = state.load(Matcher(query, allowed_lateness_us=lateness_us), blob)
                found = matcher.flush()
                done = p.match_rows(matcher, int(n or 0), found)
                rows.extend(done if plan is None else p.instance_rows(plan, found, done))
            yield from p.output_table(rows, p.OUTPUT_SCHEMA if plan is None else p.LA_OUTPUT_SCHEMA).to_batches()

    return flush
