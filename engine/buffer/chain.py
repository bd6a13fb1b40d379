"""Chain-partitioned storage of partial matches for skip_till_any_match.

After Qiu et al., *Complex Event Processing Method over Real-Time Event Streams*
(000_ccc1bed03a96c7be.txt, section 3.2): partial matches are not stored one per
run. Each NFA slot (the paper's *partition*) keeps a chain of nodes, one per
event accepted at that slot; a node links to the nodes of the previous slot (and,
for a Kleene slot, to earlier nodes of the same slot) that it can follow. A node
thereby *covers* every partial match that ends with its event (event-instance
coverage): CoverMatch extends all of them with one edge check per predecessor
node instead of one copy per partial match. When a final node is created,
CombineMatch walks the chains backwards and combines them into every match.

Differences from the paper, and why:

- each node records ``max_start``, the latest first-event timestamp of the partial
  matches it covers; the walk only enters nodes with ``max_start >= end - window``,
  so every path it starts yields a match when the conditions are all edge
  conditions (output-sensitive), and nodes are dropped once their event leaves
  the window;
- conditions that relate non-adjacent variables (``c.x > a.x``, ``b[i].x > a.x``)
  cannot be checked on an edge; they are checked on each combined match.

Units: timestamps int microseconds.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from engine.events import Event
from engine.match import Match
from engine.nfa.compiler import Conjunct, NegSpec, NFAPlan
from engine.nfa.counters import Counters
from engine.nfa.state import PlanState

Sink = Callable[[PlanState, tuple[Any, ...]], None]
_FAR_PAST = -(1 << 62)

# A node is a tuple (event, slot, preds, max_start, start): cheaper to build than an object.
Node = tuple
EVENT, SLOT, PREDS, MAX_START, START = range(5)


class ChainState(PlanState):
    """Per-key chains: ``nodes[j]`` holds slot j's nodes in event order."""

    __slots__ = ("nodes",)

    def __init__(self, plan: NFAPlan) -> None:
        super().__init__(plan)
        self.nodes: list[deque[Node]] = [deque() for _ in plan.slots]

    def live(self) -> int:
        return sum(len(d) for d in self.nodes)


