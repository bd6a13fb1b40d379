"""The ``INTERVAL`` statement: intervals derived from point streams (issue 15; 002's interval events).

``INTERVAL traffic t WHEN t.avg_speed < 0.5 * t.ndt_kmh PARTITION BY key COVER 5 min MAX GAP 10 min
MIN DURATION 10 min RETURN min(t.avg_speed) AS low, count(t) AS readings``: per partition key, in
``(ts, id)`` order, a maximal run of WHEN-true events whose consecutive gaps are ``<= MAX GAP`` (default
COVER) gives the interval ``[first.ts, last.ts + COVER)`` (each reading stands for COVER of time). The
run is **decided** when the next event of its key is WHEN-false or starts a new run (gap > MAX GAP), or
when the watermark reaches ``last.ts + MAX GAP`` (no event that could extend it can come); it is then
emitted unless shorter than MIN DURATION. RETURN aggregates the run's events as a Kleene variable's.

Events may arrive out of order up to the allowed lateness (as in :class:`engine.matcher.Matcher`): they
are buffered and released in ``(ts, id)`` order, so the result equals an offline pass over the sorted
stream. Timestamps and durations are int microseconds UTC.
"""
from __future__ import annotations

import heapq
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from engine.events import END_OF_TIME, Event, attr_getter
from engine.lql import ast
from engine.match import Match
from engine.matcher import LateEventError
from engine.nfa.compiler import _aggregate, pick_attr
from engine.nfa.conditions import Fn, compile_bool, compile_value
from engine.rules.statements import OneTypeStatement

_NEVER = -(1 << 63)


def _resolver_single(var: str) -> Any:
    """WHEN: ``v.attr`` of the event being judged (the ``b`` argument of ``f(a, b, c)``)."""

    def resolve(ref: ast.AttrRef | ast.Aggregate) -> Fn:
        return pick_attr(1, ref.attr or "")

    return resolve


def _resolver_run(var: str) -> Any:
    """RETURN: the run's events as a Kleene variable, ``env = (events,)`` (``f(env, 0, None)``)."""

    def resolve(ref: ast.AttrRef | ast.Aggregate) -> Fn:
        if isinstance(ref, ast.Aggregate):
            return _aggregate(ref, 0, True)
        get = attr_getter(ref.attr)
        idx = ref.index
        if idx is None or idx.kind == "first":
            return lambda env, i, x: get(env[0][0])
        if idx.kind == "last":
            return lambda env, i, x: get(env[0][-1])
        k = idx.at
        return lambda env, i, x: get(env[0][k - 1]) if len(env[0]) >= k else None

    return resolve


class _Run:
    """One open run of a key: its events (in (ts, id) order) and the deadline version."""

    __slots__ = ("events", "version")

    def __init__(self, first: Event, version: int) -> None:
        self.events = [first]
        self.version = version


@dataclass(frozen=True, slots=True)
class IntervalStatement(OneTypeStatement):
    """A compiled ``INTERVAL`` statement; :meth:`make_detector` builds its :class:`IntervalDeriver`."""

    ast: ast.IntervalRule
    allowed_lateness_us: int = 0

    @property
    def types(self) -> frozenset[str]:
        """The event types it reads (as :attr:`CompiledQuery.types`; backfills read them)."""
        return self.stream_types

    @property
    def partition_by(self) -> tuple[str, ...]:
        """PARTITION BY: runs are per key (as :attr:`CompiledQuery.partition_by`; backfills group by it)."""
        return self.ast.partition_by

    @property
    def window_us(self) -> int | None:
        return None  # a run has no bound on its length

    kind = "interval"
    """The statement kind the service records (``queries.kind``)."""

    backfills = True
    """A backfill runs it per PARTITION BY key group, as live (:mod:`archive.backfill`)."""
    emits_intervals = True
    """Its derived events (EMIT INTO) are interval events (issue 15)."""

    @property
    def match_span_us(self) -> int | None:
        """None: a run has no bound on its length (a backfill reads the whole archive)."""
        return None

    def make_detector(self, allowed_lateness_us: int | dict[str, int] | None = None) -> IntervalDeriver:
        return IntervalDeriver(self.ast, allowed_lateness_us=self.lateness_us(allowed_lateness_us))


