"""Where archived events come from: the :class:`ArchiveSource` protocol and :class:`MemoryArchive`.

The algorithms of 001 section 4 only ever ask the archive two things: the events of some types, keys
and time ranges (one *archive request*, 001's archived-event extractor), and statistics for OLLAA
(001 section 4.3: event counts, and the selectivity of a pattern over a stretch of the archive).
:class:`MemoryArchive` answers them from memory (tests, ``lace replay --backend memory``, benches);
``archive.archived_source.SparkArchiveSource`` answers them from the Delta archive through Spark.

Ranges are half-open ``[lo, hi)`` in int microseconds UTC and select events by their *end*: ``ts_end``
of an interval event, ``ts`` of a point event (the matcher's order, ``(ts_end, id)``), so one request over
``[lo, hi)`` is exactly the stretch of the stream between positions ``lo`` and ``hi`` (issue 24 item 4:
selecting interval events by ``ts`` left out those that started before ``lo`` and fed the rest out of the
matcher's order). Keys are values of the archived side's key attribute (a PARTITION BY attribute, see
:class:`engine.live_archived.plan.KeyPlan`).
"""
from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from engine.compiler import CompiledQuery
from engine.events import Event
from engine.live_archived.plan import Range, merge_ranges
from engine.matcher import Matcher

Ranges = Sequence[Range] | Mapping[Hashable, Sequence[Range]]


@runtime_checkable
class ArchiveSource(Protocol):
    """An archive the live-and-archived algorithms can query (001 section 3.3's extractor)."""

    def extract(
        self, types: Iterable[str], keys: Iterable[Hashable] | None, ranges: Ranges, *, key_attr: str | None = None,
        pattern: CompiledQuery | None = None,
    ) -> list[Event]:
        """Archived events of ``types`` with ``key_attr`` in ``keys`` (None: any key) that end in ``ranges``.

        An event ends at its ``ts_end`` (interval types) or ``ts`` (point types). ``ranges`` is one union
        of half-open ``(lo, hi)`` int-us ranges for every key, or a mapping key -> ranges (then ``keys``,
        when given, restricts it). Overlapping ranges are merged, so no event comes twice. Returns the
        events as one request, in the matcher's ``(ts_end, id)`` order (callers sort again if a source
        cannot promise it).

        ``pattern``: the archived pattern (``P_A``) the events are for. A source may leave out events
        that can be part of none of its matches (the Delta archive drops those failing a one-event
        pattern's WHERE, ``archive.pushdown``), never one that can; it may also ignore ``pattern``.
        """
        ...

    def count(
        self, types: Iterable[str], keys: Iterable[Hashable] | None, range: Range, *, key_attr: str | None = None
    ) -> int:
        """How many archived events of ``types`` (and ``keys``) end in ``range``."""
        ...

    def selectivity(self, query: CompiledQuery, range: Range) -> float:
        """``N_P / |S|`` of pattern ``query`` over the archive in ``range`` (001 Definition 6).

        ``S`` is the archived events of the pattern's own types in ``range``; an estimate (e.g. on a
        sample of keys) is fine. 0.0 when ``range`` holds no such event.
        """
        ...


def normalize_request(keys: Iterable[Hashable] | None, ranges: Ranges) -> dict[Hashable, list[Range]]:
    """``{key: merged ranges}`` (key None: any key), like ``archive.ranges.make_request``.

    >>> normalize_request(["a"], [(0, 5), (3, 9)])
    {'a': [(0, 9)]}
    >>> normalize_request(None, {"a": [(0, 1)], "b": [(2, 2)]})
    {'a': [(0, 1)]}
    """
    if isinstance(ranges, Mapping):
        wanted = None if keys is None else set(keys)
        req = {k: merge_ranges(list(v)) for k, v in ranges.items() if wanted is None or k in wanted}
    elif keys is None:
        req = {None: merge_ranges(list(ranges))}
    else:
        merged = merge_ranges(list(ranges))
        req = {k: list(merged) for k in dict.fromkeys(keys)}
    return {k: v for k, v in req.items() if v}


