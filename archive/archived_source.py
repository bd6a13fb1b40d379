"""The Delta archive as an :class:`engine.live_archived.source.ArchiveSource` (docs/architecture.md sections 7.7, 7.8).

:class:`SparkArchiveSource` adapts :class:`archive.extractor.Extractor` (at most one Spark job per
archive request, none for a small one; unflushed events from the recent buffer included; Arrow rows
become :class:`engine.events.Event`, only those passing a one-event archived pattern's conditions when
the caller names the pattern) and :class:`archive.stats.ArchiveStats` (counts and sampled
selectivities for OLLAA). :class:`GrowingDeltaArchive` is the archive of ``lace replay --backend
spark``: events go through an :class:`archive.writer.ArchiveWriter` as the stream passes, in
batches, and every read first appends what is still pending, so a request sees every event pushed
before it ("flushed or still in the recent buffer").

Keys: the extractor selects by each event type's key attribute. When the archived side's key
attribute (the JOIN's PARTITION BY attribute) is the key of every requested type, keys go to
Spark; otherwise the request is by time only and the keys are filtered here.
"""
from __future__ import annotations

import collections
import functools
import operator
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from archive.pushdown import apply_filter
from archive.ranges import KeyIndex, merge_ranges, rows_in
from engine.compiler import CompiledQuery
from engine.events import MAX_TS_US, MIN_TS_US, Event
from engine.live_archived.plan import Range
from engine.live_archived.source import Ranges, normalize_request
from engine.lql.ast import PatternQuery
from engine.matcher import Matcher

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc

    from archive.decoded_files import DecodedFiles
    from archive.extractor import Extractor
    from archive.stats import ArchiveStats
    from archive.writer import ArchiveWriter
    from engine.event_type import EventType

Pattern = PatternQuery | CompiledQuery  # an archived side: its syntax tree or its compiled query
MIN_US = MIN_TS_US  # Spark timestamps start at 0001-01-01
MAX_US = MAX_TS_US
Answer = tuple["pa.Table | None", "dict[Hashable, list[Range]] | None"]
"""What an archive request gets: ``(table, keep)`` (:meth:`SparkArchiveSource.extract_table`)."""
WHERES_KEPT = 256
"""The most (pattern, event types) pairs whose pushed-down WHERE :meth:`SparkArchiveSource._where` keeps."""
EXACT_SELECTIVITY_BELOW = 1_000  # archived events: below this, selectivity is computed exactly here


def _clamp(rng: Range) -> Range:
    return (max(rng[0], MIN_US), min(rng[1], MAX_US))


@dataclass(frozen=True, slots=True)
class Extract:
    """One archive request as :meth:`SparkArchiveSource.extract_table` takes it (see there)."""

    types: tuple[str, ...]
    keys: tuple[Hashable, ...] | None
    ranges: Ranges
    key_attr: str | None = None
    pattern: Pattern | None = None

    def batch_key(self) -> tuple[tuple[str, ...], str | None, bool]:
        """Requests with equal keys are read together (:meth:`SparkArchiveSource.extract_tables`): their event
        types, key attribute and whether they select by key."""
        keyed = self.keys is not None or isinstance(self.ranges, Mapping)
        return tuple(dict.fromkeys(self.types)), self.key_attr, keyed


def _typed(request: Mapping[Hashable, list[Range]], kind: str) -> dict[Hashable, list[Range]]:
    """``request`` with each key as a value of attribute type ``kind`` (:func:`key_for`); keys no event can
    have are left out."""
    typed: dict[Hashable, list[Range]] = {}
    for k, rs in request.items():
        tk = key_for(k, kind)
        if tk is not None:
            typed.setdefault(tk, []).extend(rs)
    return typed


def _ends(table: pa.Table) -> Any:
    """Each output row's end, int64 us: ``ts_end`` (interval events), else ``ts``."""
    import pyarrow.compute as pc

    ts = table.column("ts")
    if "ts_end" in table.column_names:
        ts = pc.coalesce(table.column("ts_end"), ts)
    return ts.to_numpy()


