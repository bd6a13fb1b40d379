"""Reading the archive's Delta tables through Spark (docs/architecture.md section 7.8, ARCHIVE_NOTES.md).

Two backends give the same rows:

* ``native``: ``spark.read.format("delta")`` at a pinned version; only when the Delta
  connector is on the classpath (see :mod:`archive.spark`).
* ``filelist``: delta-rs resolves the pinned snapshot's *active* files, pruned by the
  ``date`` partition and by min/max ``ts`` statistics, and Spark reads exactly those
  Parquet files with the Delta schema and ``basePath`` (for the partition column).
  Reading the table directory instead would also read files that compaction removed.
  Tables with deletion vectors or column mapping (or any reader feature not known to be
  safe) are refused: their Parquet files alone do not hold the table's rows.

Every read is at a snapshot version (:meth:`ArchiveReader.snapshot`), so a caller that
pins the versions gets repeatable reads.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from archive.ranges import Range, Request, time_union
from archive.schema import CATALOG_FILE, EventType, load_catalog
from archive.spark import get_spark, native_delta_available

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession

Backend = Literal["auto", "native", "filelist"]
SAFE_READER_FEATURES = frozenset({"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck"})
MAX_PRUNING_TERMS = 256  # (key, interval) pairs; beyond, prune by the union of intervals and the key set
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


def _time_clause(lo: int, hi: int) -> str | None:
    """Files that may hold a ts in ``[lo, hi)``: exact on ``date``, min/max stats on ``ts`` (lower bound widened)."""
    parts = []
    first, last = iso_us(lo), iso_us(hi - 1)
    lo_iso, hi_iso = iso_us(lo - STATS_SLACK_US), iso_us(hi)
    if first is not None:
        parts.append(f"date >= '{first[:10]}'")
    if last is not None:
        parts.append(f"date <= '{last[:10]}'")
    if lo_iso is not None:
        parts.append(f"ts >= '{lo_iso}'")
    if hi_iso is not None:
        parts.append(f"ts < '{hi_iso}'")
    return " AND ".join(parts) or None


def _time_predicate(intervals: Sequence[Range]) -> str | None:
    if len(intervals) > MAX_PRUNING_TERMS:
        intervals = [(intervals[0][0], intervals[-1][1])]
    clauses = [_time_clause(lo, hi) for lo, hi in intervals]
    if not clauses or any(c is None for c in clauses):
        return None  # some interval is unbounded: time prunes nothing
    return clauses[0] if len(clauses) == 1 else " OR ".join(f"({c})" for c in clauses)


def pruning_predicate(request: Request, *, key: str | None = None) -> str | None:
    """delta-rs file pruning predicate for an archive request (None: every file).

    Keyed requests of up to :data:`MAX_PRUNING_TERMS` (key, interval) pairs prune per
    pair, so a batch of lookups reads only the files each lookup needs (with files
    z-ordered by key, their key statistics prune too); larger ones prune by the union
    of their intervals and the set of keys. ``date`` selects files exactly; ``ts`` is
    checked against min/max statistics with the lower bound widened by 1 ms, because
    those statistics are truncated to milliseconds.

    >>> for part in pruning_predicate({None: [(86_400_000_000, 86_400_000_001)]}).split(" AND "):
    ...     print(part)
    date >= '1970-01-02'
    date <= '1970-01-02'
    ts >= '1970-01-01T23:59:59.999000Z'
    ts < '1970-01-02T00:00:00.000001Z'
    >>> pruning_predicate({"a": [(0, 1)], "b": [(5, 6)]}, key="k").count(" OR ")
    1
    """
    if None in request or key is None:
        return _time_predicate(time_union(request))
    if sum(len(v) for v in request.values()) <= MAX_PRUNING_TERMS:
        groups = []
        for k, intervals in request.items():
            t = _time_predicate(intervals)
            groups.append(f"({key} = {_sql_literal(k)}" + (f" AND ({t}))" if t else ")"))
        return " OR ".join(groups)
    t = _time_predicate(time_union(request))
    keys = f"{key} IN ({', '.join(_sql_literal(k) for k in request)})"
    return f"({t}) AND {keys}" if t else keys


def _sql_literal(value: Hashable) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "'" + str(value).replace("'", "''") + "'"
    return repr(value)


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

    Raises
    ------
    RuntimeError
        For ``backend="native"`` without the connector.
    """

    def __init__(self, root: str | Path, *, spark: SparkSession | None = None, backend: Backend = "auto") -> None:
        self.root = Path(root)
        self.spark = spark if spark is not None else get_spark()
        native = native_delta_available(self.spark)
        if backend == "native" and not native:
            raise RuntimeError("the native Delta reader needs the Delta Spark connector JAR (LACE_DELTA_JAR)")
        self.backend: Literal["native", "filelist"] = "native" if backend == "native" or (
            backend == "auto" and native
        ) else "filelist"
        self._lock = threading.Lock()
        self._tables: OrderedDict[tuple[str, int], tuple[DeltaTable, Any]] = OrderedDict()
        self._frames: OrderedDict[tuple[str, int], DataFrame] = OrderedDict()
        self._types: dict[str, EventType] = {}
        self._types_stamp = -1
        self._latest: dict[str, DeltaTable] = {}

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

    def _table(self, name: str, version: int) -> tuple[DeltaTable, Any]:
        def build() -> tuple[DeltaTable, Any]:
            from deltalake import DeltaTable
            from pyspark.sql.types import StructType

            dt = DeltaTable(self.table_uri(name), version=version)
            if self.backend == "filelist":
                check_filelist_readable(dt, name)
            return dt, StructType.fromJson(json.loads(dt.schema().to_json()))

        return self._cached(self._tables, (name, version), build)

    # ------------------------------------------------------------------ reading

    def files(self, name: str, *, version: int, request: Request | None = None) -> list[str]:
        """Active files of ``name`` at ``version`` that may hold events matching ``request`` (None: all)."""
        dt, _ = self._table(name, version)
        etype = self.types([name])[name]
        predicate = pruning_predicate(request, key=etype.key) if request else None
        return dt.file_uris(file_pruning_predicate=predicate) if predicate else dt.file_uris()

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
        _, schema = self._table(name, version)
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
