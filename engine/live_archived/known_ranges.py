"""Archived instances of a one-event archived pattern over the access ranges a query has read, by key (issue 43).

LLAA asks the archive once per live instance and SLLAA once per subwindow, each time for the whole access range
``[I.start - LOOKBACK, I.start)`` of its key: with a look-back of days and instances minutes apart, almost every row
of a request was in the previous request of its key (``bench.service --live-archived --queries 10``: 4.0 million
rows read, matched and joined for 300,000 events). :class:`KnownRanges` keeps, per archive key, the ranges already
read and ``P_A``'s matches in them, so a request asks the archive only for the parts of its ranges not read before
and takes the rest from memory.

Exact when the part of an access range already read cannot change. That holds when ``P_A`` reads the one event type
``P_L`` reads and the service refuses that type's late events (not a derived type): a live instance completes only
once the type's watermark has passed its end (docs/semantics.md section 3, "Watermark and lateness"), and every event
accepted afterwards is at or after ``newest - lateness``, which is at or after the instance's start, outside its
access range; archived rows are never deleted (``archive/maintenance.py`` vacuums unreferenced files only). The
caller decides (:attr:`engine.live_archived.base.Runner.known_ranges`). A one-event ``P_A`` matches each event on
its own (:mod:`engine.live_archived.memo`), so the matches of a range are the union of its events' matches.

The same argument lets the runner answer the newest parts of a request from the events it was fed
(:class:`FedEvents`): fed every event of the type from its first one on, in ingest order, it has every event that
ends at or after ``first end + lateness + 1`` (an event ingested before its first one ended at most ``lateness``
after it: ingest refused it otherwise) and before its watermark ``newest end - lateness`` (every event ingested later
ends at or after that). With a look-back of days, the part of a key's request no earlier request read is almost
always its last seconds or minutes: those come from memory, and only a key's first request reads the archive.

The logical requests stay what 001 section 6 counts (``archive_requests``); ``archived_events_scanned`` counts the
rows read, ``requests_from_memory`` the requests that read nothing.
"""
from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Hashable, Iterable, Sequence

from engine.events import Event
from engine.live_archived.plan import Range, merge_ranges
from engine.live_archived.store import keep_sorted
from engine.match import Match

_MIN = -(1 << 63)
MAX_MATCHES = 200_000
"""The most matches one query keeps (a match and its event: ~1 KiB, so ~200 MB at most per query)."""
MAX_FED = 100_000
"""The most matches of fed events one query keeps (:class:`FedEvents`); beyond it the older half of the time they
cover is forgotten."""

def subtract(ranges: list[Range], covered: list[Range]) -> list[Range]:
    """The parts of ``ranges`` outside ``covered`` (both merged, sorted, half-open, int microseconds).

    >>> subtract([(0, 10), (20, 30)], [(5, 22)])
    [(0, 5), (22, 30)]
    >>> subtract([(0, 10)], [])
    [(0, 10)]
    """
    out: list[Range] = []
    for lo, hi in ranges:
        for c_lo, c_hi in covered:
            if c_hi <= lo or c_lo >= hi:
                continue
            if c_lo > lo:
                out.append((lo, c_lo))
            lo = max(lo, c_hi)
            if lo >= hi:
                break
        if lo < hi:
            out.append((lo, hi))
    return out


class _Key:
    """One key's read ranges and the matches in them, in ``(end, id)`` order of their event."""

    __slots__ = ("covered", "order", "items", "buckets")

    def __init__(self) -> None:
        self.covered: list[Range] = []
        self.order: list[tuple[int, int]] = []
        self.items: list[Match] = []
        self.buckets: dict[Hashable, tuple[list[tuple[int, int, int]], list[Match]]] = {}
        """With :meth:`KnownRanges.index_by`: the matches by their JOIN equality values, in ``(start, end, id)``
        or ``(end, id, 0)`` order."""