def key_for(value: Hashable, kind: str) -> Hashable | None:
    """``value`` as a key of attribute type ``kind`` (None when no event of that type can equal it).

    >>> key_for(3.0, "int"), key_for(3, "float"), key_for(3, "string"), key_for("x", "string")
    (3, 3.0, None, 'x')
    """
    if isinstance(value, bool):
        return value if kind == "bool" else None
    if kind == "string":
        return value if isinstance(value, str) else None
    if kind == "int":
        if isinstance(value, int):
            return value
        return int(value) if isinstance(value, float) and value.is_integer() else None
    if kind in ("float", "timestamp"):
        if isinstance(value, (int, float)):
            return float(value) if kind == "float" else (int(value) if float(value).is_integer() else None)
    return None


class SparkArchiveSource:
    """Archive requests and statistics over the Delta archive (see the module docstring).

    Parameters
    ----------
    extractor : archive.extractor.Extractor
        Built over an :class:`archive.reader.ArchiveReader` and, when the writer is in this
        process, its recent buffer.
    stats : archive.stats.ArchiveStats, optional
        Default: over ``extractor``.
    before_read : callable, optional
        Called before every read (e.g. :meth:`GrowingDeltaArchive.sync`).
    """

    def __init__(
        self,
        extractor: Extractor,
        *,
        stats: ArchiveStats | None = None,
        before_read: Callable[[], None] | None = None,
    ) -> None:
        from archive.stats import ArchiveStats

        self.extractor = extractor
        self.stats = stats if stats is not None else ArchiveStats(extractor)
        self.before_read = before_read
        self.requests = 0
        self._wheres: dict[tuple[int, ...], tuple[Any, tuple[EventType, ...], pc.Expression | None]] = {}
        self._wheres_lock = threading.Lock()

    def _known(self, types: Iterable[str]) -> dict[str, EventType]:
        catalog = self.extractor.reader.types()
        return {name: catalog[name] for name in dict.fromkeys(types) if name in catalog}

    def extract(
        self, types: Iterable[str], keys: Iterable[Hashable] | None, ranges: Ranges, *, key_attr: str | None = None,
        pattern: Pattern | None = None,
    ) -> list[Event]:
        """See :meth:`engine.live_archived.source.ArchiveSource.extract`: at most one Spark job.

        ``pattern``: the archived pattern the events are for; when it is one event, only the events that
        pass its single-event conditions are returned (see :meth:`extract_table`).
        """
        from archive.schema import output_to_events

        table, keep = self.extract_table(types, keys, ranges, key_attr=key_attr, pattern=pattern)
        if table is None:
            return []
        events = output_to_events(table)
        return events if keep is None else keep_requested(events, keep, key_attr)

    def extract_table(
        self, types: Iterable[str], keys: Iterable[Hashable] | None, ranges: Ranges, *, key_attr: str | None = None,
        pattern: Pattern | None = None,
    ) -> tuple[pa.Table | None, dict[Hashable, list[Range]] | None]:
        """:meth:`extract` as one Arrow table (output shape: ``id, type, ts``, attributes).

        Returns ``(table, keep)``: ``table`` None when nothing can match; ``keep`` None when every row
        was requested, else the ``{key: ranges}`` the rows must still be filtered by
        (:func:`keep_requested`; keys the archive could not select by). The service's live-and-archived
        processes convert the rows themselves (``archive.schema.output_to_events``).

        ``pattern``: the archived pattern (its syntax tree or compiled query). When it is one event, the
        rows are filtered by what can be translated of its WHERE (:func:`archive.pushdown.single_event_filter`)
        before any of them becomes a Python object; the rows kept are a superset of its matches.
        """
        if self.before_read is not None:
            self.before_read()
        etypes = self._known(types)
        return self._read(etypes, normalize_request(keys, ranges), key_attr, self._where(pattern, etypes))

    def extract_tables(self, requests: Sequence[Extract]) -> list[Answer]:
        """Answer several archive requests with one read per set of event types (issue 25: the shared
        scheduler's job): each answer equals :meth:`extract_table` of its request alone.

        Requests of the same types, key attribute and keyedness are read together: the union of their keys
        and access ranges, each archived pattern's single-event conditions joined by OR (no filter when one
        of them has none); the rows are then handed back to each request, cut to its own keys, ranges and
        conditions (Arrow masks; no Python object per row).

        Parameters
        ----------
        requests : sequence of Extract
            ``(types, keys, ranges, key_attr, pattern)`` as :meth:`extract_table` takes them.

        Returns
        -------
        list of (table, keep)
            One per request, in order; see :meth:`extract_table`.
        """
        import pyarrow as pa

        if self.before_read is not None:
            self.before_read()
        out: list[Answer] = [(None, None)] * len(requests)
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault(r.batch_key(), []).append(i)
        for (names, key_attr, _), members in groups.items():
            etypes = self._known(names)
            asks = [normalize_request(requests[i].keys, requests[i].ranges) for i in members]
            wheres = [self._where(requests[i].pattern, etypes) for i in members]
            if len(members) == 1:
                out[members[0]] = self._read(etypes, asks[0], key_attr, wheres[0])
                continue
            union: dict[Hashable, list[Range]] = {}
            for ask in asks:
                for k, rs in ask.items():
                    union.setdefault(k, []).extend(rs)
            # each distinct condition once (one query's requests share theirs, :meth:`_where`): an OR of a read's
            # dozens of copies of one condition was evaluated over every row
            distinct = list({id(w): w for w in wheres}.values())
            either = None if any(w is None for w in distinct) else functools.reduce(operator.or_, distinct)
            table, keep = self._read(etypes, {k: merge_ranges(rs) for k, rs in union.items()}, key_attr, either)
            self.requests += len(members) - 1  # one per request it answers (the read counted one)
            if table is None:
                continue
            kind = next(iter({t.attributes.get(key_attr or "") for t in etypes.values()})) or ""
            # per archived pattern (the requests of one query share it): the union's rows passing its conditions and
            # their ends, filtered once per read, not once per request (LLAA's requests come by the dozen); with two
            # or more requests, their rows grouped by key and ordered by end once (KeyIndex), each request then cut
            # by binary search instead of a pass over every row
            pids = [id(requests[i].pattern) if where is not either else 0 for i, where in zip(members, wheres)]
            uses = collections.Counter(pids)
            passed: dict[int, tuple[pa.Table, Any, KeyIndex | None]] = {}
            for i, ask, where, pid in zip(members, asks, wheres, pids):
                if not ask:
                    continue
                if pid not in passed:
                    mine = apply_filter(table, where) if where is not either else table
                    passed[pid] = (mine, None, None)
                mine, ends, index = passed[pid]
                if keep is not None:  # keys the archive could not select by: the caller filters, as alone
                    out[i] = (mine, {k: [_clamp(r) for r in rs] for k, rs in ask.items()})
                    continue
                typed = _typed(ask, kind) if None not in ask else ask
                if not typed:
                    continue
                if ends is None:
                    ends = _ends(mine)
                    passed[pid] = (mine, ends, None)
                clamped = {k: [_clamp(r) for r in rs] for k, rs in typed.items()}
                if None in typed:
                    out[i] = (mine.filter(pa.array(rows_in(ends, None, clamped))), None)
                    continue
                if index is None and uses[pid] > 1:
                    index = KeyIndex(ends, mine.column(key_attr))
                    passed[pid] = (mine, ends, index)
                if index is not None:
                    out[i] = (mine.take(pa.array(index.rows(clamped))), None)
                else:
                    out[i] = (mine.filter(pa.array(rows_in(ends, mine.column(key_attr), clamped))), None)
        return out

    def _where(self, pattern: Pattern | None, etypes: Mapping[str, EventType]) -> pc.Expression | None:
        """The single-event conditions of ``pattern`` over ``etypes``' rows (None: no filter).

        Kept per (pattern, event types) object pair (:data:`WHERES_KEPT` of them): a query's requests all name
        its one archived pattern, and building the expression again for each of a read's dozens of LLAA requests
        was a fifth of the read's CPU (issue 25). A changed catalog gives new ``EventType`` objects, so a schema
        change builds it again."""
        if pattern is None or not etypes:
            return None
        from archive.pushdown import single_event_filter

        ast = pattern.ast if isinstance(pattern, CompiledQuery) else pattern
        types = tuple(etypes.values())
        at = (id(ast), *map(id, types))
        with self._wheres_lock:
            hit = self._wheres.get(at)
        if hit is not None and hit[0] is ast and all(a is b for a, b in zip(hit[1], types)):
            return hit[2]
        where = single_event_filter(ast, list(types))
        with self._wheres_lock:
            if len(self._wheres) >= WHERES_KEPT:
                self._wheres.clear()
            self._wheres[at] = (ast, types, where)  # the objects are kept with it: their ids are not reused meanwhile
        return where

    def _read(
        self, etypes: Mapping[str, EventType], request: dict[Hashable, list[Range]], key_attr: str | None,
        where: pc.Expression | None,
    ) -> Answer:
        if not etypes or not request:
            return None, None
        request = {k: [_clamp(r) for r in rs] for k, rs in request.items()}
        keyed = None not in request
        kinds = {t.attributes.get(key_attr or "") for t in etypes.values()}
        by_spark = keyed and all(t.partition_key == key_attr for t in etypes.values()) and len(kinds) == 1
        self.requests += 1
        if by_spark:
            typed = _typed(request, next(iter(kinds)) or "")
            if not typed:
                return None, None
            return self.extractor.extract(list(etypes), None, typed, where=where), None
        if not keyed:
            return self.extractor.extract(list(etypes), None, request[None], where=where), None
        union = [r for rs in request.values() for r in rs]
        return self.extractor.extract(list(etypes), None, union, where=where), request

    def count(
        self, types: Iterable[str], keys: Iterable[Hashable] | None, range: Range, *, key_attr: str | None = None
    ) -> int:
        """Archived events of ``types`` in ``range`` (Delta counts plus the recent buffer)."""
        if self.before_read is not None:
            self.before_read()
        etypes = self._known(types)
        if not etypes:
            return 0
        rng = _clamp(range)
        key_list = None if keys is None else list(keys)
        if rng[0] >= rng[1] or key_list == []:  # an empty range or no key: nothing to count (no Spark job)
            return 0
        if key_list is not None and not all(t.partition_key == key_attr for t in etypes.values()):
            return len(self.extract(list(etypes), key_list, [rng], key_attr=key_attr))
        counts = self.stats.counts(list(etypes), ranges=[rng], keys=key_list)
        n = int(sum(counts.column("events").to_pylist()))
        buffer = self.extractor.buffer
        if buffer is not None:
            from archive.ranges import make_request

            n += buffer.query(list(etypes), make_request(key_list, [rng])).num_rows
        return n

    def selectivity(self, query: CompiledQuery, range: Range) -> float:
        """``N_P / |S|`` over ``range``: sampled by :class:`archive.stats.ArchiveStats`, exact when small."""
        rng = _clamp(range)
        names = list(self._known(sorted(query.types)))
        if not names:
            return 0.0
        if self.before_read is not None:
            self.before_read()
        estimate = self.stats.selectivity(query, ranges=[rng])
        if estimate.events >= EXACT_SELECTIVITY_BELOW:
            return float(estimate.value)
        events = self.extract(names, None, [rng])
        if not events:
            return 0.0
        matcher = Matcher(query)
        n = sum(len(matcher.push(e)) for e in events) + len(matcher.flush())
        return n / len(events)


