"""Reading the archive's Delta tables (docs/architecture.md section 7.8, ARCHIVE_NOTES.md).

Two Spark backends give the same rows:

* ``native``: ``spark.read.format("delta")`` at a pinned version; only when the Delta
  connector is on the classpath (see :mod:`archive.spark`).
* ``filelist``: the pinned snapshot's *active* files (from delta-rs), pruned by the
  ``date`` partition and by min/max statistics of the end time and the key
  (:class:`FileIndex`), and Spark reads exactly those Parquet files with the Delta schema
  and ``basePath`` (for the partition column). Reading the table directory instead would
  also read files that compaction removed. Tables with deletion vectors or column mapping
  (or any reader feature not known to be safe) are refused: their Parquet files alone do
  not hold the table's rows.

and one without Spark, for small requests (issue 25): :meth:`ArchiveReader.read_arrow`
reads the same pruned files with Arrow in this process, whatever the backend, when the
version's files alone hold its rows.

Every read is at a snapshot version (:meth:`ArchiveReader.snapshot`), so a caller that
pins the versions gets repeatable reads.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar
from urllib.parse import unquote

import numpy as np

from archive.decoded_files import DecodedFiles
from archive.ranges import Range, Request, hull, request_mask, time_union
from archive.schema import CATALOG_FILE, TS_TYPE, US_PER_DAY, load_catalog, record_schema
from archive.spark import get_spark, native_delta_available
from engine.event_type import EventType

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession

Backend = Literal["auto", "native", "filelist"]
SAFE_READER_FEATURES = frozenset({"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck"})
MAX_PAIR_CELLS = 4_000_000  # files x (key, interval) pairs compared one by one when selecting files
STATS_SLACK_US = 1_000  # ts min/max stats in the Delta log are truncated to milliseconds
_CACHE_SIZE = 32
_T = TypeVar("_T")


class UnreadableTableError(RuntimeError):
    """A table the ``filelist`` backend cannot read correctly (deletion vectors, column mapping, ...)."""


def iso_us(us: int) -> str | None:
    """int microseconds UTC -> ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (None outside years 1-9999).

    >>> iso_us(1_000_000)
    '1970-01-01T00:00:01.000000Z'
    """
    try:
        dt = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)
    except OverflowError:
        return None
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class FileIndex:
    """The active files of one table version with what pruning needs, from the Delta log's add actions.

    Built once per (table, version) (delta-rs ``get_add_actions``, a few ms) and cached, so selecting the
    files of a request is a few vectorized comparisons instead of a predicate delta-rs parses and plans
    again every time (measured: 50-300 ms for a request of 449 keys).

    Attributes
    ----------
    paths : list[str]
        Absolute file paths (what ``DeltaTable.file_uris`` gives).
    sizes, rows : numpy.ndarray
        Bytes and records per file.
    day : numpy.ndarray
        The ``date`` partition as days since 1970-01-01 (int64).
    end_min, end_max : numpy.ndarray
        Min/max statistics of the column requests select by (``ts_end`` of an interval type, else ``ts``)
        in int microseconds; ``end_max`` already widened by :data:`STATS_SLACK_US` (statistics truncated to
        milliseconds); files without statistics get the widest bounds.
    key_min, key_max : numpy.ndarray, optional
        Min/max statistics of the key attribute (object arrays, None where a file has none); None when the
        type has no key or its kind is not pruned by (only string, int and float keys are).
    """

    paths: list[str]
    sizes: np.ndarray
    rows: np.ndarray
    day: np.ndarray
    end_min: np.ndarray
    end_max: np.ndarray
    key_min: np.ndarray | None
    key_max: np.ndarray | None
    interval: bool

    @classmethod
    def build(cls, dt: DeltaTable, uri: str, etype: EventType) -> FileIndex:
        import pyarrow as pa
        import pyarrow.compute as pc

        actions = pa.table(dt.get_add_actions(flatten=True))
        n = actions.num_rows
        names = set(actions.column_names)
        end = "ts_end" if etype.interval else "ts"

        def micros(column: str, fill: int) -> np.ndarray:
            if column not in names:
                return np.full(n, fill, dtype=np.int64)
            return pc.fill_null(actions.column(column).cast(pa.int64()), fill).to_numpy().astype(np.int64)

        end_max = micros(f"max.{end}", _NO_UPPER - STATS_SLACK_US)
        days = actions.column("partition.date").cast(pa.date32()).cast(pa.int32()).to_numpy().astype(np.int64)
        key_min = key_max = None
        kind = etype.attributes.get(etype.partition_key or "")
        if kind in _KEY_STATS and f"min.{etype.partition_key}" in names and f"max.{etype.partition_key}" in names:
            key_min = np.array(actions.column(f"min.{etype.partition_key}").to_pylist(), dtype=object)
            key_max = np.array(actions.column(f"max.{etype.partition_key}").to_pylist(), dtype=object)
        root = uri.rstrip("/")
        return cls(
            paths=[f"{root}/{unquote(p)}" for p in actions.column("path").to_pylist()],
            sizes=actions.column("size_bytes").to_numpy().astype(np.int64),
            rows=pc.fill_null(actions.column("num_records"), -1).to_numpy().astype(np.int64)
            if "num_records" in names
            else np.full(n, -1, dtype=np.int64),
            day=days,
            end_min=micros(f"min.{end}", _NO_LOWER),
            end_max=end_max + STATS_SLACK_US,
            key_min=key_min,
            key_max=key_max,
            interval=etype.interval,
        )

    def select(self, request: Request | None) -> np.ndarray:
        """Boolean mask of the files that may hold an event of ``request`` (None: every file).

        A file's span is its ``date`` partition's day (an interval event ending in range may start
        days before: for interval types only the end of the day bounds it) cut by its end statistics.
        A file is kept when its span meets one of the request's intervals; for a keyed request, an
        interval of a key that lies within the file's key statistics (pair by pair, up to
        :data:`MAX_PAIR_CELLS` files x (key, interval) pairs; beyond, the key set and the union of the
        intervals separately). A superset: the read filters rows exactly.
        """
        n = len(self.paths)
        if not request:
            return np.ones(n, dtype=bool) if request is None else np.zeros(n, dtype=bool)
        day_lo = self.day * US_PER_DAY
        lo = np.maximum(day_lo, self.end_min)
        hi = self.end_max if self.interval else np.minimum(day_lo + (US_PER_DAY - 1), self.end_max)
        union = time_union(request)
        keep = _overlaps(_los(union), _his(union), lo, hi)
        if None in request or self.key_min is None or self.key_max is None:
            return keep
        span = self._key_span(request)
        if span is None:
            return keep
        first, last, keys = span
        keep &= first < last
        pairs = [(i, r) for i, k in enumerate(keys) for r in request[k]]
        if len(pairs) * n > MAX_PAIR_CELLS:
            return keep
        slot = np.fromiter((i for i, _ in pairs), dtype=np.int64, count=len(pairs))
        plo, phi = _los([r for _, r in pairs]), _his([r for _, r in pairs])
        cells = (slot >= first[:, None]) & (slot < last[:, None]) & (plo <= hi[:, None]) & (phi > lo[:, None])
        return keep & cells.any(axis=1)

    def _key_span(self, request: Request) -> tuple[np.ndarray, np.ndarray, list[Any]] | None:
        """Per file, the positions ``[first, last)`` of the requested keys (sorted) its key statistics hold, and the
        sorted keys; files without key statistics hold them all. None when keys and statistics do not compare."""
        assert self.key_min is not None and self.key_max is not None
        try:
            keys = sorted(request)  # type: ignore[type-var]
        except TypeError:
            return None
        wanted = np.empty(len(keys), dtype=object)
        wanted[:] = keys
        first = np.zeros(len(self.paths), dtype=np.int64)
        last = np.full(len(self.paths), len(keys), dtype=np.int64)
        known = np.array([a is not None and b is not None for a, b in zip(self.key_min, self.key_max)], dtype=bool)
        if known.any():
            try:
                first[known] = np.searchsorted(wanted, self.key_min[known], side="left")
                last[known] = np.searchsorted(wanted, self.key_max[known], side="right")
            except TypeError:  # keys and statistics of different kinds: no pruning by key
                return None
        return first, last, keys


_NO_LOWER = -(1 << 62)
_NO_UPPER = 1 << 62
_KEY_STATS = frozenset({"string", "int", "float"})


def _los(ranges: Sequence[Range]) -> np.ndarray:
    return np.fromiter((r[0] for r in ranges), dtype=np.int64, count=len(ranges))


def _his(ranges: Sequence[Range]) -> np.ndarray:
    return np.fromiter((r[1] for r in ranges), dtype=np.int64, count=len(ranges))


def _overlaps(los: np.ndarray, his: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per row, whether the closed span ``[lo, hi]`` meets one of the sorted disjoint half-open ``[los, his)``."""
    j = np.searchsorted(his, lo, side="right")  # the first interval ending after lo
    ok = j < len(his)
    out = np.zeros(len(lo), dtype=bool)
    out[ok] = los[j[ok]] <= hi[ok]
    return out


