"""The live matcher: event time, partition keys and per-key NFA state (docs/architecture.md section 7.5).

``Matcher(query).push(event) -> list[Match]`` and ``advance(watermark) -> list[Match]``,
like Flink CEP's ``process`` / ``advance_time``: the compiled query is stateless,
the matcher owns one state per (partition key, plan).

Event time (docs/architecture.md section 7.3): events are released to the NFA in (ts_end, id) order ((ts, id)
for point events, whose ts_end is ts; an interval event is complete at its end, issue 15).
Below, "ts" is the event's ts_end. An event of type T is **late**, and rejected with :class:`LateEventError`,
when ``ts < max seen ts - allowed_lateness[T]``, when ``ts`` is at or before a
watermark given to :meth:`Matcher.advance`, or when an event after it in (ts, id)
order was already released. Buffered events are released once
``ts <= max seen ts - max allowed lateness``. Timestamps are int microseconds UTC.
"""
from __future__ import annotations

import heapq
import sys
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Literal, cast

from engine.buffer.chain import ChainState, ChainStorage
from engine.compiler import CompiledQuery
from engine.events import END_OF_TIME, Event
from engine.lql.ast import components
from engine.match import Match
from engine.nfa.conjunct_order import ConjunctPlanner, clone_plan
from engine.nfa.counters import Counters
from engine.nfa.runs import RunStorage
from engine.nfa.shared_runs import SharedRunStorage
from engine.nfa.state import Pending, PlanState
from engine.nfa.tree import TreeStorage
from engine.plugins.stage import OperatorStage
from engine.pm.buffer import PartialMatchBuffer
from engine.pm.store import PartialMatchStore

SWEEP_EVERY_US = 10_000_000
"""Sweeping every key for expired partial matches costs O(keys); do it at most every 10 s of event time."""
_BEGIN = (-(1 << 63), -(1 << 63))
_NO_KEY = object()  # strict contiguity: no event released yet


class LateEventError(ValueError):
    """An event that arrived behind the watermark; it was counted and not processed.

    Attributes
    ----------
    event : Event
    reason : str
        One line, e.g. ``late event 17 (type A): ts 1000 is before the watermark 2000``.
    """

    def __init__(self, event: Event, reason: str) -> None:
        self.event = event
        self.reason = reason
        super().__init__(reason)


def _shares_kleene_work(plan: Any, always: bool) -> bool:
    """Whether merging runs can save work in ``plan``: some Kleene slot is shareable (and, unless
    ``always``, its types can bind an earlier component too, so that runs pile up in it)."""
    for j, (ok, slot) in enumerate(zip(plan.shareable, plan.slots)):
        if ok and slot.kleene and (always or any(slot.types & s.types for s in plan.slots[:j])):
            return True
    return False


def late_reason(clock: Any, e: Event) -> str | None:
    """:meth:`Matcher.check_late` for any ``clock`` with a matcher's ``watermark``, ``max_seen``, ``lateness``,
    ``default_lateness`` and ``last_released`` (``lace stream`` checks lateness before any matcher runs)."""
    if e.ts_end <= clock.watermark:
        return f"late event {e.id} (type {e.type}): ts {e.ts_end} is at or before the watermark {clock.watermark}"
    if clock.max_seen is not None:
        lateness = clock.lateness.get(e.type, clock.default_lateness)
        if e.ts_end < clock.max_seen - lateness:
            return (
                f"late event {e.id} (type {e.type}): ts {e.ts_end} is more than the allowed lateness "
                f"({lateness} us) behind the newest event ts {clock.max_seen}"
            )
        if (e.ts_end, e.id) <= clock.last_released:
            return (
                f"late event {e.id} (type {e.type}): (ts, id) = ({e.ts_end}, {e.id}) is not after the last "
                f"processed event {clock.last_released}; equal timestamps must arrive in id order"
            )
    return None


