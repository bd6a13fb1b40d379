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

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

from engine.events import Event
from engine.match import Match
from engine.nfa.compiler import Conjunct, NegSpec, NFAPlan
from engine.nfa.counters import Counters
from engine.nfa.state import PlanState

Sink = Callable[[PlanState, tuple[Any, ...]], None]
_FAR_PAST: Final = -(1 << 62)  # fits an unboxed int of the compiled build; below every event time


class Node:
    """One chain node: an event accepted at a slot, and the nodes of the previous slot (or, for a Kleene slot,
    earlier nodes of the same slot) that it follows.

    Attributes
    ----------
    event : Event
        The accepted event.
    slot : int
        The slot it was accepted at.
    preds : list[Node]
        The nodes it follows (empty for a start node of slot 0); never changed once the node exists.
    max_start : int
        The latest first-event ts of the partial matches it covers, int microseconds UTC.
    start : bool
        Whether the node starts partial matches itself (slot 0).

    A native class of the compiled build (issue 45): its fields are read as typed C fields, where a tuple's were
    generic subscripts. Pickled as its constructor's arguments; :mod:`engine.pm.codec` writes it to spill storage.
    """

    __slots__ = ("event", "slot", "preds", "max_start", "start")

    def __init__(self, event: Event, slot: int, preds: list[Node], max_start: int, start: bool) -> None:
        self.event = event
        self.slot = slot
        self.preds = preds
        self.max_start = max_start
        self.start = start

    def __reduce__(self) -> tuple[Any, ...]:
        return Node, (self.event, self.slot, self.preds, self.max_start, self.start)

    def __repr__(self) -> str:
        return f"Node(event={self.event.id}, slot={self.slot}, preds={len(self.preds)}, max_start={self.max_start})"


def node_of(value: Any) -> Node:
    """A :class:`Node` from a node or from the tuple ``(event, slot, preds, max_start, start)`` that stood for one
    before issue 45 (pickled states); its preds converted too (``seen``: id of a tuple -> its node, shared)."""
    return _node_of(value, {})


def _node_of(value: Any, seen: dict[int, Node]) -> Node:
    if isinstance(value, Node):
        return value
    done = seen.get(id(value))
    if done is not None:
        return done
    ev, slot, preds, max_start, start = value
    node = Node(ev, slot, [_node_of(p, seen) for p in preds], max_start, start)
    seen[id(value)] = node
    return node


_NO_PREDS: Final[list[Node]] = []
"""The preds of every single start node (nothing appends to a node's preds)."""


class NodeQueue:
    """One slot's nodes in event order: a list and the index of its first live node, so that dropping the oldest is
    O(1) (the dropped prefix is cut off once it is the larger part) and the compiled build reads nodes by index.

    The chain storage reads ``items[head:]`` directly; :mod:`engine.pm.buffer` uses the deque-like methods. Pickled
    as its live nodes.
    """

    __slots__ = ("items", "head")

    def __init__(self, items: Iterable[Node] = ()) -> None:
        self.items: list[Node] = list(items)
        self.head = 0

    def __reduce__(self) -> tuple[Any, ...]:
        return NodeQueue, (self.items[self.head:],)

    def __len__(self) -> int:
        return len(self.items) - self.head

    def __bool__(self) -> bool:
        return len(self.items) > self.head

    def __iter__(self) -> Iterator[Node]:
        return iter(self.items[self.head:])

    def __getitem__(self, i: int) -> Node:
        n = len(self.items) - self.head
        if i < 0:
            i += n
        if i < 0 or i >= n:
            raise IndexError("node index out of range")
        return self.items[self.head + i]

    def __repr__(self) -> str:
        return f"NodeQueue({self.items[self.head:]!r})"

    def append(self, node: Node) -> None:
        self.items.append(node)

    def prepend(self, nodes: list[Node]) -> None:
        """Put ``nodes`` (in event order, all older than the queue's) before the first live node."""
        self.items = nodes + self.items[self.head:]
        self.head = 0

    def clear(self) -> None:
        self.items = []
        self.head = 0

    def drop_before(self, lower_ts: int) -> int:
        """Drop the leading nodes whose event ends before ``lower_ts``; returns how many."""
        items = self.items
        n = len(items)
        h = self.head
        while h < n:
            node = items[h]
            if node.event.ts_end >= lower_ts:
                break
            h += 1
        removed = h - self.head
        if removed:
            if h == n:
                self.items = []
                h = 0
            elif h > 32 and 2 * h > n:
                del items[:h]
                h = 0
            self.head = h
        return removed