class ChainStorage:
    """CoverMatch / CombineMatch over :class:`ChainState` for one plan.

    Parameters
    ----------
    plan : NFAPlan
        The compiled plan.
    window_us : int | None
        WITHIN in microseconds.
    counters : Counters
        Shared counters (``created`` counts nodes; ``copied`` stays 0: nothing is copied).
    query_name : str | None
        Put in every Match.
    sink : callable
        ``sink(state, env)`` receives complete bindings that still need the trailing
        negation; other matches are appended to the ``out`` list given to ``process``.
    """

    def __init__(
        self, plan: NFAPlan, window_us: int | None, counters: Counters, query_name: str | None, sink: Sink
    ) -> None:
        self.plan = plan
        self.window_us = window_us
        self.counters = counters
        self.query_name = query_name
        self.sink = sink
        self.final = plan.final
        self.slots = plan.slots
        self.kleene = [s.kleene for s in plan.slots]
        self.all_single = not any(self.kleene)
        self.slots_desc = {t: tuple(sorted(js, reverse=True)) for t, js in plan.slot_of_type.items()}
        general: list[Conjunct] = list(plan.emit_general)
        for s in plan.slots:
            general.extend(s.entry_general)
            general.extend(s.take_general)
        self.general = general
        self.general_negs: list[NegSpec] = [
            n for n in plan.negations if n.local_fns is None and n.edge_fns is None
        ]
        self.edge_negs = [
            [n for n in s.negations if n.local_fns is not None or n.edge_fns is not None] for s in plan.slots
        ]
        # matches go straight to the output unless something is left to check on the whole binding
        self.direct = not general and not self.general_negs and not plan.trailing and not plan.returns
        self.fast = self.direct and self.all_single
        self.steps = self._type_steps()
        self.intervals = False
        """Set once an interval event was processed: deques are then in ts_end order, not start order."""

    def new_state(self) -> ChainState:
        return ChainState(self.plan)

    def expire(self, state: ChainState, lower_ts: int) -> None:
        """Drop nodes whose event is older than ``lower_ts`` (outside every future window)."""
        removed = 0
        for d in state.nodes:
            while d and d[0][EVENT].ts_end < lower_ts:
                d.popleft()
                removed += 1
        if removed:
            self.counters.live -= removed
        state.trim(lower_ts)

    def _type_steps(self) -> dict[str, list[tuple[Any, ...]]]:
        """Per event type, the slots it can bind, last slot first, with their condition lists."""
        steps: dict[str, list[tuple[Any, ...]]] = {}
        for etype, js in self.slots_desc.items():
            rows = []
            for j in js:
                slot = self.slots[j]
                # preds of slot j come from slot j-1; a single slot 0 has max_start == event ts,
                # so after expiry every remaining node there is alive
                prev_is_start = j == 1 and not self.kleene[0]
                rows.append(
                    (
                        j,
                        j == self.final and not slot.kleene,
                        slot.kleene,
                        slot.entry_local,
                        slot.entry_edge,
                        self.edge_negs[j],
                        slot.take_local,
                        slot.take_edge,
                        prev_is_start,
                    )
                )
            steps[etype] = rows
        return steps

    def process(self, state: ChainState, e: Event, out: list[Match]) -> None:
        """CoverMatch for one event of this state's key (events arrive in (ts, id) order)."""
        t = e.ts_end  # processing time (= ts for a point event); windows bound the hull [min ts, max ts_end]
        if t != e.ts:
            self.intervals = True
        lb = t - self.window_us if self.window_us is not None else _FAR_PAST
        nodes = state.nodes
        counters = self.counters
        # descending slot order: a node created for e never precedes e itself
        for j, final_single, kleene, local, edge, negs, take_local, take_edge, prev_is_start in self.steps.get(
            e.type, ()
        ):
            preds: list[Node] = []
            start = False
            if not local or all(fn(None, e, None) for fn in local):
                if j == 0:
                    start = True
                else:
                    d = nodes[j - 1]
                    while d and d[0][0].ts_end < lb:
                        d.popleft()
                        counters.live -= 1
                    if edge or negs:
                        for p in d:
                            p_max_start: int = p[3]  # typed locals: the compiled build reads them unboxed
                            if p_max_start < lb:
                                continue
                            pe: Event = p[0]
                            if edge and not all(fn(pe, e, None) for fn in edge):
                                continue
                            if negs and not state.edge_negations_ok(negs, pe, e):
                                continue
                            preds.append(p)
                    elif prev_is_start and not self.intervals:
                        preds = list(d)
                    else:
                        preds = [p for p in d if p[3] >= lb]
            if kleene and (not take_local or all(fn(None, e, None) for fn in take_local)):
                d = nodes[j]
                while d and d[0][0].ts_end < lb:
                    d.popleft()
                    counters.live -= 1
                for q in d:
                    q_max_start: int = q[3]
                    if q_max_start < lb:
                        continue
                    if take_edge and not all(fn(q[0], e, None) for fn in take_edge):
                        continue
                    preds.append(q)
            if not preds and not start:
                continue
            if final_single:
                # a final single event completes matches and is never extended: no node kept
                if start:
                    self._emit(state, (e,), out)
                elif self.fast:
                    self._combine_fast(preds, (e,), lb, t, out)
                else:
                    self.combine(state, preds, (e,) if self.all_single else None, e, lb, out)
                continue
            node = (e, j, preds, e.ts if start else max([p[3] for p in preds]), start)
            nodes[j].append(node)
            counters.created += 1
            counters.live += 1
            if counters.live > counters.peak_live:
                counters.peak_live = counters.live
            if j == self.final:
                if start:
                    self._emit(state, ((e,),), out)
                self.combine(state, preds, None, e, lb, out)
        if state.plan.negations:
            state.record_negations(e)

    def _combine_fast(self, preds: list[Node], suffix: tuple, lb: int, end: int, out: list[Match]) -> None:
        """CombineMatch for all-single plans with nothing left to check: Matches built in place."""
        name = self.query_name
        layout = self.plan.layout
        append = out.append
        for p in preds:
            max_start: int = p[3]  # typed locals: the compiled build reads them unboxed
            if max_start < lb:
                continue
            ev: Event = p[0]
            if p[4]:
                if ev.ts >= lb:
                    append(Match(name, None, ev.ts, end, None, layout, (ev,) + suffix))
                continue
            below = p[2]
            if below and below[0][4]:
                # all slots single: the predecessors are all slot-0 nodes, i.e. start nodes (max_start == ts)
                tail = (ev,) + suffix
                for q in below:
                    first: Event = q[0]
                    if first.ts >= lb:
                        append(Match(name, None, first.ts, end, None, layout, (first,) + tail))
            else:
                self._combine_fast(below, (ev,) + suffix, lb, end, out)

    def combine(
        self, state: ChainState, preds: list[Node], suffix: tuple | None, last: Event, lb: int, out: list[Match]
    ) -> None:
        """CombineMatch: every match that ends with ``last`` and continues one of ``preds``."""
        if suffix is not None:
            self._combine_single(state, preds, suffix, lb, out)
            return
        # general plans: iterative depth-first walk over (node, preds) with an explicit path
        final_slot = self.final
        path: list[tuple[Event, int]] = [(last, final_slot)]
        stack = [iter(preds)]
        while stack:
            for p in stack[-1]:
                if p[MAX_START] < lb:
                    continue
                path.append((p[EVENT], p[SLOT]))
                if p[START] and p[EVENT].ts >= lb:
                    self._emit(state, self._env(path), out)
                stack.append(iter(p[PREDS]))
                break
            else:
                stack.pop()
                path.pop()

    def _combine_single(
        self, state: ChainState, preds: list[Node], suffix: tuple, lb: int, out: list[Match]
    ) -> None:
        """CombineMatch when every slot is a single event: env tuples built back to front."""
        for p in preds:
            if p[MAX_START] < lb:
                continue
            if p[START]:
                if p[EVENT].ts >= lb:
                    self._emit(state, (p[EVENT],) + suffix, out)
            else:
                self._combine_single(state, p[PREDS], (p[EVENT],) + suffix, lb, out)

    def _env(self, path: list[tuple[Event, int]]) -> tuple[Any, ...]:
        groups: list[Any] = [None] * len(self.kleene)
        for ev, s in reversed(path):
            if self.kleene[s]:
                if groups[s] is None:
                    groups[s] = [ev]
                else:
                    groups[s].append(ev)
            else:
                groups[s] = ev
        return tuple(tuple(g) if k else g for g, k in zip(groups, self.kleene))

    def _emit(self, state: ChainState, env: tuple[Any, ...], out: list[Match]) -> None:
        plan = self.plan
        if not self.direct:
            for c in self.general:
                if not c.holds_all(env):
                    return
            for spec in self.general_negs:
                if not state.general_negation_ok(spec, env):
                    return
            if plan.trailing or plan.returns:
                self.sink(state, env)
                return
        first = env[0][0] if self.kleene[0] else env[0]
        last = env[-1][-1] if self.kleene[-1] else env[-1]
        out.append(Match(self.query_name, None, first.ts, last.ts_end, None, plan.layout, env))