def keep_requested(
    events: list[Event], request: Mapping[Hashable, Sequence[Range]], key_attr: str | None
) -> list[Event]:
    """The ``events`` whose ``key_attr`` value is a key of ``request`` and whose end (``ts_end``; ``ts`` of a
    point event) is in its ranges."""
    return [e for e in events if _in(e, request, key_attr)]


def _in(event: Event, request: Mapping[Hashable, Sequence[Range]], key_attr: str | None) -> bool:
    rs = request.get(event.get(key_attr)) if key_attr is not None else None
    return rs is not None and any(lo <= event.ts_end < hi for lo, hi in rs)  # by end, as extract selects


class GrowingDeltaArchive:
    """The archive of a replay on Spark: events appended as they pass, read through :class:`SparkArchiveSource`.

    Parameters
    ----------
    writer : archive.writer.ArchiveWriter
    batch : int
        Append to the writer (WAL, recent buffer) once this many events are pending, and before
        any read.
    """

    def __init__(self, writer: ArchiveWriter, *, batch: int = 5_000) -> None:
        self.writer = writer
        self.batch = batch
        self.pending: list[Event] = []
        self.appended = 0

    def append(self, event: Event) -> None:
        self.pending.append(event)
        if len(self.pending) >= self.batch:
            self.sync()

    def sync(self) -> None:
        """Append every pending event to the writer."""
        if self.pending:
            self.appended += self.writer.append(self.pending)
            self.pending = []

    def source(self, **kw: Any) -> SparkArchiveSource:
        """A :class:`SparkArchiveSource` over this archive (the writer's recent buffer included)."""
        from archive.extractor import Extractor
        from archive.reader import ArchiveReader

        reader = ArchiveReader(self.writer.root, **kw)
        return SparkArchiveSource(Extractor(reader, buffer=self.writer.buffer), before_read=self.sync)