class Matcher:
    """Runs one compiled query over a stream.

    Parameters
    ----------
    query : CompiledQuery
        From :func:`engine.compiler.compile_query`.
    storage : {"chain", "runs"}
        Partial-match storage for skip_till_any_match: chain-partitioned storage
        (default) or one run per partial match (the baseline). Other strategies
        always use runs. A query compiled to a tree plan (``PLAN tree`` / ``auto``,
        :mod:`engine.nfa.tree`) uses ``storage == "tree"`` instead, unless ``pm_capacity`` is set
        (spilling works on NFA state: the NFA runs then, with the same matches).
    allowed_lateness_us : int or dict[str, int]
        How far behind the newest event an event may arrive, in microseconds, for every
        type or per event type (missing types: 0).
    pm_capacity : int, optional
        Keep at most this many partial matches in memory; spill the rest to ``pm_store``
        (:class:`engine.pm.buffer.PartialMatchBuffer`). None: no limit.
    pm_policy : {"stpm", "tpm"}
        Which partial matches to spill first (001, section 5).
    pm_store : PartialMatchStore, optional
        Where spilled partial matches go (default: in memory; ``service.db.pm_store`` for SQL).
    pm_batch : int, optional
        ``ΔR``, partial matches spilled at once (default 10% of ``pm_capacity``).
    pm_query_id : str, optional
        Names this matcher's rows in ``pm_store`` (default the query's NAME); unique per store.
    share_runs : bool or None
        Under skip_till_next_match and the contiguity strategies, advance runs whose futures are
        identical once, as a group (:mod:`engine.nfa.shared_runs`; docs/semantics.md section 4).
        True: for every plan with a shareable Kleene slot; False: never (one run per partial match;
        the same matches); None (default): for the plans where runs pile up in a shareable Kleene
        slot, i.e. its event types can also bind an earlier component, so that the events that
        extend runs also start new ones (the issue 17 "climb"; with disjoint types, as in P2, groups
        hold one or two runs and cost more than they save). Not combined with ``pm_capacity``
        (spilling stores single runs).
    adaptive : bool
        Re-order each edge's WHERE conjuncts from pass probabilities measured on the stream
        (:mod:`engine.nfa.conjunct_order`, 004 Strategy 1); False keeps the compile-time order.
        Never changes the result.
    measure : bool
        Count every conjunct evaluation of every NFA edge (``lace explain --events``); slower.
        The counts are in :attr:`planner` (``planner.report()``).
    planner_options : mapping, optional
        Keyword arguments of :class:`engine.nfa.conjunct_order.ConjunctPlanner` (``first``, ``burst``,
        ``period``, ``hysteresis``, ``decay``).

    Raises
    ------
    ValueError
        For an unknown storage or a negative lateness.
    """

    def __init__(
        self,
        query: CompiledQuery,
        storage: Literal["chain", "runs"] = "chain",
        allowed_lateness_us: int | dict[str, int] = 0,
        pm_capacity: int | None = None,
        pm_policy: str = "stpm",
        pm_store: PartialMatchStore | None = None,
        pm_batch: int | None = None,
        pm_query_id: str | None = None,
        share_runs: bool | None = None,
        adaptive: bool = True,
        measure: bool = False,
        planner_options: Mapping[str, Any] | None = None,
    ) -> None:
        if storage not in ("chain", "runs"):
            raise ValueError(f"storage must be 'chain' or 'runs', not {storage!r}")
        self.query = query
        self.counters = Counters()
        w = query.window_us
        self.storage: str = storage if query.strategy == "skip_till_any_match" else "runs"
        # a tree plan (PLAN tree / auto, engine.nfa.tree) unless partial matches may spill: spilling reads NFA state
        if query.plan_kind == "tree" and pm_capacity is None:
            self.storage = "tree"
        # per-matcher copies of the plans: the planner re-orders their conjunct lists in place
        self.plans = [clone_plan(p) for p in query.plans]
        share = share_runs is not False and query.strategy != "skip_till_any_match" and pm_capacity is None
        self.engines: list[Any] = [
            TreeStorage(p, query.trees[i][0], query.trees[i][1], w, self.counters, query.name, self._sink)
            if self.storage == "tree"
            else ChainStorage(p, w, self.counters, query.name, self._sink)
            if self.storage == "chain"
            else SharedRunStorage(p, w, query.strategy, self.counters, query.name, self._sink)
            if share and _shares_kleene_work(p, always=share_runs is True)
            else RunStorage(p, w, query.strategy, self.counters, query.name, self._sink)
            for i, p in enumerate(self.plans)
        ]
        # after the engines: chain storage copies its general conjuncts at start and must not copy a probe
        self.planner = ConjunctPlanner(
            self.plans, adaptive=adaptive, measure_all=measure, **(planner_options or {})
        )
        self._next_tick = self.planner.next_tick
        if isinstance(allowed_lateness_us, dict):
            self.lateness = dict(allowed_lateness_us)
            self.default_lateness = 0
        else:
            self.lateness = {}
            self.default_lateness = int(allowed_lateness_us)
        if self.default_lateness < 0 or any(v < 0 for v in self.lateness.values()):
            raise ValueError("allowed lateness must be >= 0 microseconds")
        self.max_lateness = max([self.default_lateness, *self.lateness.values()])
        self.states: dict[Hashable, list[PlanState]] = {}
        self.max_seen: int | None = None
        self.watermark = -(1 << 63)
        self.last_released = _BEGIN
        self.buffer: list[tuple[int, int, Event]] = []
        self.pending: list[tuple[int, int, Pending]] = []
        self._seq = 0
        self._out: list[Match] = []
        self._strict = query.strategy == "strict_contiguity"
        self._last_key: Any = _NO_KEY
        self._next_sweep = -(1 << 63)
        self._trailing_types = frozenset(t for p in query.plans for n in p.trailing for t in n.types)
        self._types = query.types
        self._intervals = False  # set by the first interval event (ts_end > ts): matches then get hulls
        self._in_order = self.max_lateness == 0
        self._multi = len(self.engines) > 1
        pb = query.partition_by
        # interned, as the event readers intern attribute names: the per-event attrs.get hits by identity
        self._key_attr = (
            sys.intern(pb[0]) if len(pb) == 1 and pb[0] not in ("ts", "id", "type", "ts_end", "duration") else None
        )
        self.pmb = (
            PartialMatchBuffer(self, pm_capacity, pm_policy, pm_store, pm_batch, query_id=pm_query_id)
            if pm_capacity is not None else None
        )
        # the common case, released inline by push(): one plan, events in order, no spilling, no trailing
        # negation, no strict contiguity, a single-attribute partition key (or none)
        self._simple = (
            self._in_order
            and not self._multi
            and self.pmb is None
            and not self._strict
            and not self._trailing_types
            and (self._key_attr is not None or not pb)
        )
        self._window_us = w
        # the simple path's chain storage, called as a native method in the compiled build (issue 45)
        self._chain: ChainStorage | None = (
            self.engines[0] if self.storage == "chain" and not self._multi else None
        )
        # operator components (issue 16): their operators run before the NFA, on released events
        self.stage: OperatorStage | None = None
        if query.operators:
            self.stage = OperatorStage(query.operators, query.partition_by)
            self._nfa_types = frozenset(t for c in components(query.ast.pattern) for t in c.types)
            self._simple = False

    # ------------------------------------------------------------------ public API

    def push(self, event: Event) -> list[Match]:
        """Offer one event; return the matches it (or the events it released) completed.

        Raises
        ------
        LateEventError
            When the event is late (see the module docstring); it is counted in
            ``stats()["late"]`` and changes nothing.
        """
        if event.type not in self._types:
            self.counters.ignored += 1
            return []
        if event.ts_end != event.ts:
            self._intervals = True
        if self._simple:
            # _release() inlined for the common case (see __init__); same effects, same order
            ts = event.ts_end
            last_ts, last_id = self.last_released
            if (ts > last_ts or (ts == last_ts and event.id > last_id)) and ts > self.watermark:
                self.max_seen = ts
                self.last_released = (ts, event.id)
                counters = self.counters
                counters.events += 1
                if counters.events >= self._next_tick:
                    self._next_tick = self.planner.tick(counters.events)
                key = event.attrs.get(self._key_attr) if self._key_attr is not None else None
                states = self.states.get(key)
                if states is None:
                    states = self.states[key] = [self.engines[0].new_state()]
                out = self._out = []
                chain = self._chain
                if chain is not None:
                    chain.process(cast(ChainState, states[0]), event, out)
                else:
                    self.engines[0].process(states[0], event, out)
                if ts >= self._next_sweep and self._window_us is not None:
                    self._sweep(ts)
                    self._next_sweep = ts + max(self._window_us, SWEEP_EVERY_US)
                if out:
                    if self._intervals:
                        out = self._hull(out)
                    counters.emitted += len(out)
                return out
        out = self._out = []
        if self._in_order:
            # no lateness allowed and nothing buffered: release at once when in (ts, id) order
            ts = event.ts_end
            last_ts, last_id = self.last_released
            if (ts > last_ts or (ts == last_ts and event.id > last_id)) and ts > self.watermark:
                self.max_seen = ts
                self._release(event)
                if not out:
                    return out
                return self._finish(out) if self._multi else self._count(out)
        self._check_late(event)
        if self.max_seen is None or event.ts_end > self.max_seen:
            self.max_seen = event.ts_end
        if self.max_lateness == 0 and not self.buffer:
            self._release(event)
        else:
            heapq.heappush(self.buffer, (event.ts_end, event.id, event))
            limit = self.max_seen - self.max_lateness
            while self.buffer and self.buffer[0][0] <= limit:
                self._release(heapq.heappop(self.buffer)[2])
        return self._finish(out)

    def _count(self, out: list[Match]) -> list[Match]:
        if self._intervals:
            out = self._hull(out)
        self.counters.emitted += len(out)
        return out

    def advance(self, watermark_us: int) -> list[Match]:
        """Declare that no event with ``ts <= watermark_us`` will come.

        Releases buffered events up to it, closes windows that end at or before it and
        emits the trailing-negation matches whose deadline is ``<= watermark_us``.
        """
        out = self._out = []
        while self.buffer and self.buffer[0][0] <= watermark_us:
            self._release(heapq.heappop(self.buffer)[2])
        self._emit_pending(watermark_us)
        if watermark_us > self.watermark:
            self.watermark = watermark_us
        self._sweep(watermark_us)
        return self._finish(out)

    def flush(self) -> list[Match]:
        """End of stream: release everything, emit every pending match, drop all state."""
        out = self.advance(END_OF_TIME)
        for states in self.states.values():
            for engine, st in zip(self.engines, states):
                engine.expire(st, END_OF_TIME)
        self.states.clear()
        if self.pmb is not None:
            self.pmb.clear()
        if self.stage is not None:
            self.stage.clear()
        return out

    def next_deadline(self) -> int | None:
        """The smallest watermark at which :meth:`advance` would release a buffered event or emit a
        trailing-negation match (None: nothing waits on time). Windows close lazily, so they add none."""
        times = [h[0][0] for h in (self.buffer, self.pending) if h]
        return min(times) if times else None

    def held(self) -> dict[str, int | None]:
        """What waits for the watermark (:meth:`advance`) to come out.

        Returns
        -------
        dict
            ``events``: events taken but not matched yet (buffered for the allowed lateness; the matches they
            complete come when the watermark passes their ts); ``matches``: complete matches waiting for their
            trailing negation's deadline; ``earliest_us`` and ``latest_us``: the smallest and largest event
            time (ts_end, int us) among those events and those matches' last events (None: nothing held).
        """
        times = [p.last.ts_end for _, _, p in self.pending if not p.killed]
        matches = len(times)
        if self.buffer:
            # the newest event seen is still buffered while any is (the buffer releases in ts order)
            times += [self.buffer[0][0], max(self.buffer[0][0], self.max_seen or self.buffer[0][0])]
        return {
            "events": len(self.buffer),
            "matches": matches,
            "earliest_us": min(times, default=None),
            "latest_us": max(times, default=None),
        }

    def stats(self) -> dict[str, int]:
        """Counters (see :class:`engine.nfa.counters.Counters`) plus ``keys`` and ``live_partial_matches``."""
        d = self.counters.as_dict()
        d["keys"] = len(self.states)
        d["live_partial_matches"] = self.counters.live
        d["buffered"] = len(self.buffer)
        d["conjunct_reorders"] = self.planner.reorders()
        if self.pmb is not None:
            d.update(self.pmb.counters())
            d["pm_capacity"] = self.pmb.capacity
            d["pm_policy"] = self.pmb.policy.name  # type: ignore[assignment]
            d["spilled_now"] = self.pmb.spilled_count()
        return d

    # ------------------------------------------------------------------ internals

    def check_late(self, event: Event) -> str | None:
        """Why ``event`` would be rejected as late right now, or None; changes nothing, counts nothing."""
        return late_reason(self, event)

    def _check_late(self, e: Event) -> None:
        reason = self.check_late(e)
        if reason is not None:
            self.counters.late += 1
            raise LateEventError(e, reason)

    def _hull(self, out: list[Match]) -> list[Match]:
        """Interval events seen: set each match's interval to the hull ``[min ts, max ts_end)`` of its
        events and drop those whose hull is longer than WITHIN (issue 15: WITHIN bounds
        ``max ts_end - min ts``; the runs only know their first event's start)."""
        window = self.query.window_us
        kept = []
        for m in out:
            evs = [e for bound in m.events.values() for e in bound]
            start = min(e.ts for e in evs)
            end = max(e.ts_end for e in evs)
            if window is not None and end - start > window:
                continue
            m.start, m.end = start, end
            kept.append(m)
        return kept

    def _finish(self, out: list[Match]) -> list[Match]:
        if self._intervals and out:
            out = self._hull(out)
        if len(self.engines) > 1 and len(out) > 1:
            seen: set[Any] = set()
            unique = []
            for m in out:
                k = m.key()
                if k not in seen:
                    seen.add(k)
                    unique.append(m)
            out = unique
        self.counters.emitted += len(out)
        return out

    def _release(self, e: Event) -> None:
        stage = self.stage
        if stage is None:
            self._release_one(e)
            return
        derived = stage.push(e) if e.type in stage.input_types else ()
        if e.type in self._nfa_types:
            self._release_one(e)
        for d in derived:
            self._release_one(d)

    def _release_one(self, e: Event) -> None:
        self.last_released = (e.ts_end, e.id)
        if self.pending and self.pending[0][0] < e.ts_end:
            self._emit_pending(e.ts_end - 1)
        self.counters.events += 1
        if self.counters.events >= self._next_tick:
            self._next_tick = self.planner.tick(self.counters.events)
        key = e.attrs.get(self._key_attr) if self._key_attr is not None else self.query.key_of(e)
        if self._strict and self._last_key is not _NO_KEY and self._last_key != key:
            old = self.states.get(self._last_key)
            if old is not None:
                for engine, st in zip(self.engines, old):
                    engine.clear(st)
            if self.pmb is not None:
                self.pmb.discard_key(self._last_key)
        self._last_key = key
        states = self.states.get(key)
        if states is None:
            states = self.states[key] = [engine.new_state() for engine in self.engines]
        if self._trailing_types and e.type in self._trailing_types:
            for st in states:
                if st.pending:
                    st.kill_pending(e)
        out = self._out
        pmb = self.pmb
        if pmb is not None:
            # the no-spill path: two O(1) tests (engine/pm/buffer.py, module docstring)
            if pmb.spilled_keys and key in pmb.spilled_keys:
                pmb.before(key, states, e)
            n_out = len(out)
        if self._multi:
            for engine, st in zip(self.engines, states):
                engine.process(st, e, out)
        else:
            self.engines[0].process(states[0], e, out)
        if pmb is not None and (pmb.watching or self.counters.live > pmb.watch_from):
            pmb.after(key, states, e, len(out) > n_out)
        if e.ts_end >= self._next_sweep and self.query.window_us is not None:
            self._sweep(e.ts_end)
            # idle keys are swept every window, but at most every SWEEP_EVERY_US of event time
            self._next_sweep = e.ts_end + max(self.query.window_us, SWEEP_EVERY_US)

    def _sink(self, state: PlanState, env: tuple[Any, ...]) -> None:
        plan = state.plan
        if plan.trailing:
            first = env[0][0] if plan.slots[0].kleene else env[0]
            last = env[-1][-1] if plan.slots[-1].kleene else env[-1]
            assert self.query.window_us is not None
            p = Pending(first.ts + self.query.window_us, last, env, plan)
            state.pending.append(p)
            self._seq += 1
            heapq.heappush(self.pending, (p.deadline, self._seq, p))
            self.counters.pending += 1
        else:
            self._out.append(self.query.make_match(plan, env))

    def _emit_pending(self, up_to: int) -> None:
        heap = self.pending
        while heap and heap[0][0] <= up_to:
            p = heapq.heappop(heap)[2]
            self.counters.pending -= 1
            if not p.killed:
                p.killed = True  # emitted: the state's list drops it
                self._out.append(self.query.make_match(p.plan, p.env))

    def _sweep(self, now: int) -> None:
        """Expire partial matches of every key that left the window; forget empty keys."""
        w = self.query.window_us
        if w is None:
            return
        lower = now - w if now < END_OF_TIME else END_OF_TIME
        pmb = self.pmb
        if pmb is not None:
            pmb.expire(lower)
        spilled = pmb.spilled_keys if pmb is not None and pmb.spilled_keys else None
        empty = []
        for key, states in self.states.items():
            alive = spilled is not None and key in spilled
            for engine, st in zip(self.engines, states):
                engine.expire(st, lower)
                if st.live() or st.pending or any(st.neg_buf):
                    alive = True
            if not alive:
                empty.append(key)
        watching = pmb if pmb is not None and pmb.watching else None  # before that it keeps nothing per key
        for key in empty:
            del self.states[key]
            if watching is not None:
                watching.forget_key(key)


def push_events(
    matcher: Matcher, write: Callable[[list[Match]], object], events: list[Event], start: int
) -> tuple[int, LateEventError | None]:
    """Push ``events[start:]`` into ``matcher`` in order, handing each non-empty list of matches to ``write``: the
    driver loop of ``lace match`` (cli/match.py), here so that the compiled build (issue 45) runs it natively and
    calls :meth:`Matcher.push` without the interpreter.

    Parameters
    ----------
    matcher : Matcher
        Receives the events.
    write : callable
        Called with each non-empty result of ``push``, in order.
    events : list[Event]
        A batch of events (in file order).
    start : int
        The index in ``events`` to begin at.

    Returns
    -------
    tuple[int, LateEventError | None]
        ``(len(events), None)`` once every event is pushed; ``(i, error)`` when ``events[i]`` was rejected as late
        (nothing written for it): the caller reports it and calls again with ``start = i + 1``. Any other
        exception of ``push`` or ``write`` propagates.
    """
    n = len(events)
    i = start
    while i < n:
        try:
            found = matcher.push(events[i])
        except LateEventError as e:
            return i, e
        if found:
            write(found)
        i += 1
    return n, None
