"""Brute-force reference enumerator of LQL matches (the test oracle).

Written straight from ``docs/semantics.md`` and independently of the engine: it
reads only the syntax tree (:mod:`engine.lql.ast`) and :class:`engine.events.Event`.
It is meant to be obviously right, not fast: for every linear plan (section 2)
and every partition sub-stream (section 1) it enumerates every assignment of
events to the plan's positive components and keeps those that satisfy section 3;
``skip_till_next_match`` is a direct simulation of the runs of section 4.

Streams of up to a few dozen events (and per-key streams of the peer benchmark,
thanks to window pruning) are fast enough.

Choices where docs/semantics.md is silent (see also the module's tests):

- WHERE conjuncts are the operands of the top-level AND, with nested ANDs
  flattened (``(p AND q) AND r`` is three conjuncts, as the flattened
  :class:`~engine.lql.ast.BoolOp` of the syntax tree suggests).
- A top-level ``[attr]`` keeps the bound events and the events considered for
  a negation to one value of attr (None included). The partition sub-stream of
  section 1 stays the one of PARTITION BY alone: that is where
  ``partition_contiguity`` looks for gaps. (Runs of ``skip_till_next_match`` are
  kept per PARTITION BY and attr value; that gives the same matches as runs per
  PARTITION BY sub-stream that skip events failing ``[attr]``.) ``[attr]``
  nested inside OR/NOT only compares the bound events.
- A conjunct that mentions two negated variables is ignored.
- ``skip_till_next_match``: a conjunct that reads ``b[last]`` or ``b[k]`` (k >= 2)
  of a Kleene variable b becomes evaluable only when b is complete (the run
  proceeded past it); for a Kleene c_m (the last positive component) such
  conjuncts are checked when the run emits (a failing emission is dropped, the
  run stays alive). A negation's conjunct must be evaluable when the run
  proceeds over the negation; otherwise the oracle raises ``NotImplementedError``.
- Arithmetic on a missing value, a string, or division by zero gives a missing
  value, so the comparison that reads it is false (and ``NOT`` of it true).

Interval events (issue 15, docs/semantics.md section 8): the stream order is
``(ts_end, id)`` (``Event.order_key``); WITHIN bounds the hull ``max ts_end - min ts``
of the bound events. A relation between two events is a :class:`Rel` conjunct,
evaluated on the endpoints with :func:`engine.lql.relations.relation_holds` (a
function of four numbers, checked against Allen's table in tests/engine/test_allen.py),
not through the parser's rewriting into comparisons. ``SEQ(...) BY rel`` adds, per
linear plan, a Rel for every two consecutive positive components of the SEQ
(``x``/``b[last]`` then ``y``/``c[1]``) and ``b[i-1] rel b[i]`` inside each Kleene one.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from engine.events import Event
from engine.lql import ast as A
from engine.lql.relations import relation_holds


@dataclass(frozen=True)
class Rel:
    """``left REL right`` between two events (a WHERE conjunct of the oracle's own syntax)."""

    left: A.AttrRef
    right: A.AttrRef
    rel: A.Relation


MatchKey = frozenset  # frozenset[tuple[str, tuple[int, ...]]], the same as Match.key()
Binding = dict  # variable -> Event (single, negated) or tuple[Event, ...] (Kleene)


# =========================================================================== section 2: linear plans


def expand(node: A.PatternNode) -> list[tuple[A.Component, ...]]:
    """All linear plans (tuples of components) of a pattern tree, before dropping any."""
    if isinstance(node, A.Component):
        if node.kind == "star":
            return [(), (A.Component("plus", node.types, node.var, node.pos),)]
        return [(node,)]
    if isinstance(node, A.Seq):
        plans: list[tuple[A.Component, ...]] = [()]
        for item in node.items:
            plans = [p + q for p in plans for q in expand(item)]
        return plans
    if isinstance(node, A.Or):
        return [p for item in node.items for p in expand(item)]
    if isinstance(node, A.And):
        plans = []
        for choice in itertools.product(*(expand(item) for item in node.items)):
            plans.extend(interleavings(list(choice)))
        return plans
    raise TypeError(f"not a pattern node: {node!r}")


def interleavings(seqs: list[tuple]) -> list[tuple]:
    """Every merge of the sequences that keeps each sequence's own order."""
    seqs = [s for s in seqs if s]
    if not seqs:
        return [()]
    out: list[tuple] = []
    for k, s in enumerate(seqs):
        rest = seqs[:k] + [s[1:]] + seqs[k + 1 :]
        out.extend((s[0],) + tail for tail in interleavings(rest))
    return out


# =========================================================================== WHERE: conjuncts


@dataclass(frozen=True)
class Conjunct:
    """One top-level AND-operand of WHERE, with what the rules need to know about it.

    vars: every variable it mentions; iter_var: the Kleene variable indexed by
    ``i`` / ``i-1`` (None if none); first_i: 1, or 2 when ``b[i-1]`` appears;
    closed_vars: Kleene variables read through ``b[last]`` or ``b[k]``, k >= 2.
    """

    expr: A.Expr
    vars: frozenset
    iter_var: str | None
    first_i: int
    closed_vars: frozenset


def walk(expr: A.Expr) -> Iterator[A.Expr]:
    """The expression and all its sub-expressions."""
    yield expr
    if isinstance(expr, (A.BinOp, A.Compare)):
        yield from walk(expr.left)
        yield from walk(expr.right)
    elif isinstance(expr, (A.Neg, A.Not)):
        yield from walk(expr.operand)
    elif isinstance(expr, A.BoolOp):
        for operand in expr.operands:
            yield from walk(operand)
    elif isinstance(expr, Rel):
        yield expr.left
        yield expr.right


def analyse(expr: A.Expr) -> Conjunct:
    refs = [x for x in walk(expr) if isinstance(x, (A.AttrRef, A.Aggregate))]
    iter_vars = {r.var for r in refs if isinstance(r, A.AttrRef) and r.index and r.index.kind in ("i", "prev")}
    if len(iter_vars) > 1:
        raise ValueError(f"two Kleene variables indexed by i in one conjunct: {sorted(iter_vars)}")
    uses_prev = any(isinstance(r, A.AttrRef) and r.index and r.index.kind == "prev" for r in refs)
    closed = {r.var for r in refs if isinstance(r, A.AttrRef) and r.index and r.index.kind in ("last", "at")}
    return Conjunct(
        expr=expr,
        vars=frozenset(r.var for r in refs),
        iter_var=next(iter(iter_vars), None),
        first_i=2 if uses_prev else 1,
        closed_vars=frozenset(closed),
    )


def split_and(expr: A.Expr | None) -> list[A.Expr]:
    """Top-level AND-operands, nested ANDs flattened."""
    if expr is None:
        return []
    if isinstance(expr, A.BoolOp) and expr.op == "and":
        return [c for operand in expr.operands for c in split_and(operand)]
    return [expr]


# =========================================================================== WHERE: evaluation


class _OutOfRange(Exception):
    """``b[k]`` with k > len(b): the whole conjunct is false."""


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, str)


