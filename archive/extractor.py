"""The archived-event extractor of 001 section 3.3, on Spark (docs/architecture.md section 7.8).

``extract(types, keys, ranges)`` answers one archive request with **at most one Spark action**:

1. the ranges are merged into disjoint intervals per key (:mod:`archive.ranges`);
2. per type, the snapshot's files that may hold a (key, interval) pair are selected from
   the Delta log's statistics (:meth:`archive.reader.ArchiveReader.files`). A type whose
   selected files hold at most ``local_read_bytes`` (``LACE_ARCHIVE_LOCAL_READ_MB``, default
   64 MiB) is read here with Arrow, without Spark (:meth:`archive.reader.ArchiveReader.read_arrow`):
   a Spark job's fixed cost (planning, scheduling, code generation: 0.3-1 s of JVM CPU) is
   most of a small lookup's. The other types go to one Spark job, which scans exactly those files;
3. the scan is joined with an inline table of ``(key, lo, hi)`` rows, broadcast (a
   range join: ``key = k AND ts >= lo AND ts < hi``), never a long OR chain, which
   costs 10-50x on large tables; coarse ``ts`` bounds and ``key IN (...)`` are added
   only so Parquet can skip row groups;
4. the types are combined with ``UNION ALL`` in the same SQL statement (one plan,
   few py4j round trips) and collected with ``toArrow()``. Spark builds the small
   broadcast table in a tiny job of its own; the scan, join and collect are one job;
5. the matching events still in the recent buffer are added, duplicates (an event
   being flushed is in both) dropped by ``(type, id)``, and the rows sorted by
   ``(ts, id)``.

Times cross the edges as int microseconds UTC: ``timestamp_micros`` into Spark,
``unix_micros`` out, so no session or Python time zone is involved.
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from archive.buffer import RecentBuffer
from archive.pushdown import apply_filter
from archive.ranges import Ranges, Request, hull, make_request
from archive.reader import ArchiveReader, iso_us
from archive.schema import US_PER_DAY, conform, output_schema, record_to_output
from engine.event_type import EventType

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

LOCAL_READ_MB = 64  # requests whose files hold at most this many MiB per type are read without Spark


def local_read_bytes_from_env(environ: Mapping[str, str] | None = None) -> int:
    """``LACE_ARCHIVE_LOCAL_READ_MB`` (default :data:`LOCAL_READ_MB`) in bytes; 0: every request is a Spark job.

    >>> local_read_bytes_from_env({"LACE_ARCHIVE_LOCAL_READ_MB": "0.5"})
    524288
    """
    env = os.environ if environ is None else environ
    return mib_bytes("LACE_ARCHIVE_LOCAL_READ_MB", env.get("LACE_ARCHIVE_LOCAL_READ_MB", ""), LOCAL_READ_MB)


def mib_bytes(name: str, text: str, default_mb: float) -> int:
    """The value ``text`` of setting ``name``, a number of MiB (blank: ``default_mb``), in bytes, at least 0.

    Raises
    ------
    ValueError
        When ``text`` is not a number (the message names the setting).

    >>> mib_bytes("LACE_X_MB", " 1.5 ", 64)
    1572864
    """
    text = text.strip()
    try:
        mb = float(text) if text else default_mb
    except ValueError:
        raise ValueError(f"{name} must be a number of MiB, not {text!r}") from None
    return max(0, int(mb * (1 << 20)))


class Extractor:
    """Archive requests over an :class:`~archive.reader.ArchiveReader` and, optionally, a recent buffer.

    Parameters
    ----------
    reader : ArchiveReader
    buffer : RecentBuffer, optional
        The writer's buffer (``ArchiveWriter.buffer``) when reader and writer share a process.
    local_read_bytes : int, optional
        A type whose selected files hold at most this many bytes is read in this process, without
        Spark (:meth:`archive.reader.ArchiveReader.read_arrow`); larger ones, and tables whose files
        alone do not hold their rows, are read by the Spark job. 0: always Spark. Default:
        :func:`local_read_bytes_from_env`.
    """

    def __init__(
        self, reader: ArchiveReader, *, buffer: RecentBuffer | None = None, local_read_bytes: int | None = None
    ) -> None:
        self.reader = reader
        self.buffer = buffer
        self.local_read_bytes = local_read_bytes_from_env() if local_read_bytes is None else local_read_bytes
        self.local_reads = 0  # types read without Spark (counted per type and request)

    def extract(
        self,
        types: str | Iterable[str],
        keys: Iterable[Hashable] | None,
        ranges: Ranges,
        *,
        version: int | dict[str, int] | None = None,
        include_recent: bool | None = None,
        where: pc.Expression | None = None,
    ) -> pa.Table:
        """Events of ``types`` whose key is in ``keys`` and whose end lies in ``ranges`` (``ts_end`` of an
        interval type, ``ts`` of a point type: the matcher's order, issue 24 item 4).

        Parameters
        ----------
        types : str | Iterable[str]
            Event type names.
        keys : Iterable, optional
            Values of each type's key attribute; None: every key.
        ranges : sequence of (lo, hi), or mapping key -> sequence of (lo, hi)
            Half-open ``[lo, hi)`` in int microseconds UTC; a mapping gives each key its
            own ranges (then ``keys``, when given, restricts it).
        version : int | dict[str, int], optional
            Snapshot pin (from :meth:`ArchiveReader.snapshot`) for repeatable reads;
            default: the current versions.
        include_recent : bool, optional
            Add the matching events of the recent buffer; default: only when no version
            is pinned (buffered events are not part of a pinned snapshot).
        where : pyarrow.compute.Expression, optional
            Only the rows passing this filter over the output columns (e.g. an archived
            pattern's single-event conditions, :func:`archive.pushdown.single_event_filter`).

        Returns
        -------
        pyarrow.Table
            :func:`archive.schema.output_schema` of the types: ``id``, ``type``, ``ts``
            (int64 us) and the attributes (timestamps as int64 us), in (ts, id) order.
        """
        names = [types] if isinstance(types, str) else list(dict.fromkeys(types))
        etypes = list(self.reader.types(names).values())
        schema = output_schema(etypes)
        request = make_request(keys, ranges)
        if not request:
            return schema.empty_table()
        parts = []
        recent = include_recent if include_recent is not None else version is None
        if recent and self.buffer is not None:
            # the buffer first, then Delta: a flush commits to Delta before it drops the buffer's rows, so
            # an event flushed between the two reads is in the second one (duplicates are removed below);
            # read the other way round, it would be in neither
            parts.append(apply_filter(conform(self.buffer.query(names, request), schema), where))
        pins = self.reader.pin(names, version)
        by_spark = []
        for etype in etypes:
            if etype.name not in pins:
                continue  # nothing archived yet
            if self._read_here(etype, pins[etype.name], request):
                rows = self.reader.read_arrow(etype.name, version=pins[etype.name], request=request)
                parts.append(apply_filter(conform(record_to_output(etype, rows), schema), where))
                self.local_reads += 1
            else:
                by_spark.append(etype)
        if by_spark:
            with self.frame(by_spark, request, version=pins) as df:
                if df is not None:
                    parts.append(apply_filter(conform(df.toArrow(), schema), where))
        if not parts:
            return schema.empty_table()
        return _dedupe_sorted(pa.concat_tables(parts))

    def _read_here(self, etype: EventType, version: int, request: Request) -> bool:
        """Whether ``etype``'s part of ``request`` is small enough to read without Spark, and readable so."""
        if self.local_read_bytes <= 0 or not self.reader.readable_file_by_file(etype.name, version=version):
            return False
        if None not in request:
            if etype.partition_key is None:
                return False  # the Spark path raises the error
            for key in request:
                _check_key(key, etype.attributes[etype.partition_key], etype)
        index = self.reader.file_index(etype.name, version=version)
        return int(index.sizes[index.select(request)].sum()) <= self.local_read_bytes

    @contextmanager
    def frame(
        self,
        etypes: Sequence[EventType],
        request: Request,
        *,
        version: int | dict[str, int] | None = None,
        with_key: bool = False,
    ) -> Iterator[DataFrame | None]:
        """The events of ``etypes`` matching ``request`` as ONE DataFrame (None when no type has a table).

        Output-shaped columns (plus ``__key``, the key as a string, with ``with_key``).
        Used by :meth:`extract` and by :mod:`archive.stats`; valid inside the ``with``
        block only (it reads temporary views).

        The plan is one SQL statement: few py4j round trips, one analysis. An empty ``request`` (no key, or only
        empty ranges, e.g. OLLAA's count over ``[wm, wm)``) selects nothing: None, no statement (Spark refuses the
        ``key IN ()`` it would hold).
        """
        if not request:
            yield None
            return
        pins = self.reader.pin([t.name for t in etypes], version)
        out = output_schema(etypes)
        keyed = None not in request
        spark = self.reader.spark
        views, selects = [], []
        try:
            for etype in etypes:
                if etype.name not in pins:
                    continue  # nothing archived yet
                if keyed and etype.partition_key is None:
                    raise ValueError(f"type {etype.name} has no key attribute: request it by time ranges only")
                df = self.reader.scan(etype.name, version=pins[etype.name], request=request)
                view = f"lace_{etype.name}_{uuid.uuid4().hex}"
                df.createOrReplaceTempView(view)
                views.append(view)
                selects.append(_type_sql(etype, view, request, out, set(df.columns), with_key=with_key))
            yield spark.sql("\nUNION ALL\n".join(selects)) if selects else None
        finally:
            for view in views:
                spark.catalog.dropTempView(view)


def _type_sql(
    etype: EventType, view: str, request: Request, out: pa.Schema, present: set[str], *, with_key: bool
) -> str:
    """SELECT of one type's events in ``request``: a broadcast range join with an inline table of (key, lo, hi).

    An event is in a range when its end is (``ts_end`` of an interval type, else ``ts``), as
    :meth:`engine.live_archived.source.ArchiveSource.extract` says."""
    keyed = None not in request
    end = "t.ts_end" if etype.interval else "t.ts"  # requests select events by their end (the matcher's order)
    cols = ["t.id", f"'{etype.name}' AS type", "unix_micros(t.ts) AS ts"]
    for f in out:
        if f.name in ("id", "type", "ts"):
            continue
        if f.name == "ts_end":  # issue 15: interval types store their end; point events of a mixed extract: null
            cols.append("unix_micros(t.ts_end) AS ts_end" if etype.interval else "CAST(NULL AS BIGINT) AS ts_end")
            continue
        kind = etype.attributes.get(f.name)
        if kind is None or f.name not in present:
            cols.append(f"CAST(NULL AS {_spark_type(f.type)}) AS `{f.name}`")
        elif kind == "timestamp":
            cols.append(f"unix_micros(t.`{f.name}`) AS `{f.name}`")
        else:
            cols.append(f"t.`{f.name}`")
    if with_key:
        key = etype.partition_key
        cols.append(f"CAST(t.`{key}` AS STRING) AS __key" if key else "CAST(NULL AS STRING) AS __key")
    kind = etype.attributes[etype.partition_key] if keyed and etype.partition_key else None
    if keyed:
        rows = [f"({_literal(k, kind, etype)}, {lo}L, {hi}L)" for k, rs in request.items() for lo, hi in rs]
        req = "SELECT col1 AS k, timestamp_micros(col2) AS lo, timestamp_micros(col3) AS hi FROM VALUES "
        req += ", ".join(rows)
        on = f"t.`{etype.partition_key}` = r.k AND {end} >= r.lo AND {end} < r.hi"
        where = f"t.`{etype.partition_key}` IN ({', '.join(_literal(k, kind, etype) for k in request)})"
    else:
        rows = [f"({lo}L, {hi}L)" for lo, hi in request[None]]
        req = "SELECT timestamp_micros(col1) AS lo, timestamp_micros(col2) AS hi FROM VALUES " + ", ".join(rows)
        on = f"{end} >= r.lo AND {end} < r.hi"
        where = "TRUE"
    span = hull(request)
    if span is not None:
        # coarse bounds Parquet and Delta's data skipping push down to row groups and files; the join is exact.
        # Widened to whole UTC days: Spark compiles the literals into the code it generates, so bounds that
        # differ per request cost two new classes each (~85 ms of JVM CPU), where those of days already seen
        # reuse the compiled code.
        lo_day, hi_day = span[0] // US_PER_DAY * US_PER_DAY, -(-span[1] // US_PER_DAY) * US_PER_DAY
        where += f" AND {end} >= timestamp_micros({lo_day}L) AND t.ts < timestamp_micros({hi_day}L)"
        if "date" in present:  # the partition column (UTC date of ts): whole days skipped before any file is opened
            last_day, first_day = iso_us(span[1] - 1), iso_us(span[0])
            if last_day is not None:
                where += f" AND t.date <= '{last_day[:10]}'"
            if first_day is not None and not etype.interval:  # an interval ending in range may start days before
                where += f" AND t.date >= '{first_day[:10]}'"
    return f"SELECT /*+ BROADCAST(r) */ {', '.join(cols)} FROM {view} t JOIN ({req}) r ON {on} WHERE {where}"


def _check_key(value: Hashable, kind: str | None, etype: EventType) -> None:
    """Raise ValueError unless ``value`` is a key value of attribute type ``kind``."""
    ok = {
        "string": isinstance(value, str),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "timestamp": isinstance(value, int) and not isinstance(value, bool),
    }.get(kind or "", False)
    if not ok:
        raise ValueError(f"keys of type {etype.name} must be {kind} values ({etype.partition_key}), not {value!r}")


def _literal(value: Hashable, kind: str | None, etype: EventType) -> str:
    """A Spark SQL literal of a key value of attribute type ``kind``."""
    _check_key(value, kind, etype)
    if kind == "string":
        return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"
    if kind == "int":
        return f"{value}L"
    if kind == "float":
        return f"CAST({float(value)!r} AS DOUBLE)"  # type: ignore[arg-type]
    if kind == "bool":
        return "TRUE" if value else "FALSE"
    return f"timestamp_micros({value}L)"


def _spark_type(t: pa.DataType) -> str:
    if pa.types.is_int64(t):
        return "bigint"
    if pa.types.is_floating(t):
        return "double"
    if pa.types.is_boolean(t):
        return "boolean"
    return "string"


def _dedupe_sorted(table: pa.Table) -> pa.Table:
    """Sort by (ts, id, type) and drop repeated (type, id): an event being flushed is in Delta and the buffer."""
    table = table.sort_by([("ts", "ascending"), ("id", "ascending"), ("type", "ascending")])
    n = table.num_rows
    if n < 2:
        return table
    ids, types = table.column("id"), table.column("type")
    dup = pc.and_(pc.equal(ids.slice(1), ids.slice(0, n - 1)), pc.equal(types.slice(1), types.slice(0, n - 1)))
    if not pc.any(dup).as_py():
        return table
    return table.filter(pa.concat_arrays([pa.array([True]), pc.invert(dup).combine_chunks()]))
