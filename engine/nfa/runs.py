"""Run-per-partial-match NFA execution for every selection strategy.

The SASE+ NFA^b evaluation (Agrawal et al., SIGMOD 2008, section 3; Diao et al.,
SASE+ technical report 2007): a *run* is one partial match in one NFA state. On
each event a run may *take* it (Kleene self-loop), *proceed* to the next
component by binding it, or *ignore* it; the selection strategy decides which
of these are allowed and whether the run branches (docs/semantics.md section 4):

- ``skip_till_any_match``: every take/proceed creates a new run and the old run
  stays (ignore is always allowed): all combinations. This is the baseline that
  chain-partitioned storage (``engine.buffer.chain``) is measured against.
- ``skip_till_next_match``: irrelevant events are ignored; a relevant event must
  be taken or proceeded with; the run branches only when both apply.
- ``strict_contiguity`` / ``partition_contiguity``: a run must take or proceed
  with every event of its (partition) stream, else it dies.

A run's binding ``env`` is a prefix tuple: one entry per bound slot, an Event
for a single component, a tuple of Events for a Kleene component. Extending a
run builds a new tuple that shares the events (no event is copied).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.events import Event
from engine.match import Match
from engine.nfa.compiler import NFAPlan
from engine.nfa.counters import Counters
from engine.nfa.state import PlanState

Sink = Callable[[PlanState, tuple[Any, ...]], None]
_ANY, _NEXT, _CONTIGUOUS = range(3)
_FAR_PAST = -(1 << 62)


# A run is a tuple (first_ts, env): the ts of its first event and its bound slots (a prefix).
Run = tuple


class RunState(PlanState):
    """Per-key live runs: ``by_slot[j]`` holds the runs whose last bound slot is j.

    Runs are filed by NFA state so that an event only visits the runs it can
    advance (an event of type C never looks at runs waiting for a B).
    """

    __slots__ = ("by_slot",)

    def __init__(self, plan: NFAPlan) -> None:
        super().__init__(plan)
        self.by_slot: list[list[Run]] = [[] for _ in plan.slots]

    def live(self) -> int:
        return sum(len(runs) for runs in self.by_slot)


class RunStorage:
    """Evaluates one plan with one run per partial match.

    Parameters
    ----------
    plan : NFAPlan
    window_us : int | None
        WITHIN in microseconds.
    strategy : str
        One of the four selection strategies.
    counters : Counters
        Shared counters (``created``: runs created; ``copied``: runs created while
        the run they extend stays alive).
    query_name : str | None
        Put in every Match.
    sink : callable
        ``sink(state, env)`` receives complete bindings that need a trailing negation or
        RETURN fields; other matches are appended to the ``out`` list given to ``process``.
    """

    def __init__(
        self,
        plan: NFAPlan,
        window_us: int | None,
        strategy: str,
        counters: Counters,
        query_name: str | None,
        sink: Sink,
    ) -> None:
        self.plan = plan
        self.query_name = query_name
        self.sink = sink
        self.direct = not plan.trailing and not plan.returns
        self.window_us = window_us
        self.strategy = strategy
        self.any = strategy == "skip_till_any_match"
        self.next = strategy == "skip_till_next_match"
        self.counters = counters
        self.final = plan.final
        self.kleene = [s.kleene for s in plan.slots]
        self.mode = _ANY if self.any else _NEXT if self.next else _CONTIGUOUS
        self.first = plan.slots[0]
        empty: frozenset[str] = frozenset()
        self.take_types = [s.types if s.kleene else empty for s in plan.slots]
        self.proceed_types = [plan.slots[j + 1].types if j < self.final else empty for j in range(len(plan.slots))]
        n = len(plan.slots)
        self.all_slots = tuple(range(n - 1, -1, -1))
        # slots whose runs proceed on every event of the next slot's types: no conditions, no negation,
        # nothing to check at emission, not skip_till_any_match (whose runs stay), and when the next slot
        # is the last one, a single component whose matches go straight out
        self.plain_proceed = [
            j < self.final
            and self.mode != _ANY
            and not (nxt := plan.slots[j + 1]).entry_local
            and not nxt.entry_edge
            and not nxt.entry_general
            and not nxt.negations
            and (j + 1 < self.final or (self.direct and not nxt.kleene and not plan.emit_general))
            for j in range(n)
        ]
        # slots whose runs an event type can advance (contiguity visits every slot: others die)
        self.visit: dict[str, tuple[int, ...]] = {}
        self.default_visit = self.all_slots if self.mode == _CONTIGUOUS else ()
        if self.mode != _CONTIGUOUS:
            for t in {t for s in plan.slots for t in s.types}:
                self.visit[t] = tuple(
                    j for j in self.all_slots if t in self.take_types[j] or t in self.proceed_types[j]
                )

    def new_state(self) -> RunState:
        return RunState(self.plan)

    def expire(self, state: RunState, lower_ts: int) -> None:
        """Drop runs whose first event is older than ``lower_ts``."""
        for j, runs in enumerate(state.by_slot):
            if runs:
                alive = [r for r in runs if r[0] >= lower_ts]
                if len(alive) != len(runs):
                    self.counters.live -= len(runs) - len(alive)
                    state.by_slot[j] = alive
        state.trim(lower_ts)

    def clear(self, state: RunState) -> None:
        """Kill every run (strict contiguity: an event of another key arrived)."""
        for j, runs in enumerate(state.by_slot):
            self.counters.live -= len(runs)
            state.by_slot[j] = []

    def process(self, state: RunState, e: Event, out: list[Match]) -> None:
        """Advance the runs of this key that ``e`` can concern, then start a new run at ``e``."""
        counters = self.counters
        lower = e.ts_end - self.window_us if self.window_us is not None else _FAR_PAST
        if self.window_us is not None and self.plan.negations:
            state.trim(lower)
        etype = e.type
        mode = self.mode
        by_slot = state.by_slot
        # last slot first: runs that proceed into slot j+1 do not see e again
        for j in self.visit.get(etype, self.default_visit):
            runs = by_slot[j]
            if not runs:
                continue
            can_take = etype in self.take_types[j]
            can_proceed = etype in self.proceed_types[j]
            if can_proceed and not can_take and self.plain_proceed[j]:
                # every run in the window proceeds, unconditionally (P1 under skip_till_next_match)
                self._proceed_all(j, runs, e, lower, by_slot, out)
                continue
            keep: list[Run] = []
            up = by_slot[j + 1] if j < self.final else keep
            n_up = len(up)
            dropped = 0
            for r in runs:
                if r[0] < lower:
                    dropped += 1
                    continue
                if not can_take and not can_proceed:
                    if mode != _CONTIGUOUS:
                        keep.append(r)  # ignore an irrelevant event
                    else:
                        dropped += 1
                    continue
                taken = self._take(j, r, e) if can_take else None
                applies, proceeded = self._proceed(state, j, r, e) if can_proceed else (False, None)
                if mode == _ANY:
                    keep.append(r)
                    counters.copied += (taken is not None) + (proceeded is not None)
                elif mode == _NEXT and taken is None and not applies:
                    keep.append(r)
                else:
                    dropped += 1
                    if taken is not None and proceeded is not None:
                        counters.copied += 1
                if taken is not None:
                    self._add(state, j, taken, keep, out)
                if proceeded is not None:
                    self._add(state, j + 1, proceeded, up, out)
            by_slot[j] = keep
            counters.live += len(keep) - len(runs) + (len(up) - n_up if up is not keep else 0)
        first = self.first
        if etype in first.types and (not first.entry_local or all(fn(None, e, None) for fn in first.entry_local)):
            env: tuple[Any, ...] = ((e,),) if first.kleene else (e,)
            if not first.entry_general or all(c.holds_all(env) for c in first.entry_general):
                if self._add(state, 0, (e.ts, env), by_slot[0], out):
                    counters.live += 1
        if counters.live > counters.peak_live:
            counters.peak_live = counters.live
        if self.plan.negations:
            state.record_negations(e)

    def _proceed_all(
        self, j: int, runs: list[Run], e: Event, lower: int, by_slot: list[list[Run]], out: list[Match]
    ) -> None:
        """Move every run of slot ``j`` that is still in the window into slot ``j + 1`` with ``e``."""
        counters = self.counters
        by_slot[j] = []
        counters.live -= len(runs)
        if j + 1 == self.final:  # a single final component without conditions: emit and end
            name = self.query_name
            layout = self.plan.layout
            ts = e.ts
            n = 0
            for r in runs:
                if r[0] >= lower:
                    out.append(Match(name, None, r[0], ts, None, layout, r[1] + (e,)))
                    n += 1
            counters.created += n
            return
        bind: Any = (e,) if self.kleene[j + 1] else e
        up = by_slot[j + 1]
        n_up = len(up)
        up.extend([(r[0], r[1] + (bind,)) for r in runs if r[0] >= lower])
        counters.created += len(up) - n_up
        counters.live += len(up) - n_up

    def _add(self, state: RunState, j: int, run: Run, into: list[Run], out: list[Match]) -> bool:
        """Count a new run at slot ``j``, emit it when complete, keep it unless it is finished."""
        self.counters.created += 1
        if j == self.final:
            env = run[1]
            if not self.plan.emit_general or all(c.holds_all(env) for c in self.plan.emit_general):
                if self.direct:
                    first = env[0][0] if self.kleene[0] else env[0]
                    last = env[-1][-1] if self.kleene[-1] else env[-1]
                    out.append(Match(self.query_name, None, first.ts, last.ts_end, None, self.plan.layout, env))
                else:
                    self.sink(state, env)
            if not self.kleene[j]:
                return False
        into.append(run)
        return True

    def _take(self, j: int, r: Run, e: Event) -> Run | None:
        slot = self.plan.slots[j]
        for fn in slot.take_local:
            if not fn(None, e, None):
                return None
        env = r[1]
        seq = env[j]
        prev = seq[-1]
        for fn in slot.take_edge:
            if not fn(prev, e, None):
                return None
        env = env[:-1] + (seq + (e,),)
        for c in slot.take_general:
            if not c.holds_last(env):
                return None
        return (r[0], env)

    def _proceed(self, state: RunState, j: int, r: Run, e: Event) -> tuple[bool, Run | None]:
        """(whether proceeding applies, the new run or None when a negation fails)."""
        slot = self.plan.slots[j + 1]
        for fn in slot.entry_local:
            if not fn(None, e, None):
                return False, None
        env = r[1]
        prev = env[j][-1] if self.kleene[j] else env[j]
        for fn in slot.entry_edge:
            if not fn(prev, e, None):
                return False, None
        env = env + (((e,),) if slot.kleene else (e,))
        for c in slot.entry_general:
            if not c.holds_all(env):
                return False, None
        for spec in slot.negations:
            if spec.local_fns is not None or spec.edge_fns is not None:
                if not state.edge_negations_ok([spec], prev, e):
                    return True, None
            elif not state.general_negation_ok(spec, env):
                return True, None
        return True, (r[0], env)