def _event_of(ref: A.AttrRef, binding: Binding, i: int | None) -> Event:
    bound = binding[ref.var]
    if isinstance(bound, Event):
        if ref.index is not None:
            raise ValueError(f"single variable {ref.var} used with an index")
        return bound
    if ref.index is None:
        raise ValueError(f"Kleene variable {ref.var} used without an index in WHERE")
    kind = ref.index.kind
    k: int | None
    if kind == "first":
        k = 1
    elif kind == "last":
        k = len(bound)
    elif kind == "at":
        k = ref.index.at
    elif kind == "i":
        k = i
    else:  # prev
        k = None if i is None else i - 1
    if k is None or not 1 <= k <= len(bound):
        raise _OutOfRange
    return bound[k - 1]


def value(expr: A.Expr, binding: Binding, i: int | None) -> Any:
    """Value of an expression; None stands for a missing value (or a division by zero)."""
    if isinstance(expr, A.Literal):
        return expr.value
    if isinstance(expr, A.AttrRef):
        return _event_of(expr, binding, i).get(expr.attr)
    if isinstance(expr, A.BinOp):
        left, right = value(expr.left, binding, i), value(expr.right, binding, i)
        if not (_is_number(left) and _is_number(right)):
            return None
        if expr.op == "+":
            return left + right
        if expr.op == "-":
            return left - right
        if expr.op == "*":
            return left * right
        return None if right == 0 else left / right
    if isinstance(expr, A.Neg):
        v = value(expr.operand, binding, i)
        return -v if _is_number(v) else None
    if isinstance(expr, (A.Compare, A.BoolOp, A.Not, A.Equivalence)):
        return truth(expr, binding, i)
    raise ValueError(f"not allowed in WHERE: {expr!r}")