def check_filelist_readable(dt: DeltaTable, name: str) -> None:
    """Raise :class:`UnreadableTableError` unless the table's Parquet files alone hold its rows."""
    proto = dt.protocol()
    features = set(proto.reader_features or ())
    config = dt.metadata().configuration or {}
    if "deletionVectors" in features or "columnMapping" in features:
        bad = sorted(features & {"deletionVectors", "columnMapping"})
        raise UnreadableTableError(f"table {name}: {', '.join(bad)} need the native Delta reader (set LACE_DELTA_JAR)")
    if config.get("delta.columnMapping.mode", "none") != "none":
        raise UnreadableTableError(f"table {name}: column mapping needs the native Delta reader (set LACE_DELTA_JAR)")
    unknown = features - SAFE_READER_FEATURES
    if proto.min_reader_version > 3 or unknown:
        raise UnreadableTableError(
            f"table {name}: reader protocol {proto.min_reader_version} with features {sorted(unknown)} "
            "is not readable file by file; use the native Delta reader"
        )


@dataclass(frozen=True, slots=True)
class _Version:
    """What a reader keeps of one table version: the Spark schema, the file index, and why its files cannot be
    read alone (None: they can)."""

    spark_schema: Any
    files: FileIndex
    unreadable: str | None


class ArchiveReader:
    """Spark DataFrames over the archive's tables at pinned versions.

    Parameters
    ----------
    root : str | Path
        The archive root (see :class:`archive.writer.ArchiveWriter`).
    spark : SparkSession, optional
        Default: the process's session (:func:`archive.spark.get_spark`).
    backend : {"auto", "native", "filelist"}
        ``auto`` picks ``native`` when the Delta connector is available.
    decoded_bytes : int, optional
        Budget of the files :meth:`read_arrow` keeps decoded (:class:`archive.decoded_files.DecodedFiles`);
        0: none, every read decodes its files. Default: ``LACE_ARCHIVE_CACHE_MB``.

    Raises
    ------
    RuntimeError
        For ``backend="native"`` without the connector.
    """

    def __init__(
        self, root: str | Path, *, spark: SparkSession | None = None, backend: Backend = "auto",
        decoded_bytes: int | None = None,
    ) -> None:
        self.root = Path(root)
        self.spark = spark if spark is not None else get_spark()
        native = native_delta_available(self.spark)
        if backend == "native" and not native:
            raise RuntimeError("the native Delta reader needs the Delta Spark connector JAR (LACE_DELTA_JAR)")
        self.backend: Literal["native", "filelist"] = "native" if backend == "native" or (
            backend == "auto" and native
        ) else "filelist"
        self._lock = threading.Lock()
        self._tables: OrderedDict[tuple[str, int], _Version] = OrderedDict()
        self._frames: OrderedDict[tuple[str, int], DataFrame] = OrderedDict()
        self._types: dict[str, EventType] = {}
        self._types_stamp = -1
        self._latest: dict[str, DeltaTable] = {}
        self.decoded = DecodedFiles(decoded_bytes)

    # ------------------------------------------------------------------ metadata

    def types(self, names: Iterable[str] | None = None) -> dict[str, EventType]:
        """Registered event types (the archive catalog, reread when the writer changed it)."""
        path = self.root / CATALOG_FILE
        stamp = path.stat().st_mtime_ns if path.exists() else 0
        if stamp != self._types_stamp:
            self._types, self._types_stamp = load_catalog(self.root), stamp
        if names is None:
            return dict(self._types)
        wanted = list(names)
        missing = [n for n in wanted if n not in self._types]
        if missing:
            raise KeyError(f"unknown event type(s) {', '.join(missing)} in archive {self.root}")
        return {n: self._types[n] for n in wanted}

    def table_uri(self, name: str) -> str:
        return str(self.root / name)

    def snapshot(self, names: Iterable[str] | None = None) -> dict[str, int]:
        """Current version of each table (types without a table yet are left out): pin it for repeatable reads."""
        from deltalake import DeltaTable

        out = {}
        for name in self.types(names):
            with self._lock:
                latest = self._latest.get(name)
                if latest is None:
                    uri = self.table_uri(name)
                    if not DeltaTable.is_deltatable(uri):
                        continue
                    latest = self._latest[name] = DeltaTable(uri)
                else:
                    latest.update_incremental()  # ~1 ms, where loading the table again costs ~10
                out[name] = latest.version()
        return out

    def pin(self, names: Sequence[str], version: int | dict[str, int] | None) -> dict[str, int]:
        """Versions to read: ``version`` (an int pins a single type), else the current snapshot."""
        if version is None:
            return self.snapshot(names)
        if isinstance(version, int):
            if len(names) != 1:
                raise ValueError("an int version pins one type; pass {type: version} for several")
            return {names[0]: version}
        current = self.snapshot([n for n in names if n not in version])
        return {**current, **{n: v for n, v in version.items() if n in names}}

    def _cached(self, cache: OrderedDict[tuple[str, int], _T], key: tuple[str, int], build: Callable[[], _T]) -> _T:
        """``cache[key]``, built by ``build()`` (outside the lock) on a miss; least recently used entries beyond
        :data:`_CACHE_SIZE` are dropped."""
        with self._lock:
            hit = cache.get(key)
            if hit is not None:
                cache.move_to_end(key)
                return hit
        value = build()
        with self._lock:
            cache[key] = value
            while len(cache) > _CACHE_SIZE:
                cache.popitem(last=False)
        return value

    def _version(self, name: str, version: int) -> _Version:
        def build() -> _Version:
            from deltalake import DeltaTable

            with self._lock:
                latest = self._latest.get(name)
                if latest is not None and latest.version() == version:
                    # the version snapshot() just brought the table to: no second replay of the log (tens of ms
                    # a version, and the service's archive gets a version every flush); under the lock, which
                    # snapshot() holds while it moves the table on
                    return self._describe(name, latest)
            return self._describe(name, DeltaTable(self.table_uri(name), version=version))

        return self._cached(self._tables, (name, version), build)

    def _describe(self, name: str, dt: DeltaTable) -> _Version:
        from pyspark.sql.types import StructType

        try:
            check_filelist_readable(dt, name)
            unreadable = None
        except UnreadableTableError as exc:
            if self.backend == "filelist":
                raise
            unreadable = str(exc)
        schema = StructType.fromJson(json.loads(dt.schema().to_json()))
        # a type's key can be added by a later schema evolution: an index built before only prunes by time
        index = FileIndex.build(dt, self.table_uri(name), self.types([name])[name])
        return _Version(schema, index, unreadable)

    # ------------------------------------------------------------------ reading

    def file_index(self, name: str, *, version: int) -> FileIndex:
        """The active files of ``name`` at ``version`` with their statistics (cached per version)."""
        return self._version(name, version).files

    def files(self, name: str, *, version: int, request: Request | None = None) -> list[str]:
        """Active files of ``name`` at ``version`` that may hold events matching ``request`` (None: all)."""
        index = self.file_index(name, version=version)
        return [p for p, keep in zip(index.paths, index.select(request)) if keep]

    def readable_file_by_file(self, name: str, *, version: int) -> bool:
        """Whether the version's Parquet files alone hold its rows (no deletion vectors, column mapping, ...)."""
        return self._version(name, version).unreadable is None

    def read_arrow(self, name: str, *, version: int, request: Request) -> pa.Table:
        """The rows of ``name`` at ``version`` matching ``request`` exactly, read in this process without Spark.

        delta-rs's add actions select the files (:meth:`FileIndex.select`); their rows come from the files kept
        decoded (:attr:`decoded`, issue 43) cut to the request's key set and time hull, or, with no budget
        for them, from an Arrow scan with the same conditions pushed down; the rows are then filtered exactly
        by key and range (:func:`archive.ranges.request_mask`). Record-shaped, without
        ``ingested_at`` and ``ingest_seq`` (attributes the version lacks are nulls).

        Raises
        ------
        UnreadableTableError
            When the version's files alone do not hold its rows (read it through Spark instead).
        """
        import pyarrow as pa
        import pyarrow.dataset as ds

        v = self._version(name, version)
        if v.unreadable is not None:
            raise UnreadableTableError(v.unreadable)
        etype = self.types([name])[name]
        schema = record_schema(etype)
        schema = schema.remove(schema.get_field_index("ingest_seq")).remove(schema.get_field_index("ingested_at"))
        paths = [p for p, keep in zip(v.files.paths, v.files.select(request)) if keep]
        if not paths:
            return schema.empty_table()
        end = "ts_end" if etype.interval else "ts"
        span = hull(request)
        key = etype.partition_key if None not in request else None
        if self.decoded.max_bytes > 0:
            table = self.decoded.select(paths, schema, end, key, span, None if key is None else list(request))
            return table.filter(pa.array(request_mask(etype, table, request)))
        where = None
        if span is not None:
            lo, hi = (pa.scalar(t, pa.int64()).cast(TS_TYPE) for t in span)
            where = (ds.field(end) >= lo) & (ds.field(end) < hi)
        if key is not None:
            keys = ds.field(key).isin(pa.array(list(request), type=schema.field(key).type))
            where = keys if where is None else where & keys
        table = ds.dataset(paths, schema=schema, format="parquet").to_table(filter=where)
        return table.filter(pa.array(request_mask(etype, table, request)))

    def scan(self, name: str, *, version: int, request: Request | None = None) -> DataFrame:
        """A DataFrame over ``name`` at ``version``: a superset of the rows matching ``request`` (filter it)."""
        if self.backend == "native":
            # One DataFrame per (table, version), reused: loading it resolves the version's snapshot (a Spark job of
            # Delta's own), which a pinned version never needs to do again.
            uri = self.table_uri(name)
            return self._cached(
                self._frames,
                (name, version),
                lambda: self.spark.read.format("delta").option("versionAsOf", version).load(uri),
            )
        schema = self._version(name, version).spark_schema
        paths = self.files(name, version=version, request=request)
        if not paths:
            return self.spark.createDataFrame([], schema)
        from pyspark.sql.classic.dataframe import DataFrame

        reader = self.spark.read.schema(schema).option("basePath", self.table_uri(name))
        # parquet(*paths) converts the list element by element over py4j (one round trip per file):
        # hand the JVM one string and let it split.
        jvm: Any = self.spark.sparkContext._jvm
        jarray = jvm.java.util.regex.Pattern.compile("\n").split("\n".join(paths))
        jpaths = jvm.scala.collection.immutable.ArraySeq.unsafeWrapArray(jarray)
        return DataFrame(reader._jreader.parquet(jpaths), self.spark)