class KnownRanges:
    """Per archive key: the access ranges read and ``P_A``'s matches in them (see the module docstring); safe
    across threads (a query's requests are answered on several threads at once).

    Parameters
    ----------
    max_matches : int
        The most matches kept; beyond it every key is forgotten (requests read their whole ranges again).
    """

    def __init__(self, max_matches: int = MAX_MATCHES) -> None:
        self.max_matches = max_matches
        self.lock = threading.Lock()
        self.keys: dict[Hashable, _Key] = {}
        self.every: list[Range] = []
        """Ranges read for every key at once (:meth:`add_every`), beside each key's own."""
        self.index_of: Callable[[Match], Hashable | None] | None = None
        """:meth:`index_by`'s function (None: no index, or an unhashable value turned it off)."""
        self.by_start = False
        self.primed = False
        """Whether a first read for every key was claimed (:meth:`claim_prime`)."""
        self.size = 0
        self.from_memory = 0
        """Requests that read nothing: every range was read before or fed (:class:`FedEvents`)."""

    def missing(self, request: dict[Hashable, list[Range]]) -> dict[Hashable, list[Range]]:
        """The parts of ``request`` (key -> merged ranges) not read yet, by key (keys with nothing missing left out)."""
        out: dict[Hashable, list[Range]] = {}
        with self.lock:
            for key, ranges in request.items():
                rest = self._unread(key, ranges)
                if rest:
                    out[key] = rest
        return out

    def _unread(self, key: Hashable, ranges: list[Range]) -> list[Range]:
        k = self.keys.get(key)
        rest = subtract(ranges, self.every) if self.every else ranges
        return rest if k is None or not rest else subtract(rest, k.covered)

    def index_by(self, values_of: Callable[[Match], Hashable | None], *, by_start: bool = False) -> None:
        """Keep each key's matches by ``values_of(match)`` too (a hash join: the archived sides of JOIN's
        equalities; None: the match joins nothing, not kept there), for :meth:`candidates`, each bucket in
        ``(start, end, id)`` order (``by_start``) or ``(end, id)`` order. Call before the first :meth:`add`. An
        unhashable value turns the index off for good (:attr:`index_of` None)."""
        self.index_of = values_of
        self.by_start = by_start

    def candidates(
        self, request: dict[Hashable, list[Range]], wanted: list[tuple[Hashable, Hashable, int, int]]
    ) -> tuple[list[list[Match]], int] | None:
        """For each ``(key, values, lo, hi)`` of ``wanted``: the kept matches of ``key`` with those values that start
        (:meth:`index_by`'s ``by_start``; else end) in ``[lo, hi)``, in their bucket's order; and how many matches
        end in ``request``'s ranges (what :meth:`found` would give). None when some range of ``request`` is no
        longer wholly read, or without the index: the caller takes :meth:`found`'s way.

        Raises
        ------
        TypeError
            For unhashable ``values``.
        """
        with self.lock:
            if self.index_of is None:
                return None
            count = 0
            for key, ranges in request.items():
                if self._unread(key, ranges):
                    return None
                k = self.keys.get(key)
                if k is not None:
                    for lo, hi in ranges:
                        count += bisect.bisect_left(k.order, (hi, _MIN)) - bisect.bisect_left(k.order, (lo, _MIN))
            out: list[list[Match]] = []
            for key, values, lo, hi in wanted:
                k = self.keys.get(key)
                b = None if k is None else k.buckets.get(values)
                if b is None:
                    out.append([])
                    continue
                order, items = b
                i = bisect.bisect_left(order, (lo, _MIN, _MIN))
                out.append(items[i:bisect.bisect_left(order, (hi, _MIN, _MIN))])
            return out, count

    def _bucket(self, k: _Key, m: Match, event_id: int) -> None:
        """Keep ``m`` in its bucket of ``k`` (under :attr:`lock`, with :attr:`index_of`)."""
        index_of = self.index_of
        assert index_of is not None
        try:
            values = index_of(m)
            if values is None:
                return
            b = k.buckets.get(values)
            if b is None:
                b = k.buckets[values] = ([], [])
        except TypeError:  # an unhashable value: equalities are compared pair by pair from now on
            self.index_of = None
            for other in self.keys.values():
                other.buckets = {}
            return
        order, items = b
        keep_sorted(order, items, (m.start, m.end, event_id) if self.by_start else (m.end, event_id, 0), m)

    def claim_prime(self) -> bool:
        """True once (the caller then reads every key's first ranges in one read, :meth:`add_every`)."""
        with self.lock:
            done, self.primed = self.primed, True
        return not done

    def add_every(self, read: Range, found: dict[Hashable, list[Match]], horizon_us: int | None = None) -> None:
        """Record that ``read`` was read for every key at once and ``found`` holds its matches by key; parts a key
        had read already keep their matches once. The bound as in :meth:`add`."""
        with self.lock:
            new_every = subtract([read], self.every)
            for key, matches in found.items():
                self._insert(key, subtract(new_every, self.keys[key].covered) if key in self.keys else new_every,
                             matches)
            self.every = merge_ranges([*self.every, *new_every])
        self._bound(horizon_us)

    def read_nothing(self) -> None:
        """Count a request answered without an archive read (``requests_from_memory``)."""
        with self.lock:
            self.from_memory += 1

    def add(
        self, read: dict[Hashable, list[Range]], found: dict[Hashable, list[Match]], horizon_us: int | None = None
    ) -> None:
        """Record that ``read`` (key -> ranges) was read and ``found`` holds its matches by key (a match's event ends
        in one of its key's ranges). Parts another thread recorded meanwhile are skipped: their matches are kept
        once. Past :attr:`max_matches`, what ends before ``horizon_us`` (the runner's horizon; None: unknown) is
        forgotten, then everything if that is not enough."""
        with self.lock:
            for key, ranges in read.items():
                new = self._unread(key, ranges)
                if new:
                    k = self._insert(key, new, found.get(key, ()))
                    k.covered = merge_ranges([*k.covered, *new])
        self._bound(horizon_us)

    def _insert(self, key: Hashable, new: list[Range], matches: Iterable[Match]) -> _Key:
        """Keep the ``matches`` of ``key`` whose event ends in ``new`` (under :attr:`lock`); its entry."""
        k = self.keys.get(key)
        if k is None:
            k = self.keys[key] = _Key()
        if not new:
            return k
        for m in matches:
            end = m.end
            if not any(lo <= end < hi for lo, hi in new):
                continue
            event_id = _event_id(m)
            keep_sorted(k.order, k.items, (end, event_id), m)
            if self.index_of is not None:
                self._bucket(k, m, event_id)
            self.size += 1
        return k

    def _bound(self, horizon_us: int | None) -> None:
        if self.size > self.max_matches:
            if horizon_us is not None:
                self.evict(horizon_us)
            with self.lock:
                if self.size > self.max_matches // 2:
                    self.keys.clear()
                    self.every = []
                    self.size = 0

    def found(self, request: dict[Hashable, list[Range]]) -> dict[Hashable, list[Match]] | None:
        """The kept matches of each key of ``request`` (key -> merged ranges) whose event ends in its ranges, in
        ``(end, id)`` order; None when some range is no longer wholly read (forgotten since :meth:`missing`: the
        caller reads it again)."""
        out: dict[Hashable, list[Match]] = {}
        with self.lock:
            for key, ranges in request.items():
                if self._unread(key, ranges):
                    return None
                k = self.keys.get(key)
                got: list[Match] = []
                if k is None:  # read for every key, none of this one's matched
                    out[key] = got
                    continue
                for lo, hi in ranges:
                    i = bisect.bisect_left(k.order, (lo, _MIN))
                    j = bisect.bisect_left(k.order, (hi, _MIN))
                    got += k.items[i:j]
                out[key] = got
        return out

    def evict(self, before_us: int) -> None:
        """Forget the matches ending before ``before_us`` and the read ranges below it (no later request reaches
        there: the runner's horizon)."""
        with self.lock:
            self.every = [(max(lo, before_us), hi) for lo, hi in self.every if hi > before_us]
            empty = []
            for key, k in self.keys.items():
                i = bisect.bisect_left(k.order, (before_us, _MIN))
                if i:
                    del k.order[:i]
                    del k.items[:i]
                    self.size -= i
                    for values, (order, items) in list(k.buckets.items()):  # those ending before it start (or
                        n = bisect.bisect_left(order, (before_us, _MIN, _MIN))  # end) before it too
                        keep = [x for x in range(n) if items[x].end >= before_us]
                        if len(keep) < n:
                            order[:n] = [order[x] for x in keep]
                            items[:n] = [items[x] for x in keep]
                        if not items:
                            del k.buckets[values]
                k.covered = [(max(lo, before_us), hi) for lo, hi in k.covered if hi > before_us]
                if not k.covered and not k.items:  # its items lie in its ranges or in those read for every key
                    empty.append(key)
            for key in empty:
                del self.keys[key]

    def stats(self) -> dict[str, int]:
        """``{"keys", "matches", "requests_from_memory"}``."""
        with self.lock:
            return {"keys": len(self.keys), "matches": self.size, "requests_from_memory": self.from_memory}