class IntervalDeriver:
    """Runs one ``INTERVAL`` statement over a stream (satisfies :class:`engine.detector.Detector`).

    Parameters
    ----------
    rule : IntervalRule
        The checked syntax tree (:func:`engine.lql.parser.parse`).
    allowed_lateness_us : int
        How far behind the newest event an event may arrive, int microseconds >= 0.

    Each result is a :class:`Match` with ``start``/``end`` the interval ``[first.ts, last.ts + COVER)``,
    ``fields`` the RETURN fields and ``events = {var: the run's events}``; a rule graph turns it into a
    derived interval event (ts = start, ts_end = end) of type EMIT INTO.

    Raises (from :meth:`push`)
    --------------------------
    LateEventError
        For an event at or before the watermark, more than the allowed lateness behind the newest
        event, or behind an event already released; it is counted and changes nothing.
    """

    def __init__(self, rule: ast.IntervalRule, *, allowed_lateness_us: int = 0) -> None:
        if allowed_lateness_us < 0:
            raise ValueError("allowed lateness must be >= 0 microseconds")
        self.rule = rule
        self.cover = rule.cover_us
        self.gap = rule.gap_us
        self.min_duration = rule.min_duration_us
        self.lateness = allowed_lateness_us
        when = compile_bool(rule.when, _resolver_single(rule.var)) if rule.when is not None else None
        self.when = when
        self.returns = [(item.alias, compile_value(item.expr, _resolver_run(rule.var))) for item in rule.returns]
        pb = rule.partition_by
        headers = ("ts", "id", "type", "ts_end", "duration")
        self.key_attr = pb[0] if len(pb) == 1 and pb[0] not in headers else None  # the common case, inlined
        self.key_of = (
            (lambda e: None) if not pb else (lambda e: e.get(pb[0])) if len(pb) == 1 else
            (lambda e: tuple(e.get(a) for a in pb))
        )
        self.runs: dict[Hashable, _Run] = {}
        self.deadlines: list[tuple[int, int, Any]] = []  # (last.ts + MAX GAP, version, key)
        self.buffer: list[tuple[int, int, Event]] = []
        self.watermark = _NEVER
        self.max_seen: int | None = None
        self.last_released = (_NEVER, _NEVER)
        self._version = 0
        self._out: list[Match] = []
        self.events = 0
        self.counters = {"ignored": 0, "late": 0, "emitted": 0, "too_short": 0, "runs": 0}

    # ------------------------------------------------------------------ Detector protocol

    def push(self, event: Event) -> list[Match]:
        """Offer one event; return the intervals it (or the events it released) decided."""
        if event.type != self.rule.type:
            self.counters["ignored"] += 1
            return []
        reason = self.check_late(event)
        if reason is not None:
            self.counters["late"] += 1
            raise LateEventError(event, reason)
        out = self._out = []
        if self.max_seen is None or event.ts > self.max_seen:
            self.max_seen = event.ts
        if self.lateness == 0 and not self.buffer:
            self._release(event)
        else:
            heapq.heappush(self.buffer, (event.ts, event.id, event))
            limit = self.max_seen - self.lateness
            while self.buffer and self.buffer[0][0] <= limit:
                self._release(heapq.heappop(self.buffer)[2])
        return self._finish(out)

    def advance(self, watermark_us: int) -> list[Match]:
        """No event with ``ts <= watermark_us`` will come: release buffered events, close decided runs."""
        out = self._out = []
        while self.buffer and self.buffer[0][0] <= watermark_us:
            self._release(heapq.heappop(self.buffer)[2])
        if watermark_us > self.watermark:
            self.watermark = watermark_us
        self._close_due(watermark_us)
        return self._finish(out)

    def flush(self) -> list[Match]:
        """End of stream: every open run is decided."""
        out = self.advance(END_OF_TIME)
        self.runs.clear()
        self.deadlines.clear()
        return out

    def stats(self) -> dict[str, Any]:
        """Counters: events, ignored (other types), late, emitted, too_short (under MIN DURATION), runs
        (started), plus open_runs and buffered."""
        return {"events": self.events, **self.counters, "open_runs": len(self.runs), "buffered": len(self.buffer)}

    def next_deadline(self) -> int | None:
        """The smallest watermark at which :meth:`advance` would release an event or decide a run."""
        times = [self.buffer[0][0]] if self.buffer else []
        while self.deadlines and not self._current(self.deadlines[0]):
            heapq.heappop(self.deadlines)
        if self.deadlines:
            times.append(self.deadlines[0][0])
        return min(times) if times else None

    def output_watermark(self, consumed: int) -> int:
        """A bound below the end (ts_end, the order of derived interval events) of every interval still to
        come, for a rule graph whose input watermark is ``consumed``: an open run ends at or after its last
        event + COVER, a buffered or future event (ts > ``consumed``) at or after its ts + COVER."""
        lows = [run.events[-1].ts for run in self.runs.values()]
        if self.buffer:
            lows.append(self.buffer[0][0])
        low = min(lows) if lows else consumed
        return min(low, consumed) + self.cover - 1

    def check_late(self, event: Event) -> str | None:
        """Why ``event`` would be rejected as late now, or None (changes nothing)."""
        e = event
        if e.ts <= self.watermark:
            return f"late event {e.id} (type {e.type}): ts {e.ts} is at or before the watermark {self.watermark}"
        if self.max_seen is not None:
            if e.ts < self.max_seen - self.lateness:
                return (
                    f"late event {e.id} (type {e.type}): ts {e.ts} is more than the allowed lateness "
                    f"({self.lateness} us) behind the newest event ts {self.max_seen}"
                )
            if (e.ts, e.id) <= self.last_released:
                return f"late event {e.id} (type {e.type}): (ts, id) = ({e.ts}, {e.id}) is not after the last processed"
        return None

    # ------------------------------------------------------------------ internals

    def _current(self, entry: tuple[int, int, Any]) -> bool:
        run = self.runs.get(entry[2])
        return run is not None and run.version == entry[1]

    def _release(self, e: Event) -> None:
        ts = e.ts
        self.last_released = (ts, e.id)
        self.events += 1
        if self.deadlines and self.deadlines[0][0] < ts:
            self._close_due(ts - 1)  # runs no event at or after e.ts can extend
        key = e.attrs.get(self.key_attr) if self.key_attr is not None else self.key_of(e)
        run = self.runs.get(key)
        when = self.when
        ok = when is None or when(None, e, None)
        if not ok and run is None:
            return
        if run is not None:
            if ok and e.ts - run.events[-1].ts <= self.gap:
                run.events.append(e)
                self._version += 1
                run.version = self._version
                heapq.heappush(self.deadlines, (e.ts + self.gap, run.version, key))
                return
            del self.runs[key]
            self._emit(run)
        if ok:
            self._version += 1
            self.runs[key] = _Run(e, self._version)
            self.counters["runs"] += 1
            heapq.heappush(self.deadlines, (e.ts + self.gap, self._version, key))

    def _close_due(self, watermark: int) -> None:
        """Decide the runs whose last event + MAX GAP is at or before ``watermark``."""
        heap = self.deadlines
        while heap and heap[0][0] <= watermark:
            _, version, key = heapq.heappop(heap)
            run = self.runs.get(key)
            if run is not None and run.version == version:
                del self.runs[key]
                self._emit(run)

    def _emit(self, run: _Run) -> None:
        events = run.events
        start = events[0].ts
        end = events[-1].ts + self.cover
        if end - start < self.min_duration:
            self.counters["too_short"] += 1
            return
        env = (tuple(events),)
        fields = {alias: fn(env, 0, None) for alias, fn in self.returns} if self.returns else None
        self._out.append(Match(self.rule.name, {self.rule.var: env[0]}, start, end, fields))

    def _finish(self, out: list[Match]) -> list[Match]:
        self.counters["emitted"] += len(out)
        return out


__all__ = ["IntervalDeriver", "IntervalStatement"]