class Step:
    """What an event of one type does at one slot (:meth:`ChainStorage.process`), with the slot's condition lists
    (the same list objects as the plan's: the conjunct planner re-orders them in place)."""

    __slots__ = (
        "j", "final_single", "kleene", "local", "edge", "negs", "local_negs", "other_negs", "take_local",
        "take_edge", "prev_is_start",
    )

    def __init__(
        self,
        j: int,
        final_single: bool,
        kleene: bool,
        local: list[Any],
        edge: list[Any],
        negs: list[NegSpec],
        take_local: list[Any],
        take_edge: list[Any],
        prev_is_start: bool,
    ) -> None:
        self.j = j
        self.final_single = final_single
        self.kleene = kleene
        self.local = local
        self.edge = edge
        self.negs = negs
        self.local_negs: list[int] = [n.k for n in negs if n.local_fns is not None]
        """The indices ``k`` of the local-only negations checked on the edge into this slot."""
        self.other_negs: list[NegSpec] = [n for n in negs if n.local_fns is None]
        self.take_local = take_local
        self.take_edge = take_edge
        self.prev_is_start = prev_is_start


class ChainState(PlanState):
    """Per-key chains: ``nodes[j]`` holds slot j's nodes in event order."""

    __slots__ = ("nodes",)

    def __init__(self, plan: NFAPlan) -> None:
        super().__init__(plan)
        self.nodes: list[NodeQueue] = [NodeQueue() for _ in plan.slots]

    def live(self) -> int:
        n = 0
        for q in self.nodes:
            n += len(q.items) - q.head
        return n

    def restore_fields(self, fields: dict[str, Any]) -> None:
        """Set the pickled ``fields`` (:func:`engine.nfa.state.rebuild`); pickles made before issue 45 hold deques of
        node tuples."""
        nodes = fields.get("nodes")
        if nodes is not None:
            seen: dict[int, Node] = {}
            fields = dict(fields)
            fields["nodes"] = [
                d if isinstance(d, NodeQueue) else NodeQueue(_node_of(n, seen) for n in d) for d in nodes
            ]
        super().restore_fields(fields)


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
        self.has_window = window_us is not None
        self.window: int = window_us if window_us is not None else 0
        self.counters = counters
        self.query_name = query_name
        self.sink = sink
        self.final = plan.final
        self.slots = plan.slots
        self.layout: Any = plan.layout
        self.kleene = [s.kleene for s in plan.slots]
        self.all_single = not any(self.kleene)
        self.has_negations = bool(plan.negations)
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
        """Set once an interval event was processed: node queues are then in ts_end order, not start order."""

    def new_state(self) -> ChainState:
        return ChainState(self.plan)

    def expire(self, state: ChainState, lower_ts: int) -> None:
        """Drop nodes whose event is older than ``lower_ts`` (outside every future window)."""
        removed = 0
        for q in state.nodes:
            removed += q.drop_before(lower_ts)
        if removed:
            self.counters.live -= removed
        state.trim(lower_ts)

    def _type_steps(self) -> dict[str, list[Step]]:
        """Per event type, the slots it can bind, last slot first, with their condition lists."""
        steps: dict[str, list[Step]] = {}
        for etype, js in self.slots_desc.items():
            rows = []
            for j in js:
                slot = self.slots[j]
                # preds of slot j come from slot j-1; a single slot 0 has max_start == event ts,
                # so after expiry every remaining node there is alive
                prev_is_start = j == 1 and not self.kleene[0]
                rows.append(
                    Step(
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
        lb: int = t - self.window if self.has_window else _FAR_PAST
        steps = self.steps.get(e.type)
        if steps is not None:
            self._steps(state, steps, e, t, lb, out)
        if self.has_negations:
            state.record_negations(e)

    def _steps(self, state: ChainState, steps: list[Step], e: Event, t: int, lb: int, out: list[Match]) -> None:
        nodes = state.nodes
        counters = self.counters
        # descending slot order: a node created for e never precedes e itself
        for step in steps:
            j = step.j
            kleene = step.kleene
            local = step.local
            preds: list[Node] = _NO_PREDS
            start = False
            max_start: int = _FAR_PAST
            if not local or all(fn(None, e, None) for fn in local):
                if j == 0:
                    start = True
                    max_start = e.ts
                else:
                    q = nodes[j - 1]
                    dropped = q.drop_before(lb)
                    if dropped:
                        counters.live -= dropped
                    items = q.items
                    h = q.head
                    n = len(items)
                    if h == n:
                        pass
                    elif step.final_single and not kleene and self.fast and not step.edge and not step.negs:
                        # a final single event with nothing to check on the edge: combine straight from the queue
                        self._combine_fast_top(items, h, e, lb, t, out)
                        continue
                    elif step.edge or step.negs:
                        preds = []
                        edge = step.edge
                        local_negs = step.local_negs
                        other_negs = step.other_negs
                        # the latest (ts_end, id) of an event violating one of the local negations
                        neg_ts: int = _FAR_PAST
                        neg_id: int = _FAR_PAST
                        for k in local_negs:
                            kt: int = state.neg_last_ts[k]
                            ki: int = state.neg_last_id[k]
                            if kt > neg_ts or (kt == neg_ts and ki > neg_id):
                                neg_ts = kt
                                neg_id = ki
                        for i in range(h, n):
                            p = items[i]
                            if p.max_start < lb:
                                continue
                            pe = p.event
                            if edge and not all(fn(pe, e, None) for fn in edge):
                                continue
                            if local_negs:
                                pt = pe.ts_end
                                if neg_ts > pt or (neg_ts == pt and neg_id > pe.id):
                                    continue
                            if other_negs and not state.edge_negations_ok(other_negs, pe, e):
                                continue
                            preds.append(p)
                            if p.max_start > max_start:
                                max_start = p.max_start
                    elif step.prev_is_start and not self.intervals:
                        # start nodes (max_start == ts): all alive after expiry (a reload of spilled nodes may put
                        # older ones after newer ones: max_start is the largest, not the last)
                        preds = items[h:]
                        for p in preds:
                            if p.max_start > max_start:
                                max_start = p.max_start
                    else:
                        preds = []
                        for i in range(h, n):
                            p = items[i]
                            if p.max_start >= lb:
                                preds.append(p)
                                if p.max_start > max_start:
                                    max_start = p.max_start
            if kleene and (not step.take_local or all(fn(None, e, None) for fn in step.take_local)):
                own = nodes[j]
                dropped = own.drop_before(lb)
                if dropped:
                    counters.live -= dropped
                take_edge = step.take_edge
                own_items = own.items
                n = len(own_items)
                if own.head < n and preds is _NO_PREDS:
                    preds = []
                for i in range(own.head, n):
                    p = own_items[i]
                    if p.max_start < lb:
                        continue
                    if take_edge and not all(fn(p.event, e, None) for fn in take_edge):
                        continue
                    preds.append(p)
                    if p.max_start > max_start:
                        max_start = p.max_start
            if not preds and not start:
                continue
            if step.final_single:
                # a final single event completes matches and is never extended: no node kept
                if start:
                    self._emit(state, (e,), out)
                elif self.fast:
                    self._combine_fast(preds, (e,), lb, t, out)
                else:
                    self.combine(state, preds, (e,) if self.all_single else None, e, lb, out)
                continue
            node = Node(e, j, preds, e.ts if start else max_start, start)
            nodes[j].append(node)
            counters.created += 1
            counters.live += 1
            if counters.live > counters.peak_live:
                counters.peak_live = counters.live
            if j == self.final:
                if start:
                    self._emit(state, ((e,),), out)
                self.combine(state, preds, None, e, lb, out)

    def _combine_fast_top(self, items: list[Node], h: int, e: Event, lb: int, end: int, out: list[Match]) -> None:
        """:meth:`_combine_fast` for a final single event ``e`` over the previous slot's nodes ``items[h:]``, the env
        tuples of two- and three-slot matches built at once."""
        name = self.query_name
        layout = self.layout
        for i in range(h, len(items)):
            p = items[i]
            if p.max_start < lb:
                continue
            ev = p.event
            if p.start:
                if ev.ts >= lb:
                    out.append(Match(name, None, ev.ts, end, None, layout, (ev, e)))
                continue
            below = p.preds
            if below and below[0].start:
                # all slots single: the predecessors are all slot-0 nodes, i.e. start nodes (max_start == ts)
                for q in below:
                    first = q.event
                    if first.ts >= lb:
                        out.append(Match(name, None, first.ts, end, None, layout, (first, ev, e)))
            else:
                self._combine_fast(below, (ev, e), lb, end, out)

    def _combine_fast(self, preds: list[Node], suffix: tuple[Any, ...], lb: int, end: int, out: list[Match]) -> None:
        """CombineMatch for all-single plans with nothing left to check: Matches built in place."""
        name = self.query_name
        layout = self.layout
        for p in preds:
            if p.max_start < lb:
                continue
            ev = p.event
            if p.start:
                if ev.ts >= lb:
                    out.append(Match(name, None, ev.ts, end, None, layout, (ev,) + suffix))
                continue
            below = p.preds
            if below and below[0].start:
                # all slots single: the predecessors are all slot-0 nodes, i.e. start nodes (max_start == ts)
                tail = (ev,) + suffix
                for q in below:
                    first = q.event
                    if first.ts >= lb:
                        out.append(Match(name, None, first.ts, end, None, layout, (first,) + tail))
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
                if p.max_start < lb:
                    continue
                path.append((p.event, p.slot))
                if p.start and p.event.ts >= lb:
                    self._emit(state, self._env(path), out)
                stack.append(iter(p.preds))
                break
            else:
                stack.pop()
                path.pop()

    def _combine_single(
        self, state: ChainState, preds: list[Node], suffix: tuple, lb: int, out: list[Match]
    ) -> None:
        """CombineMatch when every slot is a single event: env tuples built back to front."""
        for p in preds:
            if p.max_start < lb:
                continue
            ev = p.event
            if p.start:
                if ev.ts >= lb:
                    self._emit(state, (ev,) + suffix, out)
            else:
                self._combine_single(state, p.preds, (ev,) + suffix, lb, out)

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
        out.append(Match(self.query_name, None, first.ts, last.ts_end, None, self.layout, env))
