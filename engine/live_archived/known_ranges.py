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

The logical requests stay what 001 section 6 counts (``archive_requests``); ``archived_events_scanned`` counts the
rows read, ``requests_from_memory`` the requests that read nothing.
"""
from __future__ import annotations

import bisect
import threading
from collections.abc import Hashable

from engine.live_archived.plan import Range, merge_ranges
from engine.match import Match

_MIN = -(1 << 63)
MAX_MATCHES = 200_000
"""The most matches one query keeps (a match and its event: ~1 KiB, so ~200 MB at most per query)."""

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

    __slots__ = ("covered", "order", "items")

    def __init__(self) -> None:
        self.covered: list[Range] = []
        self.order: list[tuple[int, int]] = []
        self.items: list[Match] = []


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
        self.size = 0
        self.from_memory = 0
        """Requests that read nothing: every range was read before."""

    def missing(self, request: dict[Hashable, list[Range]]) -> dict[Hashable, list[Range]]:
        """The parts of ``request`` (key -> merged ranges) not read yet, by key (keys with nothing missing left out)."""
        out: dict[Hashable, list[Range]] = {}
        with self.lock:
            for key, ranges in request.items():
                k = self.keys.get(key)
                rest = ranges if k is None else subtract(ranges, k.covered)
                if rest:
                    out[key] = rest
            if not out:
                self.from_memory += 1
        return out

    def add(
        self, read: dict[Hashable, list[Range]], found: dict[Hashable, list[Match]], horizon_us: int | None = None
    ) -> None:
        """Record that ``read`` (key -> ranges) was read and ``found`` holds its matches by key (a match's event ends
        in one of its key's ranges). Parts another thread recorded meanwhile are skipped: their matches are kept
        once. Past :attr:`max_matches`, what ends before ``horizon_us`` (the runner's horizon; None: unknown) is
        forgotten, then everything if that is not enough."""
        with self.lock:
            for key, ranges in read.items():
                k = self.keys.get(key)
                if k is None:
                    k = self.keys[key] = _Key()
                new = subtract(ranges, k.covered)
                if not new:
                    continue
                for m in found.get(key, ()):
                    end = m.end
                    if not any(lo <= end < hi for lo, hi in new):
                        continue
                    at = (end, _event_id(m))
                    if not k.order or at > k.order[-1]:
                        k.order.append(at)
                        k.items.append(m)
                    else:
                        i = bisect.bisect_left(k.order, at)
                        k.order.insert(i, at)
                        k.items.insert(i, m)
                    self.size += 1
                k.covered = merge_ranges([*k.covered, *new])
        if self.size > self.max_matches:
            if horizon_us is not None:
                self.evict(horizon_us)
            with self.lock:
                if self.size > self.max_matches // 2:
                    self.keys.clear()
                    self.size = 0

    def found(self, request: dict[Hashable, list[Range]]) -> dict[Hashable, list[Match]] | None:
        """The kept matches of each key of ``request`` (key -> merged ranges) whose event ends in its ranges, in
        ``(end, id)`` order; None when some range is no longer wholly read (forgotten since :meth:`missing`: the
        caller reads it again)."""
        out: dict[Hashable, list[Match]] = {}
        with self.lock:
            for key, ranges in request.items():
                k = self.keys.get(key)
                if k is None or subtract(ranges, k.covered):
                    return None
                got: list[Match] = []
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
            empty = []
            for key, k in self.keys.items():
                i = bisect.bisect_left(k.order, (before_us, _MIN))
                if i:
                    del k.order[:i]
                    del k.items[:i]
                    self.size -= i
                k.covered = [(max(lo, before_us), hi) for lo, hi in k.covered if hi > before_us]
                if not k.covered:
                    empty.append(key)
            for key in empty:
                self.size -= len(self.keys[key].items)
                del self.keys[key]

    def stats(self) -> dict[str, int]:
        """``{"keys", "matches", "requests_from_memory"}``."""
        with self.lock:
            return {"keys": len(self.keys), "matches": self.size, "requests_from_memory": self.from_memory}


def _event_id(m: Match) -> int:
    for evs in m.events.values():
        if evs:
            return int(evs[0].id)
    return 0
