"""Tree plans for skip_till_any_match (ZStream-style; 004's match tree, section 4.2-4.3).

A linear plan ``E_0 E_1 ... E_{n-1}`` (single components, no negation, no Kleene closure)
can be evaluated by any binary tree whose leaves are the components in order and whose
inner nodes join two adjacent ranges ``[i..k]`` and ``[k+1..j]`` (004's operator
sequence ``SP``; Mei and Madden, ZStream, SIGMOD 2009). The left-deep tree is the
linear NFA; a bushy or right-deep tree joins rare components first.

Evaluation is incremental over events in (ts, id) order. A partial result of a node is a
binding of its range; it is created when its last event arrives. When an event arrives at
a leaf it travels up while it is a right child: at each parent it is joined with the
stored results of the left sibling (``left.last < right.first`` in (ts, id) order, the
window ``last.ts - first.ts <= W``, and the parent's conjuncts), and the new results go
on up. Results of a node that is a left child are stored there (in the order of their
last event), to be joined later: a left child's results are the only state. A right
child's results never need storing: a later left result contains a later event and
cannot precede them. Every match is produced exactly once, when its last event arrives.

Each WHERE conjunct is evaluated at the lowest node whose range holds all its variables
(004's Strategy 2): conjuncts of one variable at its leaf, before buffering.

Plan choice (004, Algorithm 2, with formula (10)'s cost): per key, with ``r_c`` the rate of
component c's events passing their leaf conjuncts and ``p`` the pass probabilities of the
multi-variable conjuncts, a range of m components produces
``R = prod r_c * prod p * W^(m-1) / (m-1)!`` results per second, of which ``R * W`` are
alive; a join node costs ``R(right) * R(left) * W`` pair checks plus ``R(node)`` results
built per second. Dynamic programming over the split points finds the cheapest tree for
up to :data:`DP_LIMIT` components; beyond, a greedy pass merges the cheapest adjacent
pair first (and the left-deep tree is kept when the greedy one is not cheaper).
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from math import factorial
from typing import Any

from engine.events import Event
from engine.match import Match
from engine.nfa.compiler import Conjunct, NFAPlan
from engine.nfa.counters import Counters
from engine.nfa.state import PlanState

DP_LIMIT = 8
"""Components up to which the plan search is exhaustive (dynamic programming)."""

Shape = Any
"""A tree shape: a component index (leaf) or a pair ``(left shape, right shape)`` over adjacent ranges."""
Sink = Callable[[PlanState, tuple[Any, ...]], None]
_FAR_PAST = -(1 << 62)


def left_deep(n: int) -> Shape:
    """The linear NFA's shape ``((0, 1), 2), ...`` over ``n`` components."""
    shape: Shape = 0
    for i in range(1, n):
        shape = (shape, i)
    return shape


def all_shapes(lo: int, hi: int) -> Iterator[Shape]:
    """Every binary tree over components ``lo..hi`` (Catalan(hi - lo) of them)."""
    if lo == hi:
        yield lo
        return
    for k in range(lo, hi):
        for left in all_shapes(lo, k):
            for right in all_shapes(k + 1, hi):
                yield (left, right)


def shape_range(shape: Shape) -> tuple[int, int]:
    """(first, last) component of a shape."""
    if isinstance(shape, int):
        return shape, shape
    return shape_range(shape[0])[0], shape_range(shape[1])[1]


def shape_text(shape: Shape, names: list[str]) -> str:
    """``((a b) c)``-style text of a shape with the components' variable names."""
    if isinstance(shape, int):
        return names[shape]
    return f"({shape_text(shape[0], names)} {shape_text(shape[1], names)})"


# --------------------------------------------------------------------------- cost model and search


