"""Event time of the live service: per event type, the newest accepted time and the watermark (docs/architecture.md
section 7.3).

Each event type T has ``newest[T]``, the largest ts (an interval event's ``ts_end``) accepted, and its
watermark ``newest[T] - lateness(T)``: an event of T behind it is late. A set of types (what one statement
reads) has the minimum of their watermarks minus 1 us, Flink-style: a type that has sent nothing for
``idle_timeout_s`` of wall time stops holding it back (when every type is idle, the largest counts). The
live runtime, the restart replay and every statement's detector read event time from here and nowhere else.

An **ended** type (``POST /event-types/{name}/end``, :meth:`EventTime.end`) is Flink's end of input: its watermark
is :data:`END_OF_TIME`, so it holds no set back, and a set whose every type ended has :data:`END_OF_TIME`: every
window, subwindow and live instance of a statement reading only ended types closes. No event of an ended type
is accepted again (the ingest refuses them, :mod:`service.live.ingest`).

Idleness never invents event time: a set whose types are all idle keeps the watermark of its events
(:meth:`EventTime.idle`); what waits only to batch archive requests (an SLLAA subwindow) closes on it
(``Runner.idle``), what waits for event time (a window, a trailing negation) does not.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from engine.events import END_OF_TIME


class EventTime:
    """Per-type newest event time (int microseconds UTC) and wall-clock activity.

    Parameters
    ----------
    lateness_us : callable
        Event type name -> its allowed lateness, int microseconds (0 for an unknown type).
    idle_timeout_s : float
        Wall seconds after which a silent type stops holding watermarks back.
    """

    def __init__(self, lateness_us: Callable[[str], int], idle_timeout_s: float = 60.0) -> None:
        self.lateness_us = lateness_us
        self.idle_timeout_s = idle_timeout_s
        self.newest: dict[str, int] = {}
        """Event type -> the newest ts accepted, int us."""
        self.wall: dict[str, float] = {}
        """Event type -> when (``time.monotonic()`` seconds) it last sent an event."""
        self.ended: dict[str, int | None] = {}
        """Ended event type -> its newest ts when it ended (int us; None: it had sent nothing)."""

    def end(self, type_name: str, end_ts_us: int | None) -> None:
        """Mark ``type_name`` ended at ``end_ts_us`` (its newest ts then, int us; None: none): its watermark
        becomes :data:`END_OF_TIME` (Flink's end of input)."""
        self.ended[type_name] = end_ts_us

    def reopen(self, type_name: str) -> None:
        """Forget that ``type_name`` ended (its type was deleted)."""
        self.ended.pop(type_name, None)

    def idle(self, types: Iterable[str]) -> bool:
        """Whether every one of ``types`` that has sent an event is idle (silent for ``idle_timeout_s``) or
        ended, and at least one has sent one: nothing is coming soon."""
        now = time.monotonic()
        seen = False
        for t in types:
            if t in self.ended:
                seen = True
                continue
            if t not in self.newest:
                continue
            seen = True
            if now - self.wall.get(t, 0.0) <= self.idle_timeout_s:
                return False
        return seen

    def watermark_of(self, type_name: str, newest: Mapping[str, int] | None = None) -> int | None:
        """``newest[T] - lateness(T)`` (None before T's first event); ``newest`` overrides the recorded map
        (an ingest request checks its events against what it has accepted so far)."""
        top = (self.newest if newest is None else newest).get(type_name)
        return None if top is None else top - self.lateness_us(type_name)

    def observe(self, type_name: str, ts_us: int) -> None:
        """Record an accepted (or replayed, or derived) event of ``type_name`` at ``ts_us``."""
        top = self.newest.get(type_name)
        if top is None or ts_us > top:
            self.newest[type_name] = ts_us
        self.wall[type_name] = time.monotonic()

    def take(self, newest: Mapping[str, int], types: Iterable[str]) -> None:
        """Adopt a request's ``newest`` map (its accepted events), and mark ``types`` active now."""
        self.newest = dict(newest)
        now = time.monotonic()
        for t in types:
            self.wall[t] = now

    def watermark(self, types: Iterable[str]) -> int | None:
        """No event of ``types`` with ts <= this will be accepted (None: none of them has sent one)."""
        active: list[int] = []
        idle: list[int] = []
        now = time.monotonic()
        ended = 0
        for t in types:
            if t in self.ended:
                ended += 1
                continue
            wm = self.watermark_of(t)
            if wm is None:
                continue
            (idle if now - self.wall.get(t, 0.0) > self.idle_timeout_s else active).append(wm)
        if active:
            return min(active) - 1
        if idle:
            return max(idle) - 1
        return END_OF_TIME if ended else None

    def watermark_reached(self, types: Iterable[str]) -> int | None:
        """The watermark of ``types`` from their newest times alone: the minimum of their ``newest[T] - lateness(T)``
        minus 1 us, None unless every one of them has sent an event; no idleness, no end of stream. What the restart
        replay advances to before the first checkpointed position (:func:`service.live.recovery.settle`): at most
        what :meth:`watermark` was then, so nothing it releases was still to come after the checkpoint."""
        wanted = set(types)
        got = [wm for t in wanted if (wm := self.watermark_of(t)) is not None]
        if not got or len(got) < len(wanted):  # a type without an event: its watermark then is unknown
            return None
        return min(got) - 1

    def newest_of(self, types: Iterable[str]) -> int | None:
        """The newest event time over ``types`` (None: none of them has sent one)."""
        return max((self.newest[t] for t in types if t in self.newest), default=None)

    def furthest(self) -> int | None:
        """The largest single-type watermark: how far the rule graph may advance its clock (an ended type
        counts with its newest ts: the statements reading it get :data:`END_OF_TIME` from :meth:`watermark`)."""
        tops: list[int] = []
        for t, top in self.newest.items():
            wm = top if t in self.ended else self.watermark([t])
            if wm is not None:
                tops.append(wm)
        return max(tops) if tops else None
