"""Tree plans for skip_till_any_match (ZStream-style; 004's match tree, section 4.2-4.3).

A linear plan ``E_0 E_1 ... E_{n-1}`` (its positive components; middle negations sit between
them) can be evaluated by any binary tree whose leaves are the components in order and whose
inner nodes join two adjacent ranges ``[i..k]`` and ``[k+1..j]`` (004's operator
sequence ``SP``; Mei and Madden, ZStream, SIGMOD 2009). The left-deep tree is the
linear NFA; a bushy or right-deep tree joins rare components first. Trailing negations
(they wait for the window to close) stay with the NFA (:func:`tree_supported`).

Evaluation is incremental over events in the matcher's order, (ts_end, id) (ts for point events;
docs/semantics.md section 8 for intervals). A partial result of a node is a
binding of its range; it is created when its last event arrives. When an event arrives at
a leaf it travels up while it is a right child: at each parent it is joined with the
stored results of the left sibling (``left.last < right.first`` in that order, the
window ``last.ts_end - first.ts <= W``, and the parent's conjuncts), and the new results go
on up. Results of a node that is a left child are stored there (in the order of their
last event), to be joined later: a left child's results are the only state. A right
child's results never need storing: a later left result contains a later event and
cannot precede them. Every match is produced exactly once, when its last event arrives.

Each WHERE conjunct is evaluated at the lowest node whose range holds all its variables
(004's Strategy 2): conjuncts of one variable at its leaf, before buffering.

Kleene closure ``T+ b[]`` (SASE+ under skip_till_any_match: every increasing subsequence of
T events in the window whose conditions hold): the leaf keeps every closure that later events
may extend; an event ``e`` makes ``(e,)`` and extends each stored closure whose first event is
in the window, keeping those whose per-element conjuncts (``b[i]``, ``b[i-1]``) hold for ``e``
(they held for the prefix). Conjuncts of ``b`` alone that read ``b[last]`` or ``b[k]`` hold only
for a complete closure: they filter what the leaf passes on, not what it keeps. Above the leaf
a closure is complete, so every other conjunct sees the final binding, as in the NFA.

Middle negation ``SEQ(A a, !B n, C c)`` (ZStream's NSEQ): the events of B (those passing n's
conjuncts when they read n alone) are recorded per key; the node joining ``a``'s leaf range
with ``c``'s (the lowest node covering both, and every variable n's conjuncts read) drops a
result when a recorded event lies strictly between ``a`` (its last event) and ``c`` (its first)
in (ts_end, id) order and satisfies n's conjuncts. The event itself arrived before ``c``'s, so
it is recorded when the result is built; events older than the window are forgotten.

Plan choice (004, Algorithm 2, with formula (10)'s cost): per key, with ``r_c`` the rate of
component c's events passing their leaf conjuncts and ``p`` the pass probabilities of the
multi-variable conjuncts, a range of m components produces
``R = prod r_c * prod p * W^(m-1) / (m-1)!`` results per second, of which ``R * W`` are
alive; a join node costs ``R(right) * R(left) * W`` pair checks plus ``R(node)`` results
built per second. A Kleene component counts its closures: ``r_c`` times ``g_c = exp(r_c q_c W)``
(``q_c`` the pass probability of its ``b[i-1]`` conjuncts), and its leaf costs a check of
every stored closure per event. A middle negation multiplies the ranges covering the node that
checks it by ``exp(-lambda W / 3)`` (``lambda`` the rate of qualifying negated events, ``W / 3``
the mean gap between two points of a window) and adds the scans of its pairs to that node
(:class:`TreeCostModel`, :func:`cost_model`). Dynamic programming over the split points finds
the cheapest tree for up to :data:`DP_LIMIT` components; beyond, a greedy pass merges the
cheapest adjacent pair first (and the left-deep tree is kept when the greedy one is not cheaper).
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from math import exp, factorial
from typing import Any

from engine.events import Event
from engine.match import Match
from engine.nfa.compiler import Conjunct, NegSpec, NFAPlan
from engine.nfa.counters import Counters
from engine.nfa.state import PlanState

DP_LIMIT = 8
"""Components up to which the plan search is exhaustive (dynamic programming)."""

Shape = Any
"""A tree shape: a component index (leaf) or a pair ``(left shape, right shape)`` over adjacent ranges."""
Sink = Callable[[PlanState, tuple[Any, ...]], None]
_FAR_PAST = -(1 << 62)
_CUT = 64
"""Stored left results that left the window are cut from their list once there are more than this many."""


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
    """004's cost model for tree plans of one linear plan (section 4, formulas (5)-(10), as in the module
    docstring), extended to Kleene leaves and negations.

    Attributes
    ----------
    rates : list[float]
        Per component, events per second per key passing its leaf conjuncts.
    pairs : list[tuple[frozenset[int], float]]
        Multi-component conjuncts: (components they read, pass probability).
    window_s : float
        The window W in seconds.
    growth : dict[int, float]
        Per Kleene component, the mean number of closures ending at one of its events: with Poisson
        arrivals at ``r`` per second and a per-element (``b[i-1]``) pass probability ``q``, each earlier event
        in the window joins a closure or not, ``E[(1 + q)^N] = exp(r * q * W)`` for ``N ~ Poisson(r W)``.
    negations : list[tuple[frozenset[int], float, float]]
        Middle negations: (the components of the node that checks them: both neighbours and those their
        conjuncts read, pass probability, events scanned per result checked). A pair passes when no
        qualifying event (rate ``lambda``) falls in the gap between the neighbours, mean ``W / 3`` for two
        points in a window: ``exp(-lambda * W / 3)`` (ZStream's NSEQ selectivity).
    """

    rates: list[float]
    pairs: list[tuple[frozenset[int], float]]
    window_s: float
    growth: dict[int, float] = field(default_factory=dict)
    negations: list[tuple[frozenset[int], float, float]] = field(default_factory=list)
    _memo: dict[tuple[int, int], float] = field(default_factory=dict)

    def results(self, lo: int, hi: int) -> float:
        """Results per second of the range ``lo..hi`` (a Kleene component counts its closures)."""
        key = (lo, hi)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        r = 1.0
        for c in range(lo, hi + 1):
            r *= self.rates[c] * self.growth.get(c, 1.0)
        for comps, p in self.pairs:
            if min(comps) >= lo and max(comps) <= hi:
                r *= p
        for comps, p, _ in self.negations:
            if min(comps) >= lo and max(comps) <= hi:
                r *= p
        m = hi - lo + 1
        r *= self.window_s ** (m - 1) / factorial(m - 1)
        self._memo[key] = r
        return r

    def leaf_cost(self, c: int) -> float:
        """Cost per second of a leaf: its events; a Kleene leaf also checks every stored closure in the
        window (``R * W`` of them) per event and builds ``R`` closures."""
        if c not in self.growth:
            return self.rates[c]
        built = self.results(c, c)
        return self.rates[c] * (1.0 + built * self.window_s) + built

    def join_cost(self, lo: int, k: int, hi: int) -> float:
        """Cost per second of the node joining ``lo..k`` with ``k+1..hi``: pair checks, the negation scans of
        the pairs reaching the negations placed here, and the results built."""
        cost = self.results(k + 1, hi) * self.results(lo, k) * self.window_s + self.results(lo, hi)
        for comps, p, scan in self.negations:
            a, b = min(comps), max(comps)
            if lo <= a <= k < b <= hi:
                cost += self.results(lo, hi) / p * scan
        return cost

    def cost(self, shape: Shape) -> float:
        """Total cost per second of a tree."""
        if isinstance(shape, int):
            return self.leaf_cost(shape)
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
        best: dict[tuple[int, int], tuple[float, Shape]] = {(i, i): (self.leaf_cost(i), i) for i in range(n)}
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
    """A node of a compiled tree: range ``lo..hi``, children (None for a leaf), conjuncts placed here.

    ``negs``: the middle negations checked here (NSEQ: the lowest node joining the components on both
    sides of the negation and every variable its conjuncts read). A Kleene leaf (``kleene``) keeps its
    conjuncts in two lists: ``conds`` hold for every prefix of a valid closure (``b[i]``, ``b[i-1]``,
    ``b[1]``), ``closing`` only for the complete one (``b[last]``, ``b[k]``).
    """

    lo: int
    hi: int
    left: TreeNode | None
    right: TreeNode | None
    conds: list[Conjunct]
    index: int = 0
    parent: TreeNode | None = None
    is_left: bool = False
    negs: list[NegSpec] = field(default_factory=list)
    kleene: bool = False
    closing: list[Conjunct] = field(default_factory=list)
    take: list[Conjunct] = field(default_factory=list)
    """For a Kleene leaf: the ``conds`` that read ``b[i]`` (re-checked on every new element)."""


def _lowest(nodes: list[TreeNode], lo: int, hi: int) -> TreeNode:
    return min((n for n in nodes if n.lo <= lo and hi <= n.hi), key=lambda n: n.hi - n.lo)


def build_tree(
    shape: Shape,
    conds: list[tuple[frozenset[int], Conjunct]],
    plan: NFAPlan | None = None,
) -> list[TreeNode]:
    """Nodes of ``shape`` in post-order (root last), each conjunct at the lowest node covering its components,
    each middle negation of ``plan`` at the lowest node covering its neighbours and the slots it reads."""
    nodes: list[TreeNode] = []

    def make(s: Shape) -> TreeNode:
        if isinstance(s, int):
            node = TreeNode(s, s, None, None, [])
            node.kleene = plan is not None and plan.slots[s].kleene
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
        target = _lowest(nodes, min(comps), max(comps))
        if target.kleene and c.closing:
            target.closing.append(c)
        else:
            target.conds.append(c)
            if target.kleene and c.ivar is not None:
                target.take.append(c)
    for spec in plan.negations if plan is not None else []:
        span = spec.reads | {spec.after, spec.after + 1}
        _lowest(nodes, min(span), max(span)).negs.append(spec)
    return nodes


Result = tuple[tuple[int, int], int, tuple[Any, ...]]
"""A partial result: ((ts_end, id) of its last event, ts of its first event, binding of all n slots)."""


class TreeState(PlanState):
    """Per-key stored results of every left-child node: ``bufs[node]`` = list of
    ``(last_key, first_ts, env)`` in the order of their last event; ``seqs[leaf]``: every closure of a Kleene
    leaf that later events may extend (the same tuples); ``neg_buf[k]`` (of :class:`PlanState`): the events
    of middle negation k's types (for a negation of the negated variable alone, those passing it)."""

    __slots__ = ("bufs", "keys", "seqs")

    def init_args(self) -> tuple[Any, ...]:
        """The constructor's arguments (pickling)."""
        return (self.plan, len(self.bufs))

    def __init__(self, plan: NFAPlan, n_nodes: int) -> None:
        super().__init__(plan)
        self.bufs: list[list[Result]] = [[] for _ in range(n_nodes)]
        self.keys: list[list[tuple[int, int]]] = [[] for _ in range(n_nodes)]
        self.seqs: list[list[Result]] = [[] for _ in range(n_nodes)]

    def live(self) -> int:
        return sum(len(b) for b in self.bufs) + sum(len(s) for s in self.seqs)


class TreeStorage:
    """Evaluates one linear plan with a tree (see the module docstring).

    Parameters
    ----------
    plan : NFAPlan
        Middle negations only (checked by :func:`tree_supported`).
    shape : Shape
        The tree over the plan's positive components.
    conds : list of (components, Conjunct)
        Every positive WHERE conjunct in general form with the components it reads.
    window_us : int | None
    counters : Counters
        ``created``: results built at inner nodes, events buffered at leaves and closures built at Kleene
        leaves; ``live``: results and closures stored.
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
        self.nodes = build_tree(shape, conds, plan)
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
        self.negs_of_type: dict[str, list[NegSpec]] = {}
        for spec in plan.negations:
            for t in spec.types:
                self.negs_of_type.setdefault(t, []).append(spec)
        self.kleene = [s.kleene for s in plan.slots]
        self.empty = (None,) * self.n

    def new_state(self) -> TreeState:
        return TreeState(self.plan, len(self.nodes))

    def expire(self, state: TreeState, lower_ts: int) -> None:
        """Forget stored results and closures whose first event is older than ``lower_ts``, and negation
        events before it (a live result's events are all later)."""
        removed = 0
        for i, buf in enumerate(state.bufs):
            if buf and any(r[1] < lower_ts for r in buf):
                keep = [r for r in buf if r[1] >= lower_ts]
                removed += len(buf) - len(keep)
                state.bufs[i] = keep
                state.keys[i] = [r[0] for r in keep]
        for i, seqs in enumerate(state.seqs):
            if seqs and any(r[1] < lower_ts for r in seqs):
                keep = [r for r in seqs if r[1] >= lower_ts]
                removed += len(seqs) - len(keep)
                state.seqs[i] = keep
        if removed:
            self.counters.live -= removed
        state.trim(lower_ts)

    def clear(self, state: TreeState) -> None:  # pragma: no cover - trees run under skip_till_any_match only
        for i in range(len(state.bufs)):
            self.counters.live -= len(state.bufs[i]) + len(state.seqs[i])
            state.bufs[i] = []
            state.keys[i] = []
            state.seqs[i] = []

    def process(self, state: TreeState, e: Event, out: list[Match]) -> None:
        """Feed ``e`` to every leaf of its type and carry the new results up (events in (ts_end, id) order),
        then record it for the negations of its type."""
        leaves = self.leaves_of_type.get(e.type)
        if leaves:
            lb = e.ts_end - self.window_us if self.window_us is not None else _FAR_PAST
            key = (e.ts_end, e.id)
            for leaf in leaves:
                if leaf.kleene:
                    results = self._closures(state, leaf, e, lb)
                else:
                    env = self.empty[: leaf.lo] + (e,) + self.empty[leaf.lo + 1 :]
                    if leaf.conds and not all(c.holds_all(env) for c in leaf.conds):
                        continue
                    results = [(key, e.ts, env)]
                if results:
                    self._up(state, leaf, results, lb, out)
        for spec in self.negs_of_type.get(e.type, ()):
            if spec.local_fns is None or spec.qualifies_local(e):
                state.neg_buf[spec.k].append(e)

    def _closures(self, state: TreeState, leaf: TreeNode, e: Event, lb: int) -> list[Result]:
        """The closures of Kleene ``leaf`` that end with ``e``: ``(e,)`` and every stored closure in the window
        extended by ``e`` (SASE+ *take* under skip_till_any_match: every increasing subsequence), those passing
        ``conds``; all of them are stored for extension, those passing ``closing`` are returned."""
        s = leaf.lo
        key = (e.ts_end, e.id)
        new: list[Result] = []
        env = self.empty[:s] + ((e,),) + self.empty[s + 1 :]
        if all(c.holds_all(env) for c in leaf.conds):
            new.append((key, e.ts, env))
        take = leaf.take
        alive = []  # the stored closures still in the window: the others can never be extended again
        for r in state.seqs[leaf.index]:
            first, old = r[1], r[2]
            if first < lb:
                continue
            alive.append(r)
            env = old[:s] + (old[s] + (e,),) + old[s + 1 :]
            if all(c.holds_last(env) for c in take):
                new.append((key, first, env))
        self.counters.live -= len(state.seqs[leaf.index]) - len(alive)
        state.seqs[leaf.index] = alive
        if not new:
            return new
        alive.extend(new)
        self.counters.created += len(new)
        self._count_live(len(new))
        if leaf.closing:
            return [r for r in new if all(c.holds_all(r[2]) for c in leaf.closing)]
        return new

    def _count_live(self, n: int) -> None:
        counters = self.counters
        counters.live += n
        if counters.live > counters.peak_live:
            counters.peak_live = counters.live

    def _up(self, state: TreeState, node: TreeNode, results: list[Result], lb: int, out: list[Match]) -> None:
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
                self._count_live(len(results))
                return
            left = parent.left
            assert left is not None
            buf = state.bufs[left.index]
            keys = state.keys[left.index]
            split = node.lo
            split_kleene = self.kleene[split]
            conds = parent.conds
            negs = parent.negs
            # left results whose last event left the window cannot join again: cut them (amortized)
            start = bisect_left(keys, (lb, _FAR_PAST))
            if start > _CUT:
                del buf[:start]
                del keys[:start]
                counters.live -= start
                start = 0
            joined = []
            for rkey, _rfirst, renv in results:
                first = renv[split][0] if split_kleene else renv[split]
                end = bisect_left(keys, (first.ts_end, first.id))  # left results whose last event precedes it
                for i in range(start, end):
                    lkey, lfirst, lenv = buf[i]
                    if lfirst < lb:
                        continue
                    env = lenv[:split] + renv[split:]
                    if conds and not all(c.holds_all(env) for c in conds):
                        continue
                    if negs and not all(state.general_negation_ok(spec, env) for spec in negs):
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
        first = env[0][0] if self.kleene[0] else env[0]
        last = env[-1][-1] if self.kleene[-1] else env[-1]
        out.append(Match(self.query_name, None, first.ts, last.ts_end, None, self.plan.layout, env))


def tree_supported(plan: NFAPlan) -> str | None:
    """None when ``plan`` can run as a tree, else why not (one phrase): trailing negations (they wait for the
    window to close after the match) and negation conditions on a Kleene variable after the negation other
    than through ``[1]`` (the NFA evaluates them when that variable has one element) stay with the NFA."""
    if plan.trailing:
        return "a trailing negation"
    if any(spec.reads_open_kleene for spec in plan.negations):
        return "a negation condition on a later Kleene variable (other than its [1])"
    return None


def cost_model(
    plan: NFAPlan,
    conds: list[tuple[frozenset[int], Conjunct, float]],
    rates: Mapping[str, float],
    window_s: float,
    negations: list[tuple[float, float]],
) -> TreeCostModel:
    """The :class:`TreeCostModel` of ``plan``.

    Parameters
    ----------
    conds : list of (components, Conjunct, prior pass probability)
        The positive conjuncts (:meth:`engine.nfa.compiler.PlanCompiler.tree_conjuncts`).
    rates : mapping
        Events per second per key of each type (1.0 when absent).
    window_s : float
        The window in seconds.
    negations : list of (local, cross) pass probabilities
        Per middle negation (:meth:`engine.nfa.compiler.PlanCompiler.negation_estimates`): of its conjuncts
        on the negated event alone, and of the others.
    """
    local = [1.0] * len(plan.slots)
    take = [1.0] * len(plan.slots)
    for comps, c, p in conds:
        if len(comps) == 1:
            s = next(iter(comps))
            if c.uses_prev:
                take[s] *= p  # b[i-1]: a pass probability per further element, not per event
            elif not c.closing:
                local[s] *= p
    r = [sum(rates.get(t, 1.0) for t in s.types) * local[s.index] for s in plan.slots]
    growth = {s.index: exp(min(r[s.index] * take[s.index] * window_s, 50.0)) for s in plan.slots if s.kleene}
    negs = []
    for spec, (p_local, p_cross) in zip(plan.negations, negations):
        raw = sum(rates.get(t, 1.0) for t in spec.types)
        gap = window_s / 3
        span = spec.reads | {spec.after, spec.after + 1}
        scan = 1.0 if spec.local_fns is not None else raw * gap
        negs.append((frozenset(span), exp(-raw * p_local * p_cross * gap), scan))
    pairs = [(comps, p) for comps, _, p in conds if len(comps) > 1]
    return TreeCostModel(r, pairs, window_s, growth, negs)