def truth(expr: A.Expr, binding: Binding, i: int | None) -> bool:
    """Truth of an expression at Kleene position i (None when no ``b[i]`` is involved)."""
    if isinstance(expr, A.Compare):
        left, right = value(expr.left, binding, i), value(expr.right, binding, i)
        if left is None or right is None:
            return False
        if isinstance(left, str) != isinstance(right, str):
            return expr.op == "!="
        try:
            if expr.op == "=":
                return left == right
            if expr.op == "!=":
                return left != right
            if expr.op == "<":
                return left < right
            if expr.op == "<=":
                return left <= right
            if expr.op == ">":
                return left > right
            return left >= right
        except TypeError:
            return False
    if isinstance(expr, A.BoolOp):
        results = (truth(x, binding, i) for x in expr.operands)
        return all(results) if expr.op == "and" else any(results)
    if isinstance(expr, A.Not):
        return not truth(expr.operand, binding, i)
    if isinstance(expr, A.Equivalence):
        events = [e for bound in binding.values() for e in ([bound] if isinstance(bound, Event) else bound)]
        return len({e.get(expr.attr) for e in events}) <= 1
    if isinstance(expr, Rel):
        a, b = _event_of(expr.left, binding, i), _event_of(expr.right, binding, i)
        return relation_holds(expr.rel, (a.ts, a.ts_end), (b.ts, b.ts_end))
    v = value(expr, binding, i)
    return v is not None and bool(v)


def holds(c: Conjunct, binding: Binding) -> bool:
    """Rule 3: the conjunct holds (for every position i of its iterated Kleene variable)."""
    try:
        if c.iter_var is None:
            return truth(c.expr, binding, None)
        n = len(binding[c.iter_var])
        return all(truth(c.expr, binding, i) for i in range(c.first_i, n + 1))
    except _OutOfRange:
        return False


# =========================================================================== plans with their conjuncts


@dataclass
class Plan:
    """One linear plan: positive components, negations by position, and the conjuncts that apply.

    middle[j]: the negations between positives[j-1] and positives[j];
    conjuncts: rule 3; neg_conjuncts[n]: rule 5, for negated variable n.
    """

    positives: list
    middle: dict
    trailing: list
    conjuncts: list
    neg_conjuncts: dict


def make_plans(query: A.PatternQuery, conjuncts: list[Conjunct]) -> list[Plan]:
    seen: dict = {}
    for comps in expand(query.pattern):
        seen.setdefault(comps, None)
    plans = []
    scopes = _by_scopes(query.pattern)
    for comps in seen:
        if not comps or comps[0].kind == "neg":
            continue  # section 2: a plan that starts with a negation is dropped
        by = [analyse(r) for r in _by_rels(comps, scopes)]
        positives: list = []
        middle: dict = {}
        trailing: list = []
        for comp in comps:
            if comp.kind == "neg":
                middle.setdefault(len(positives), []).append(comp)
            else:
                positives.append(comp)
        trailing = middle.pop(len(positives), [])
        if trailing and query.within_us is None:
            raise ValueError("a trailing negation needs WITHIN")
        pos_vars = {c.var for c in positives}
        neg_vars = {c.var for c in comps if c.kind == "neg"}
        rule3: list[Conjunct] = []
        rule5: dict[str, list[Conjunct]] = {v: [] for v in neg_vars}
        for c in conjuncts + by:
            if not c.vars <= pos_vars | neg_vars:
                continue  # mentions a variable this plan does not bind
            negs = c.vars & neg_vars
            if not negs:
                rule3.append(c)
            elif len(negs) == 1:
                rule5[next(iter(negs))].append(c)
            # a conjunct over two negated variables: ignored
        plans.append(Plan(positives, middle, trailing, rule3, rule5))
    return plans