class _Fed:
    """One key's matches of fed events in feed (ingest) order and their ends: each ends at or after the newest end
    before it minus the lateness, so a scan from the newest back stops once an end is ``lateness`` before what it
    looks for."""

    __slots__ = ("ends", "items")

    def __init__(self) -> None:
        self.ends: list[int] = []
        self.items: list[Match] = []


class FedEvents:
    """``P_A``'s matches of the events of its one type a runner was fed, by archive key (module docstring): complete
    for ends in ``[lo, hi)``, so the parts of a request there need no archive read.

    Parameters
    ----------
    match : callable
        ``P_A``'s matches over events in ``(ts_end, id)`` order (a fresh matcher: a one-event ``P_A`` matches each
        event on its own, so batches of fed events are matched as they come).
    key_of : callable
        A match's archive key (None without a key plan).
    lateness_us : int
        The type's allowed lateness at ingest (int microseconds; the runner's, at least the service's).
    max_matches : int
        The most matches kept; past it the older half of ``[lo, hi)`` is forgotten (``lo`` moves up).
    """

    def __init__(
        self, match: Callable[[list[Event]], list[Match]], key_of: Callable[[Match], Hashable], lateness_us: int,
        max_matches: int = MAX_FED,
    ) -> None:
        self.match = match
        self.key_of = key_of
        self.lateness_us = lateness_us
        self.max_matches = max_matches
        self.lock = threading.Lock()
        self.fresh: list[Event] = []
        """Fed, not yet matched (matched when a request needs them, or when many wait)."""
        self.keys: dict[Hashable, _Fed] = {}
        self.size = 0
        self.fed = 0
        self.lo: int | None = None
        """Every event ending at or after this was fed and its matches are kept (None: nothing fed yet): the larger
        of what the fed events bound and :attr:`floor`."""
        self.floor: int | None = None
        """Matches ending before this were forgotten (:meth:`_forget`)."""
        self.newest = _MIN
        """The newest end fed."""

    def feed(self, events: Sequence[Event]) -> None:
        """Take a batch of fed events (every event of the type, in ingest order; the runner's thread)."""
        if not events:
            return
        ends = [e.ts_end for e in events]
        with self.lock:
            low = min(ends) + self.lateness_us + 1  # anything ingested before it ended by min + lateness
            if self.lo is None or low < self.lo:
                self.lo = low if self.floor is None else max(low, self.floor)
            self.newest = max(self.newest, max(ends))
            self.fresh += events
            self.fed += len(events)
            if len(self.fresh) > self.max_matches // 4:  # match (and trim) as fed when no request asks
                self._index()

    @property
    def hi(self) -> int:
        """Every event ending before this that will ever be ingested was fed: ``newest end - lateness``."""
        return self.newest - self.lateness_us

    def complete(self) -> tuple[int | None, int]:
        """``(lo, hi)``: every event ending in ``[lo, hi)`` was fed (lo None: nothing fed yet)."""
        with self.lock:
            return self.lo, self.hi

    def take(
        self, missing: dict[Hashable, list[Range]]
    ) -> tuple[dict[Hashable, list[Range]], dict[Hashable, list[Match]], dict[Hashable, list[Range]]]:
        """Split ``missing`` (key -> merged ranges): ``(the parts fed events cover, P_A's matches there by key in no
        particular order, the rest)``."""
        covered: dict[Hashable, list[Range]] = {}
        rest: dict[Hashable, list[Range]] = {}
        found: dict[Hashable, list[Match]] = {}
        with self.lock:
            self._index()
            lo, hi = self.lo, self.hi
            if lo is None or lo >= hi:
                return covered, found, missing
            span = [(lo, hi)]
            stop_after = self.lateness_us
            for key, ranges in missing.items():
                left = subtract(ranges, span)
                if left:
                    rest[key] = left
                part = subtract(ranges, left) if left else ranges
                if not part:
                    continue
                covered[key] = part
                k = self.keys.get(key)
                if k is None:
                    continue
                first = part[0][0]
                ends, items = k.ends, k.items
                got = found[key] = []
                for i in range(len(ends) - 1, -1, -1):
                    end = ends[i]
                    if end + stop_after < first:
                        break  # everything fed before it ended by end + lateness
                    for r_lo, r_hi in part:
                        if r_lo <= end < r_hi:
                            got.append(items[i])
                            break
        return covered, found, rest

    def _index(self) -> None:
        if not self.fresh:
            return
        fresh = sorted(self.fresh, key=Event.order_key)
        self.fresh = []
        keys, key_of = self.keys, self.key_of
        n = 0
        for m in self.match(fresh):
            key = key_of(m)
            k = keys.get(key)
            if k is None:
                k = keys[key] = _Fed()
            k.ends.append(m.end)
            k.items.append(m)
            n += 1
        self.size += n
        while self.size > self.max_matches and self.lo is not None and self.lo < self.hi:
            self._forget((self.lo + self.hi) // 2 + 1)

    def _forget(self, before_us: int) -> None:
        """Forget the matches ending before ``before_us`` (up to the first one that ends later, per key); ``lo``
        moves there."""
        self.floor = before_us if self.floor is None else max(self.floor, before_us)
        self.lo = max(self.lo or before_us, before_us)
        empty = []
        for key, k in self.keys.items():
            ends = k.ends
            i, n = 0, len(ends)
            while i < n and ends[i] < before_us:
                i += 1
            if i:
                del ends[:i]
                del k.items[:i]
                self.size -= i
            if not ends:
                empty.append(key)
        for key in empty:
            del self.keys[key]

    def stats(self) -> dict[str, int]:
        """``{"fed_events", "fed_matches"}``: events fed in all, matches kept."""
        with self.lock:
            return {"fed_events": self.fed, "fed_matches": self.size}


def _event_id(m: Match) -> int:
    e = m.first_event()
    return 0 if e is None else int(e.id)