@dataclass(slots=True)
class TreeCostModel:
    """004's cost model for tree plans of one linear plan.

    Attributes
    ----------
    rates : list[float]
        Per component, events per second per key passing its leaf conjuncts.
    pairs : list[tuple[frozenset[int], float]]
        Multi-component conjuncts: (components they read, pass probability).
    window_s : float
        The window W in seconds.
    """

    rates: list[float]
    pairs: list[tuple[frozenset[int], float]]
    window_s: float
    _memo: dict[tuple[int, int], float] = field(default_factory=dict)

    def results(self, lo: int, hi: int) -> float:
        """Results per second of the range ``lo..hi``."""
        key = (lo, hi)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        r = 1.0
        for c in range(lo, hi + 1):
            r *= self.rates[c]
        for comps, p in self.pairs:
            if min(comps) >= lo and max(comps) <= hi:
                r *= p
        m = hi - lo + 1
        r *= self.window_s ** (m - 1) / factorial(m - 1)
        self._memo[key] = r
        return r

    def join_cost(self, lo: int, k: int, hi: int) -> float:
        """Cost per second of the node joining ``lo..k`` with ``k+1..hi`` (pair checks plus results built)."""
        return self.results(k + 1, hi) * self.results(lo, k) * self.window_s + self.results(lo, hi)

    def cost(self, shape: Shape) -> float:
        """Total cost per second of a tree (leaves: their events)."""
        if isinstance(shape, int):
            return self.rates[shape]
        lo, k = shape_range(shape[0])
        _, hi = shape_range(shape[1])
        return self.cost(shape[0]) + self.cost(shape[1]) + self.join_cost(lo, k, hi)

    def best(self) -> Shape:
        """The cheapest tree: dynamic programming up to :data:`DP_LIMIT` components, greedy beyond."""
        n = len(self.rates)
        if n <= DP_LIMIT:
            return self._dp(n)
        return self._greedy(n)

    def _dp(self, n: int) -> Shape:
        best: dict[tuple[int, int], tuple[float, Shape]] = {(i, i): (self.rates[i], i) for i in range(n)}
        for length in range(2, n + 1):
            for lo in range(0, n - length + 1):
                hi = lo + length - 1
                choice: tuple[float, Shape] | None = None
                for k in range(lo, hi):
                    c = best[(lo, k)][0] + best[(k + 1, hi)][0] + self.join_cost(lo, k, hi)
                    if choice is None or c < choice[0] * (1 - 1e-12):
                        choice = (c, (best[(lo, k)][1], best[(k + 1, hi)][1]))
                assert choice is not None
                best[(lo, hi)] = choice
        return best[(0, n - 1)][1]

    def _greedy(self, n: int) -> Shape:
        parts: list[Shape] = list(range(n))
        while len(parts) > 1:
            costs = []
            for i in range(len(parts) - 1):
                lo, k = shape_range(parts[i])
                _, hi = shape_range(parts[i + 1])
                costs.append(self.join_cost(lo, k, hi))
            i = min(range(len(costs)), key=costs.__getitem__)
            parts[i : i + 2] = [(parts[i], parts[i + 1])]
        # the greedy merge order is a heuristic: never return worse than the linear NFA's shape
        return min((parts[0], left_deep(n)), key=self.cost)


# --------------------------------------------------------------------------- evaluation


@dataclass(slots=True)
class TreeNode:
    """A node of a compiled tree: range ``lo..hi``, children (None for a leaf), conjuncts placed here."""

    lo: int
    hi: int
    left: TreeNode | None
    right: TreeNode | None
    conds: list[Conjunct]
    index: int = 0
    parent: TreeNode | None = None
    is_left: bool = False


def build_tree(shape: Shape, conds: list[tuple[frozenset[int], Conjunct]]) -> list[TreeNode]:
    """Nodes of ``shape`` in post-order (root last), each conjunct at the lowest node covering its components."""
    nodes: list[TreeNode] = []

    def make(s: Shape) -> TreeNode:
        if isinstance(s, int):
            node = TreeNode(s, s, None, None, [])
        else:
            left, right = make(s[0]), make(s[1])
            node = TreeNode(left.lo, right.hi, left, right, [])
            left.parent = right.parent = node
            left.is_left = True
        node.index = len(nodes)
        nodes.append(node)
        return node

    make(shape)
    for comps, c in conds:
        lo, hi = min(comps), max(comps)
        target = min(
            (n for n in nodes if n.lo <= lo and hi <= n.hi), key=lambda n: n.hi - n.lo
        )
        target.conds.append(c)
    return nodes


class TreeState(PlanState):
    """Per-key stored results of every left-child node: ``bufs[node]`` = list of
    ``(last_key, first_ts, env)`` in the order of their last event."""

    __slots__ = ("bufs", "keys")

    def __init__(self, plan: NFAPlan, n_nodes: int) -> None:
        super().__init__(plan)
        self.bufs: list[list[tuple[tuple[int, int], int, tuple[Any, ...]]]] = [[] for _ in range(n_nodes)]
        self.keys: list[list[tuple[int, int]]] = [[] for _ in range(n_nodes)]

    def live(self) -> int:
        return sum(len(b) for b in self.bufs)