class _Column:
    """Events of one type (or one type and key) sorted by (ts_end, id), with a parallel end list for bisect."""

    __slots__ = ("ts", "order", "events")

    def __init__(self) -> None:
        self.ts: list[int] = []  # each event's end (ts_end; ts for a point event)
        self.order: list[tuple[int, int]] = []
        self.events: list[Event] = []

    def add(self, e: Event) -> None:
        k = (e.ts_end, e.id)
        if not self.order or k > self.order[-1]:
            self.ts.append(e.ts_end)
            self.order.append(k)
            self.events.append(e)
            return
        i = bisect.bisect_left(self.order, k)
        self.ts.insert(i, e.ts_end)
        self.order.insert(i, k)
        self.events.insert(i, e)

    def slice(self, lo: int, hi: int) -> list[Event]:
        return self.events[bisect.bisect_left(self.ts, lo) : bisect.bisect_left(self.ts, hi)]

    def count(self, lo: int, hi: int) -> int:
        return bisect.bisect_left(self.ts, hi) - bisect.bisect_left(self.ts, lo)


class MemoryArchive:
    """An in-memory archive that grows as the stream passes (:meth:`append`); an :class:`ArchiveSource`.

    Events are indexed per type by ``(ts_end, id)`` (``(ts, id)`` for point events), and per (type,
    attribute, value) for each key attribute a request has used, so a request costs a binary search per
    (type, key, range) plus the events returned.

    Examples
    --------
    >>> a = MemoryArchive()
    >>> a.extend([Event(1, "A", 10, {"k": 1}), Event(2, "A", 20, {"k": 2}), Event(3, "B", 30, {"k": 1})])
    >>> [e.id for e in a.extract(["A", "B"], [1], [(0, 100)], key_attr="k")]
    [1, 3]
    >>> a.count(["A"], None, (15, 25))
    1
    """

    def __init__(self) -> None:
        self._types: dict[str, _Column] = {}
        self._keyed: dict[tuple[str, str], dict[Hashable, _Column]] = {}
        self.size = 0

    def append(self, event: Event) -> None:
        """Archive one event (any order; in-order appends are O(1))."""
        col = self._types.get(event.type)
        if col is None:
            col = self._types[event.type] = _Column()
        col.add(event)
        for (t, attr), by_value in self._keyed.items():
            if t == event.type:
                value = event.get(attr)
                sub = by_value.get(value)
                if sub is None:
                    sub = by_value[value] = _Column()
                sub.add(event)
        self.size += 1

    def extend(self, events: Iterable[Event]) -> None:
        for e in events:
            self.append(e)

    def _index(self, type_name: str, attr: str) -> dict[Hashable, _Column]:
        found = self._keyed.get((type_name, attr))
        if found is None:
            found = self._keyed[(type_name, attr)] = {}
            for e in self._types[type_name].events:
                sub = found.get(e.get(attr))
                if sub is None:
                    sub = found[e.get(attr)] = _Column()
                sub.add(e)
        return found

    def _columns(self, type_name: str, key: Hashable, key_attr: str | None) -> _Column | None:
        if type_name not in self._types:
            return None
        if key is None or key_attr is None:
            return self._types[type_name]
        return self._index(type_name, key_attr).get(key)

    def extract(
        self, types: Iterable[str], keys: Iterable[Hashable] | None, ranges: Ranges, *, key_attr: str | None = None,
        pattern: CompiledQuery | None = None,
    ) -> list[Event]:
        """See :meth:`ArchiveSource.extract`. A key request without ``key_attr`` returns every key; ``pattern``
        is ignored (every event in the request is returned)."""
        request = normalize_request(keys, ranges)
        parts: list[list[Event]] = []
        for name in dict.fromkeys(types):
            for key, rs in request.items():
                col = self._columns(name, key, key_attr)
                if col is None:
                    continue
                for lo, hi in rs:
                    part = col.slice(lo, hi)
                    if part:
                        parts.append(part)
        if len(parts) == 1:
            return parts[0]
        out = [e for part in parts for e in part]
        out.sort(key=Event.order_key)
        return out

    def count(
        self, types: Iterable[str], keys: Iterable[Hashable] | None, range: Range, *, key_attr: str | None = None
    ) -> int:
        """See :meth:`ArchiveSource.count`."""
        n = 0
        for name in dict.fromkeys(types):
            for key in [None] if keys is None else dict.fromkeys(keys):
                col = self._columns(name, key, key_attr)
                if col is not None:
                    n += col.count(*range)
        return n

    def selectivity(self, query: CompiledQuery, range: Range, *, sample_events: int = 5_000) -> float:
        """See :meth:`ArchiveSource.selectivity`: exact over the last ``sample_events`` events of ``range``."""
        events = self.extract(sorted(query.types), None, [range])[-sample_events:]
        if not events:
            return 0.0
        matcher = Matcher(query)
        n = 0
        for e in events:
            n += len(matcher.push(e))
        n += len(matcher.flush())
        return n / len(events)


__all__ = ["ArchiveSource", "MemoryArchive", "Ranges", "normalize_request"]