def _by_scopes(node: A.PatternNode) -> list[tuple[set, A.Relation]]:
    if isinstance(node, A.Component):
        return []
    out = []
    if isinstance(node, A.Seq) and node.by is not None:
        out.append(({c.var for c in A.components(node)}, node.by))
    for item in node.items:
        out.extend(_by_scopes(item))
    return out


def _by_rels(comps: tuple, scopes: list) -> list[Rel]:
    """SEQ(...) BY rel on one linear plan: consecutive positives of the scope, and inside Kleene components."""
    out = []
    for scope, rel in scopes:
        pos = [c for c in comps if c.kind != "neg" and c.var in scope]
        for x, y in zip(pos, pos[1:]):
            left = A.AttrRef(x.var, "ts", A.Index("last") if x.is_kleene else None)
            right = A.AttrRef(y.var, "ts", A.Index("first") if y.is_kleene else None)
            out.append(Rel(left, right, rel))
        for c in pos:
            if c.is_kleene:
                out.append(Rel(A.AttrRef(c.var, "ts", A.Index("prev")), A.AttrRef(c.var, "ts", A.Index("i")), rel))
    return out


def _hull_ok(groups: list, window: int | None) -> bool:
    """WITHIN bounds the hull of the bound events: max ts_end - min ts <= window."""
    if window is None:
        return True
    bound = [e for g in groups for e in g]
    return max(e.ts_end for e in bound) - min(e.ts for e in bound) <= window


# =========================================================================== enumeration


def enumerate_matches(query: A.PatternQuery, events: list[Event], strategy: str | None = None) -> set:
    """Every match identity (as :meth:`engine.match.Match.key`) of ``query`` over the finite stream ``events``.

    The stream is taken as complete (watermark = +infinity at the end): trailing
    negations see every event up to first.ts + w. ``strategy`` overrides the
    query's STRATEGY.
    """
    if not isinstance(query, A.PatternQuery):
        raise TypeError("the oracle handles PatternQuery only")
    strategy = strategy or query.strategy
    if strategy not in A.STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}")

    conjuncts = []
    equivalence_attrs: list[str] = []
    for expr in split_and(query.where):
        if isinstance(expr, A.Equivalence):
            equivalence_attrs.append(expr.attr)
        else:
            conjuncts.append(analyse(expr))
    plans = make_plans(query, conjuncts)

    # section 1: the query stream and its sub-streams
    types = {t for comp in A.components(query.pattern) for t in comp.types}
    qstream = sorted((e for e in events if e.type in types), key=Event.order_key)
    qpos = {e.id: k for k, e in enumerate(qstream)}
    partition_pos: dict = {}  # event id -> position in its PARTITION BY sub-stream
    partitions: dict = {}
    for e in qstream:
        part = partitions.setdefault(tuple(e.get(a) for a in query.partition_by), [])
        partition_pos[e.id] = len(part)
        part.append(e)
    # the same, split further by the [attr] values: bound events and negated events share them
    subs: dict = {}
    for e in qstream:
        key = tuple(e.get(a) for a in query.partition_by) + tuple(e.get(a) for a in equivalence_attrs)
        subs.setdefault(key, []).append(e)

    found: set = set()
    for plan in plans:
        for sub in subs.values():
            if strategy == "skip_till_next_match":
                found |= _next_match(plan, sub, query.within_us)
                continue
            for groups in _assignments(plan.positives, sub, query.within_us):
                if not _hull_ok(groups, query.within_us):
                    continue
                binding = _binding(plan.positives, groups)
                if not all(holds(c, binding) for c in plan.conjuncts):
                    continue
                if not _negations_hold(plan, groups, binding, sub, query.within_us):
                    continue
                bound = [e for g in groups for e in g]
                if strategy == "strict_contiguity" and not _consecutive(bound, qpos):
                    continue
                if strategy == "partition_contiguity" and not _consecutive(bound, partition_pos):
                    continue
                found.add(_key(plan.positives, groups))
    return found


