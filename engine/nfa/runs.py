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

from typing import Any, Callable

from engine.events import Event
from engine.nfa.compiler import NFAPlan
from engine.nfa.counters import Counters
from engine.nfa.state import PlanState

Sink = Callable[[PlanState, tuple[Any, ...]], None]


class Run:
    """One partial match: bound slots ``env`` (prefix), the last bound slot, first event ts."""

    __slots__ = ("env", "slot", "first_ts")

    def __init__(self, env: tuple[Any, ...], slot: int, first_ts: int) -> None:
        self.env = env
        self.slot = slot
        self.first_ts = first_ts


class RunState(PlanState):
    """Per-key live runs, in creation order."""

    __slots__ = ("runs",)

    def __init__(self, plan: NFAPlan) -> None:
        super().__init__(plan)
        self.runs: list[Run] = []

    def live(self) -> int:
        return len(self.runs)


def _last(env: tuple[Any, ...], slot: int, kleene: bool) -> Event:
    return env[slot][-1] if kleene else env[slot]


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
    """

    def __init__(self, plan: NFAPlan, window_us: int | None, strategy: str, counters: Counters) -> None:
        self.plan = plan
        self.window_us = window_us
        self.strategy = strategy
        self.any = strategy == "skip_till_any_match"
        self.next = strategy == "skip_till_next_match"
        self.counters = counters
        self.final = plan.final
        self.kleene = [s.kleene for s in plan.slots]

    def new_state(self) -> RunState:
        return RunState(self.plan)

    def expire(self, state: RunState, lower_ts: int) -> None:
        """Drop runs whose first event is older than ``lower_ts``."""
        before = len(state.runs)
        if before:
            state.runs = [r for r in state.runs if r.first_ts >= lower_ts]
            self.counters.live -= before - len(state.runs)
        state.trim(lower_ts)

    def clear(self, state: RunState) -> None:
        """Kill every run (strict contiguity: an event of another key arrived)."""
        self.counters.live -= len(state.runs)
        state.runs = []

    def process(self, state: RunState, e: Event, sink: Sink) -> None:
        """Advance every run of this key with ``e``, then start a new run at ``e``."""
        plan = self.plan
        slots = plan.slots
        counters = self.counters
        if self.window_us is not None:
            self.expire(state, e.ts - self.window_us)
        etype = e.type
        new: list[Run] = []
        for r in state.runs:
            j = r.slot
            slot = slots[j]
            taken = None
            if slot.kleene and etype in slot.types:
                taken = self._take(r, e)
            proceeded = None
            applies = False
            if j < self.final and etype in slots[j + 1].types:
                applies, proceeded = self._proceed(state, r, e)
            if self.any:
                new.append(r)
            elif self.next and taken is None and not applies:
                new.append(r)  # skip an irrelevant event
            branches = (taken is not None) + (proceeded is not None)
            if self.any:
                counters.copied += branches
            elif branches == 2:
                counters.copied += 1
            for run in (taken, proceeded):
                if run is not None:
                    self._add(state, run, new, sink)
        counters.live += len(new) - len(state.runs)
        state.runs = new
        first = slots[0]
        if etype in first.types and all(fn(None, e, None) for fn in first.entry_local):
            env: tuple[Any, ...] = ((e,),) if first.kleene else (e,)
            if all(c.holds_all(env) for c in first.entry_general):
                if self._add(state, Run(env, 0, e.ts), state.runs, sink):
                    counters.live += 1
        if counters.live > counters.peak_live:
            counters.peak_live = counters.live
        if plan.negations:
            state.record_negations(e)

    def _add(self, state: RunState, run: Run, into: list[Run], sink: Sink) -> bool:
        """Count a new run, emit it when complete, and keep it unless it is finished."""
        self.counters.created += 1
        if run.slot == self.final:
            env = run.env
            if all(c.holds_all(env) for c in self.plan.emit_general):
                sink(state, env)
            if not self.kleene[run.slot]:
                return False
        into.append(run)
        return True

    def _take(self, r: Run, e: Event) -> Run | None:
        slot = self.plan.slots[r.slot]
        for fn in slot.take_local:
            if not fn(None, e, None):
                return None
        env = r.env
        seq = env[r.slot]
        prev = seq[-1]
        for fn in slot.take_edge:
            if not fn(prev, e, None):
                return None
        env = env[:-1] + (seq + (e,),)
        for c in slot.take_general:
            if not c.holds_last(env):
                return None
        return Run(env, r.slot, r.first_ts)

    def _proceed(self, state: RunState, r: Run, e: Event) -> tuple[bool, Run | None]:
        """(whether proceeding applies, the new run or None when a negation fails)."""
        j = r.slot
        slot = self.plan.slots[j + 1]
        for fn in slot.entry_local:
            if not fn(None, e, None):
                return False, None
        prev = _last(r.env, j, self.kleene[j])
        for fn in slot.entry_edge:
            if not fn(prev, e, None):
                return False, None
        env = r.env + (((e,),) if slot.kleene else (e,))
        for c in slot.entry_general:
            if not c.holds_all(env):
                return False, None
        for spec in slot.negations:
            if spec.local_fns is not None or spec.edge_fns is not None:
                if not state.edge_negations_ok([spec], prev, e):
                    return True, None
            elif not state.general_negation_ok(spec, env):
                return True, None
        return True, Run(env, j + 1, r.first_ts)