class LazyArchiveSource:
    """A :class:`SparkArchiveSource` over the Delta archive at ``root`` (and a writer's recent buffer),
    built on first use: nothing starts Spark before the first archive request or statistic.

    Thread-safe to build; the requests themselves may run on several threads at once (one Spark job
    each). Used by the service for its live-and-archived queries.

    Parameters
    ----------
    root : path
        The archive root (one Delta table per event type).
    buffer : archive.buffer.RecentBuffer, optional
        The writer's recent buffer, so requests see events not yet committed to Delta.
    spark_master : str, optional
        The Spark master of the process's session (default ``LACE_SPARK_MASTER``, else ``local[*]``).
    """

    def __init__(self, root: Any, buffer: Any = None, *, spark_master: str | None = None) -> None:
        import threading

        self.root = root
        self.buffer = buffer
        self.spark_master = spark_master
        self._lock = threading.Lock()
        self._source: SparkArchiveSource | None = None

    def get(self) -> SparkArchiveSource:
        """The underlying source (starts Spark the first time)."""
        with self._lock:
            if self._source is None:
                from dataclasses import replace

                from archive.extractor import Extractor
                from archive.reader import ArchiveReader
                from archive.spark import SparkSettings, get_spark

                settings = SparkSettings.from_env()
                if self.spark_master is not None:
                    settings = replace(settings, master=self.spark_master)
                reader = ArchiveReader(self.root, spark=get_spark(settings))
                self._source = SparkArchiveSource(Extractor(reader, buffer=self.buffer))
            return self._source

    @property
    def requests(self) -> int:
        return 0 if self._source is None else self._source.requests

    def decoded_files(self) -> DecodedFiles | None:
        """The files the reader keeps decoded (:class:`archive.decoded_files.DecodedFiles`; None before the first
        request built the source)."""
        return None if self._source is None else self._source.extractor.reader.decoded

    def extract(self, types: Iterable[str], keys: Iterable[Hashable] | None, ranges: Ranges, **kw: Any) -> list[Event]:
        """See :meth:`SparkArchiveSource.extract` (``key_attr``, ``pattern``)."""
        return self.get().extract(types, keys, ranges, **kw)

    def extract_table(
        self, types: Iterable[str], keys: Iterable[Hashable] | None, ranges: Ranges, **kw: Any
    ) -> tuple[pa.Table | None, dict[Hashable, list[Range]] | None]:
        """See :meth:`SparkArchiveSource.extract_table` (``key_attr``, ``pattern``)."""
        return self.get().extract_table(types, keys, ranges, **kw)

    def extract_tables(self, requests: Sequence[Extract]) -> list[Answer]:
        """See :meth:`SparkArchiveSource.extract_tables`."""
        return self.get().extract_tables(requests)

    def count(
        self, types: Iterable[str], keys: Iterable[Hashable] | None, range: Range, *, key_attr: str | None = None
    ) -> int:
        """See :meth:`SparkArchiveSource.count`."""
        return self.get().count(types, keys, range, key_attr=key_attr)

    def selectivity(self, query: CompiledQuery, range: Range) -> float:
        """See :meth:`SparkArchiveSource.selectivity`."""
        return self.get().selectivity(query, range)