def _binding(positives: list, groups: list) -> Binding:
    return {c.var: (g[0] if c.kind == "single" else tuple(g)) for c, g in zip(positives, groups)}


def _key(positives: list, groups: list) -> MatchKey:
    return frozenset((c.var, tuple(e.id for e in g)) for c, g in zip(positives, groups))


def _consecutive(bound: list[Event], position: dict) -> bool:
    places = sorted(position[e.id] for e in bound)
    return places[-1] - places[0] + 1 == len(places)


def _assignments(positives: list, sub: list[Event], window: int | None) -> Iterator[list]:
    """Every assignment of section 3 (ordering and window only), as a list of event lists per component.

    Events of c_j all come before events of c_{j+1}; a Kleene component takes a
    non-empty increasing subsequence.
    """

    def later(start: int, first_ts: int | None) -> Iterator[tuple[int, Event]]:
        for k in range(start, len(sub)):
            e = sub[k]
            if window is not None and first_ts is not None and e.ts_end - first_ts > window:
                return  # the stream is in ts_end order: every later event is out of the window too
            yield k, e

    def component(j: int, start: int, first_ts: int | None, acc: list) -> Iterator[list]:
        if j == len(positives):
            yield acc
            return
        comp = positives[j]
        for k, e in later(start, first_ts):
            if e.type not in comp.types:
                continue
            ts0 = e.ts if first_ts is None else first_ts
            if comp.kind == "single":
                yield from component(j + 1, k + 1, ts0, acc + [[e]])
            else:
                yield from kleene(j, [e], k, ts0, acc)

    def kleene(j: int, elems: list, last_k: int, first_ts: int, acc: list) -> Iterator[list]:
        yield from component(j + 1, last_k + 1, first_ts, acc + [elems])
        for k, e in later(last_k + 1, first_ts):
            if e.type in positives[j].types:
                yield from kleene(j, elems + [e], k, first_ts, acc)

    yield from component(0, 0, None, [])


def _negated_event_exists(
    neg: A.Component, conjs: list, binding: Binding, sub: list[Event], after: Event, before
) -> bool:
    """Rule 5: an event of neg's types in ``sub``, after ``after`` and accepted by ``before``, satisfying conjs."""
    for e in sub:
        if e.order_key() <= after.order_key() or e.type not in neg.types or not before(e):
            continue
        if all(holds(c, {**binding, neg.var: e}) for c in conjs):
            return True
    return False


def _middle_negations_hold(plan: Plan, j: int, left: Event, right: Event, binding: Binding, sub: list[Event]) -> bool:
    """The negations between positives[j-1] (ending at left) and positives[j] (starting at right)."""
    for neg in plan.middle.get(j, []):
        if _negated_event_exists(
            neg, plan.neg_conjuncts[neg.var], binding, sub, left, lambda e: e.order_key() < right.order_key()
        ):
            return False
    return True


def _trailing_negations_hold(plan: Plan, groups: list, binding: Binding, sub: list[Event], window: int | None) -> bool:
    if not plan.trailing:
        return True
    deadline = groups[0][0].ts + window
    for neg in plan.trailing:
        if _negated_event_exists(
            neg, plan.neg_conjuncts[neg.var], binding, sub, groups[-1][-1], lambda e: e.ts_end <= deadline
        ):
            return False
    return True


