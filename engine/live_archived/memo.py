"""Archived instances of a one-event archived pattern, kept per event across archive requests (issue 25).

A live-and-archived query asks the archive once per live instance (LLAA, OLLAA's live-driven mode) or per subwindow
(SLLAA), and consecutive requests cover mostly the same look-back: with ``LOOKBACK 7 days`` and instances minutes
apart, almost every archived event comes back in every request of its key. When ``P_A`` is one event
(:func:`engine.lql.pattern_checks.single_event_var`) each archived instance is one event matched on its own, so
the matches of a request are the union of each of its events' matches, and an event's matches never change.
:class:`ArchivedMemo` keeps them by event: a request runs the matcher only over the events no earlier request
brought. The logical requests, their rows and the results are unchanged (001 section 6 counts requests, not
matcher work); only the CPU per request falls. It is a cache: forgetting an entry only costs matching that event
again.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

from engine.events import Event
from engine.match import Match

MAX_EVENTS = 100_000
"""The most events remembered (0.75-1.2 KiB each with their matches, measured: up to ~120 MB per query); beyond it
the events before the runner's horizon are forgotten, then the oldest until half of it is left."""

_Key = tuple[str, int, int]


class ArchivedMemo:
    """Each archived event's matches of a one-event ``P_A`` (see the module docstring); safe across threads.

    Parameters
    ----------
    max_events : int
        The most events remembered (:data:`MAX_EVENTS`).

    Attributes
    ----------
    reused : int
        Events whose matches came from the memo.
    matched : int
        Events given to a fresh matcher.
    """

    def __init__(self, max_events: int = MAX_EVENTS) -> None:
        if max_events < 1:
            raise ValueError("max_events must be >= 1")
        self.max_events = max_events
        self.matches: dict[_Key, tuple[Event, tuple[Match, ...]]] = {}
        """``(type, id, ts_end) -> (the event, its matches)``."""
        self.lock = threading.Lock()
        self.reused = 0
        self.matched = 0

    def match(
        self, ordered: list[Event], match_fresh: Callable[[list[Event]], list[Match]], horizon_us: int | None
    ) -> list[Match]:
        """The matches of ``P_A`` over ``ordered`` (in (ts_end, id) order), as ``match_fresh(ordered)`` returns them.

        Parameters
        ----------
        ordered : list of Event
            A request's events, sorted by :meth:`Event.order_key`.
        match_fresh : callable
            ``match_fresh(events) -> matches``: a fresh matcher of ``P_A`` over ``events`` (sorted); called once, with
            the events not remembered.
        horizon_us : int or None
            Events ending before this (int microseconds) serve no later request (the runner's horizon): forgotten
            first when the memo is full. None: unknown.

        Returns
        -------
        list of Match
            Each event's matches in event order (a one-event pattern's matcher emits them at the event's push), an
            event repeated with the same ``(ts_end, id)`` taken once, as the matcher does.
        """
        known = self.matches
        slots: list[tuple[_Key, tuple[Match, ...] | None]] = []
        fresh: list[Event] = []
        prev: tuple[int, int] | None = None
        for e in ordered:
            at = (e.ts_end, e.id)
            if at == prev:
                continue  # the matcher drops a repeated (ts_end, id) as late: so does the memo
            prev = at
            k = (e.type, e.id, e.ts_end)
            entry = known.get(k)
            if entry is None:
                fresh.append(e)
            slots.append((k, None if entry is None else entry[1]))
        new = self._remember(fresh, match_fresh(fresh)) if fresh else {}
        out: list[Match] = []
        for k, found in slots:
            out += new[k] if found is None else found
        with self.lock:
            self.reused += len(slots) - len(fresh)
            self.matched += len(fresh)
        if len(self.matches) > self.max_events:
            self._evict(horizon_us)
        return out

    def _remember(self, fresh: list[Event], found: list[Match]) -> dict[_Key, tuple[Match, ...]]:
        """Store each of ``fresh``'s matches (from ``found``) and return them by event."""
        by_event: dict[_Key, list[Match]] = {}
        for m in found:
            e = m.first_event()  # one event per match (single_event_var)
            assert e is not None
            by_event.setdefault((e.type, e.id, e.ts_end), []).append(m)
        new = {(e.type, e.id, e.ts_end): tuple(by_event.get((e.type, e.id, e.ts_end), ())) for e in fresh}
        with self.lock:
            self.matches.update({(e.type, e.id, e.ts_end): (e, new[(e.type, e.id, e.ts_end)]) for e in fresh})
        return new

    def known(self, keys: list[_Key]) -> list[Event | None]:
        """The remembered event of each ``(type, id, ts_end)`` in ``keys`` (None: not remembered): a request's rows
        already seen need not become events again (:mod:`service.live.la_process`)."""
        known = self.matches
        return [None if (entry := known.get(k)) is None else entry[0] for k in keys]

    def _evict(self, horizon_us: int | None) -> None:
        """Forget the events before ``horizon_us``; if more than half the bound remain, keep the newest half (the
        look-back slides forward with the live instances: the oldest events are the first no request needs)."""
        with self.lock:
            if len(self.matches) <= self.max_events:
                return
            kept = self.matches if horizon_us is None else {k: v for k, v in self.matches.items() if k[2] >= horizon_us}
            if len(kept) > self.max_events // 2:
                newest = sorted(kept, key=lambda k: k[2])[len(kept) - self.max_events // 2 :]
                kept = {k: kept[k] for k in newest}
            self.matches = kept

    def stats(self) -> dict[str, int]:
        """``{"events", "reused", "matched"}``: events remembered now, events reused, events matched afresh."""
        with self.lock:
            return {"events": len(self.matches), "reused": self.reused, "matched": self.matched}
