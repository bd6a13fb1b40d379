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
from typing import Any, Callable

from engine.events import Event
from engine.nfa.compiler import Conjunct, NFAPlan, NegSpec
from engine.nfa.counters import Counters
from engine.nfa.state import PlanState

Sink = Callable[[PlanState, tuple[Any, ...]], None]
_FAR_PAST = -(1 << 62)


class Node:
    """One event accepted at one slot, linked to the nodes it can follow."""

    __slots__ = ("event", "slot", "preds", "max_start", "start")

    def __init__(self, event: Event, slot: int, preds: list["Node"], max_start: int, start: bool) -> None:
        self.event = event
        self.slot = slot
        self.preds = preds
        self.max_start = max_start
        self.start = start


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
    """

    def __init__(self, plan: NFAPlan, window_us: int | None, counters: Counters) -> None:
        self.plan = plan
        self.window_us = window_us
        self.counters = counters
        self.final = plan.final
        self.kleene = [s.kleene for s in plan.slots]
        self.all_single = not any(self.kleene)
        general: list[Conjunct] = list(plan.emit_general)
        for s in plan.slots:
            general.extend(s.entry_general)
            general.extend(s.take_general)
        self.general = general
        self.general_negs: list[NegSpec] = [
            n for n in plan.negations if n.local_fns is None and n.edge_fns is None
        ]
        self.edge_negs = [[n for n in s.negations if n.local_fns is not None or n.edge_fns is not None] for s in plan.slots]

    def new_state(self) -> ChainState:
        return ChainState(self.plan)

    def expire(self, state: ChainState, lower_ts: int) -> None:
        """Drop nodes whose event is older than ``lower_ts`` (outside every future window)."""
        removed = 0
        for d in state.nodes:
            while d and d[0].event.ts < lower_ts:
                d.popleft()
                removed += 1
        if removed:
            self.counters.live -= removed
        state.trim(lower_ts)

    def process(self, state: ChainState, e: Event, sink: Sink) -> None:
        """CoverMatch for one event of this state's key (events arrive in (ts, id) order)."""
        plan = self.plan
        t = e.ts
        lb = t - self.window_us if self.window_us is not None else _FAR_PAST
        if self.window_us is not None:
            self.expire(state, lb)
        counters = self.counters
        slots_for = plan.slot_of_type.get(e.type, ())
        # descending slot order: a node created for e never precedes e itself
        for j in reversed(slots_for):
            slot = plan.slots[j]
            preds: list[Node] = []
            start = False
            if all(fn(None, e, None) for fn in slot.entry_local):
                if j == 0:
                    start = True
                else:
                    edge = slot.entry_edge
                    negs = self.edge_negs[j]
                    for p in state.nodes[j - 1]:
                        if p.max_start < lb:
                            continue
                        pe = p.event
                        if edge and not all(fn(pe, e, None) for fn in edge):
                            continue
                        if negs and not state.edge_negations_ok(negs, pe, e):
                            continue
                        preds.append(p)
            if slot.kleene and all(fn(None, e, None) for fn in slot.take_local):
                edge = slot.take_edge
                for q in state.nodes[j]:
                    if q.max_start < lb:
                        continue
                    if edge and not all(fn(q.event, e, None) for fn in edge):
                        continue
                    preds.append(q)
            if not preds and not start:
                continue
            max_start = t if start else max(p.max_start for p in preds)
            node = Node(e, j, preds, max_start, start)
            state.nodes[j].append(node)
            counters.created += 1
            counters.live += 1
            if counters.live > counters.peak_live:
                counters.peak_live = counters.live
            if j == self.final:
                self.combine(state, node, lb, sink)
        if plan.negations:
            state.record_negations(e)

    def combine(self, state: ChainState, node: Node, lb: int, sink: Sink) -> None:
        """CombineMatch: every match ending at final ``node`` (iterative depth-first walk)."""
        path = [node]
        if node.start:
            self._emit(state, path, sink)
        stack = [iter(node.preds)]
        while stack:
            for p in stack[-1]:
                if p.max_start < lb:
                    continue
                path.append(p)
                if p.start and p.event.ts >= lb:
                    self._emit(state, path, sink)
                stack.append(iter(p.preds))
                break
            else:
                stack.pop()
                path.pop()

    def _emit(self, state: ChainState, path: list[Node], sink: Sink) -> None:
        env: tuple[Any, ...]
        if self.all_single:
            env = tuple(n.event for n in reversed(path))
        else:
            groups: list[Any] = [None] * len(self.kleene)
            for n in reversed(path):
                s = n.slot
                if self.kleene[s]:
                    if groups[s] is None:
                        groups[s] = [n.event]
                    else:
                        groups[s].append(n.event)
                else:
                    groups[s] = n.event
            env = tuple(tuple(g) if k else g for g, k in zip(groups, self.kleene))
        for c in self.general:
            if not c.holds_all(env):
                return
        for spec in self.general_negs:
            if not state.general_negation_ok(spec, env):
                return
        sink(state, env)