def _negations_hold(plan: Plan, groups: list, binding: Binding, sub: list[Event], window: int | None) -> bool:
    for j in plan.middle:
        if not _middle_negations_hold(plan, j, groups[j - 1][-1], groups[j][0], binding, sub):
            return False
    return _trailing_negations_hold(plan, groups, binding, sub, window)


# =========================================================================== skip_till_next_match (section 4)


def _ready(plan: Plan, groups: list) -> list[Conjunct]:
    """The conjuncts a run with c_1..c_j bound (``groups``) can evaluate.

    All their variables are bound, and none is read through b[last] / b[k] while
    b is the run's open Kleene component.
    """
    bound = {c.var for c in plan.positives[: len(groups)]}
    current = plan.positives[len(groups) - 1]
    open_var = current.var if current.is_kleene else None
    return [c for c in plan.conjuncts if c.vars <= bound and open_var not in c.closed_vars]


def _ready_hold(plan: Plan, groups: list) -> bool:
    binding = _binding(plan.positives, groups)
    return all(holds(c, binding) for c in _ready(plan, groups))


def _check_negation_evaluable(plan: Plan, j: int, groups: list) -> None:
    bound = {c.var for c in plan.positives[: len(groups)]}
    current = plan.positives[len(groups) - 1]
    open_var = current.var if current.is_kleene else None
    for neg in plan.middle.get(j, []):
        for c in plan.neg_conjuncts[neg.var]:
            if not c.vars <= bound | {neg.var} or open_var in c.closed_vars:
                raise NotImplementedError(
                    "skip_till_next_match: a negation conjunct that reads a variable bound after the "
                    "negation's right neighbour is not defined by docs/semantics.md"
                )


def _next_match(plan: Plan, sub: list[Event], window: int | None) -> set:
    """Section 4, skip_till_next_match, for one plan over one sub-stream: a plain simulation of the runs.

    A run is the list of event lists of c_1..c_j; its last list may be an open
    Kleene component.
    """
    m = len(plan.positives)
    found: set = set()

    def emit_or_keep(groups: list, alive: list) -> None:
        """After a run bound or took an element: emit if it completed c_m, keep it if it may continue."""
        if len(groups) == m:
            binding = _binding(plan.positives, groups)
            if (
                all(holds(c, binding) for c in plan.conjuncts)
                and _hull_ok(groups, window)
                and _trailing_negations_hold(plan, groups, binding, sub, window)
            ):
                found.add(_key(plan.positives, groups))
            if not plan.positives[-1].is_kleene:
                return  # a single c_m: the run ends
        alive.append(groups)

    runs: list = []
    for e in sub:
        alive: list = []
        for groups in runs:
            if window is not None and e.ts_end - groups[0][0].ts > window:
                continue  # the run dies
            j = len(groups)  # c_1..c_j bound; plan.positives[j] is c_{j+1}
            took = proceeded = None
            proceed_killed = False
            current = plan.positives[j - 1]
            if current.is_kleene and e.type in current.types:
                candidate = groups[:-1] + [groups[-1] + [e]]
                if _ready_hold(plan, candidate):
                    took = candidate
            if j < m and e.type in plan.positives[j].types:
                candidate = groups + [[e]]
                if _ready_hold(plan, candidate):
                    _check_negation_evaluable(plan, j, candidate)
                    binding = _binding(plan.positives, candidate)
                    if _middle_negations_hold(plan, j, groups[-1][-1], e, binding, sub):
                        proceeded = candidate
                    else:
                        proceed_killed = True
            if took is None and proceeded is None:
                if not proceed_killed:
                    alive.append(groups)  # e is skipped
                continue
            for new in (took, proceeded):
                if new is not None:
                    emit_or_keep(new, alive)
        if e.type in plan.positives[0].types and _ready_hold(plan, [[e]]):
            emit_or_keep([[e]], alive)
        runs = alive
    return found