class TreeStorage:
    """Evaluates one linear plan with a tree (see the module docstring).

    Parameters
    ----------
    plan : NFAPlan
        Single components only, no negation (checked by :func:`tree_supported`).
    shape : Shape
        The tree.
    conds : list of (components, Conjunct)
        Every positive WHERE conjunct in general form with the components it reads.
    window_us : int | None
    counters : Counters
        ``created``: results built at inner nodes and events buffered at leaves; ``live``: results stored.
    query_name : str | None
    sink : callable
        Receives complete bindings when the plan has RETURN items.
    """

    def __init__(
        self,
        plan: NFAPlan,
        shape: Shape,
        conds: list[tuple[frozenset[int], Conjunct]],
        window_us: int | None,
        counters: Counters,
        query_name: str | None,
        sink: Sink,
    ) -> None:
        self.plan = plan
        self.shape = shape
        self.nodes = build_tree(shape, conds)
        self.n = len(plan.slots)
        self.window_us = window_us
        self.counters = counters
        self.query_name = query_name
        self.sink = sink
        self.direct = not plan.returns and not plan.trailing
        leaves = {node.lo: node for node in self.nodes if node.left is None}
        self.leaves_of_type: dict[str, list[TreeNode]] = {}
        for slot in plan.slots:
            for t in slot.types:
                self.leaves_of_type.setdefault(t, []).append(leaves[slot.index])
        self.empty = (None,) * self.n

    def new_state(self) -> TreeState:
        return TreeState(self.plan, len(self.nodes))

    def expire(self, state: TreeState, lower_ts: int) -> None:
        """Forget stored results whose first event is older than ``lower_ts``."""
        removed = 0
        for i, buf in enumerate(state.bufs):
            if buf and any(r[1] < lower_ts for r in buf):
                keep = [r for r in buf if r[1] >= lower_ts]
                removed += len(buf) - len(keep)
                state.bufs[i] = keep
                state.keys[i] = [r[0] for r in keep]
        if removed:
            self.counters.live -= removed

    def clear(self, state: TreeState) -> None:  # pragma: no cover - trees run under skip_till_any_match only
        for i in range(len(state.bufs)):
            self.counters.live -= len(state.bufs[i])
            state.bufs[i] = []
            state.keys[i] = []

    def process(self, state: TreeState, e: Event, out: list[Match]) -> None:
        """Feed ``e`` to every leaf of its type and carry the new results up (events in (ts, id) order)."""
        leaves = self.leaves_of_type.get(e.type)
        if not leaves:
            return
        lb = e.ts - self.window_us if self.window_us is not None else _FAR_PAST
        key = (e.ts, e.id)
        for leaf in leaves:
            env = self.empty[: leaf.lo] + (e,) + self.empty[leaf.lo + 1 :]
            if leaf.conds and not all(c.holds_all(env) for c in leaf.conds):
                continue
            self._up(state, leaf, [(key, e.ts, env)], lb, out)

    def _up(
        self,
        state: TreeState,
        node: TreeNode,
        results: list[tuple[tuple[int, int], int, tuple[Any, ...]]],
        lb: int,
        out: list[Match],
    ) -> None:
        counters = self.counters
        while True:
            parent = node.parent
            if parent is None:
                for _, _, env in results:
                    self._emit(state, env, out)
                return
            if node.is_left:
                state.bufs[node.index].extend(results)
                state.keys[node.index].extend(r[0] for r in results)
                counters.created += len(results)
                counters.live += len(results)
                if counters.live > counters.peak_live:
                    counters.peak_live = counters.live
                return
            left = parent.left
            assert left is not None
            buf = state.bufs[left.index]
            keys = state.keys[left.index]
            split = parent.right.lo if parent.right is not None else 0
            conds = parent.conds
            joined = []
            for rkey, _rfirst, renv in results:
                first_key = renv[split]
                first_key = (first_key.ts, first_key.id)
                end = bisect_left(keys, first_key)  # left results whose last event precedes the right's first
                for i in range(end):
                    lkey, lfirst, lenv = buf[i]
                    if lfirst < lb:
                        continue
                    env = lenv[:split] + renv[split:]
                    if conds and not all(c.holds_all(env) for c in conds):
                        continue
                    joined.append((rkey, lfirst, env))
            if not joined:
                return
            results = joined
            node = parent

    def _emit(self, state: TreeState, env: tuple[Any, ...], out: list[Match]) -> None:
        if not self.direct:
            self.sink(state, env)
            return
        out.append(Match(self.query_name, None, env[0].ts, env[-1].ts, None, self.plan.layout, env))


def tree_supported(plan: NFAPlan) -> str | None:
    """None when ``plan`` can run as a tree, else why not (one phrase)."""
    if any(s.kleene for s in plan.slots):
        return "a Kleene closure"
    if plan.negations or plan.trailing:
        return "a negation"
    return None


def choose_shape(
    plan: NFAPlan,
    conds: list[tuple[frozenset[int], float]],
    rates: Mapping[str, float],
    window_s: float,
    local: list[float],
) -> Shape:
    """The cheapest tree of ``plan`` under :class:`TreeCostModel` (rates per type per key, ``local`` the leaf
    conjuncts' pass probability per component)."""
    r = [sum(rates.get(t, 1.0) for t in s.types) * local[s.index] for s in plan.slots]
    return TreeCostModel(r, [(c, p) for c, p in conds if len(c) > 1], window_s).best()
