"""Test inputs for the matcher: syntax-tree builders, an LQL renderer, hypothesis strategies, the bench stream.

- Builders (``single``, ``plus``, ``seq``, ``ref``, ``cmp``, ``query`` ...) make
  :mod:`engine.lql.ast` trees in one line, so tests of the oracle need no parser.
- :func:`to_lql` renders a :class:`~engine.lql.ast.PatternQuery` as LQL text.
- :func:`cases` is a hypothesis strategy of random (query text, syntax tree,
  stream, strategy) cases: the syntax tree feeds the oracle, the text feeds the
  engine, so the parser is under test too.
- :func:`bench_events` rebuilds the peer benchmark stream of
  ``shared/bench/gen_stream.py`` (same algorithm, same numbers) as events.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from hypothesis import strategies as st

from engine.events import MICROS_PER_S, Event
from engine.lql import ast as A
from tests.engine.oracle import Rel

# =========================================================================== syntax-tree builders


def single(types: str, var: str) -> A.Component:
    """``T v``; ``types`` "AB" makes ``ANY(A, B) v``."""
    return A.Component("single", tuple(types), var)


def plus(t: str, var: str) -> A.Component:
    return A.Component("plus", (t,), var)


def star(t: str, var: str) -> A.Component:
    return A.Component("star", (t,), var)


def neg(t: str, var: str) -> A.Component:
    return A.Component("neg", (t,), var)


def seq(*items: A.PatternNode) -> A.Seq:
    return A.Seq(tuple(items))


def and_(*items: A.PatternNode) -> A.And:
    return A.And(tuple(items))


def or_(*items: A.PatternNode) -> A.Or:
    return A.Or(tuple(items))


_INDEX = {"i": A.Index("i"), "i-1": A.Index("prev"), "1": A.Index("first"), "last": A.Index("last")}


def ref(var: str, attr: str = "x", index: str | None = None) -> A.AttrRef:
    """``var.attr``; index "i", "i-1", "1", "last" or "3" gives ``var[index].attr``."""
    if index is None:
        return A.AttrRef(var, attr)
    idx = _INDEX.get(index) or A.Index("at", int(index))
    return A.AttrRef(var, attr, idx)


def lit(v) -> A.Literal:
    return A.Literal(v)


def secs(n: int) -> A.Literal:
    """A duration literal of n seconds (int microseconds)."""
    return A.Literal(n * MICROS_PER_S, is_duration=True)


def cmp(op: str, left, right) -> A.Compare:
    return A.Compare(op, _expr(left), _expr(right))  # type: ignore[arg-type]


def arith(op: str, left, right) -> A.BinOp:
    return A.BinOp(op, _expr(left), _expr(right))  # type: ignore[arg-type]


def all_(*xs: A.Expr) -> A.BoolOp:
    return A.BoolOp("and", tuple(xs))


def any_(*xs: A.Expr) -> A.BoolOp:
    return A.BoolOp("or", tuple(xs))


def not_(x: A.Expr) -> A.Not:
    return A.Not(x)


def equiv(attr: str) -> A.Equivalence:
    return A.Equivalence(attr)


def _expr(x) -> A.Expr:
    """Wrap a Python constant; a negative number is ``Neg`` of a literal, as the parser reads ``-1``."""
    if isinstance(x, (int, float)) and not isinstance(x, bool) and x < 0:
        return A.Neg(A.Literal(-x))
    return x if not isinstance(x, (int, float, str)) else A.Literal(x)


def query(
    pattern: A.PatternNode,
    where: A.Expr | None = None,
    *,
    partition_by: tuple[str, ...] = (),
    strategy: str = A.DEFAULT_STRATEGY,
    within_s: float | None = None,
    within_us: int | None = None,
) -> A.PatternQuery:
    if within_s is not None:
        within_us = int(round(within_s * MICROS_PER_S))
    return A.PatternQuery(pattern, where, tuple(partition_by), strategy, within_us)  # type: ignore[arg-type]


# =========================================================================== LQL text


def _duration(us: int) -> str:
    if us % MICROS_PER_S == 0:
        return f"{us // MICROS_PER_S} seconds"
    if us % 1000 == 0:
        return f"{us // 1000} ms"
    return f"{us} us"


def _pattern_text(node: A.PatternNode) -> str:
    if isinstance(node, A.Component):
        t = node.types[0] if len(node.types) == 1 else f"ANY({', '.join(node.types)})"
        return {
            "single": f"{t} {node.var}",
            "plus": f"{t}+ {node.var}[]",
            "star": f"{t}* {node.var}[]",
            "neg": f"!{t} {node.var}",
        }[node.kind]
    name = {A.Seq: "SEQ", A.And: "AND", A.Or: "OR"}[type(node)]
    by = f" BY {relation_text(node.by)}" if isinstance(node, A.Seq) and node.by is not None else ""
    return f"{name}({', '.join(_pattern_text(i) for i in node.items)}){by}"


def relation_text(rel: A.Relation) -> str:
    """``OVERLAPS(0 us, 2000000 us)``: a relation with its tolerances in microseconds (issue 15)."""
    return rel.name.upper() + (f"({', '.join(f'{a} us' for a in rel.args)})" if rel.args else "")


def expr_text(e: A.Expr) -> str:
    if isinstance(e, A.Literal):
        if e.is_duration:
            return _duration(int(e.value))
        if isinstance(e.value, bool):
            return "TRUE" if e.value else "FALSE"
        if isinstance(e.value, str):
            return "'" + e.value.replace("'", "''") + "'"
        return repr(e.value)
    if isinstance(e, A.AttrRef):
        if e.index is None:
            return f"{e.var}.{e.attr}"
        idx = {"i": "i", "prev": "i-1", "first": "1", "last": "last"}.get(e.index.kind, str(e.index.at))
        return f"{e.var}[{idx}].{e.attr}"
    if isinstance(e, A.BinOp):
        return f"({expr_text(e.left)} {e.op} {expr_text(e.right)})"
    if isinstance(e, A.Neg):
        return f"-({expr_text(e.operand)})"
    if isinstance(e, A.Compare):
        return f"{expr_text(e.left)} {e.op} {expr_text(e.right)}"
    if isinstance(e, A.BoolOp):
        return "(" + f" {e.op.upper()} ".join(expr_text(x) for x in e.operands) + ")"
    if isinstance(e, A.Not):
        return f"NOT ({expr_text(e.operand)})"
    if isinstance(e, A.Equivalence):
        return f"[{e.attr}]"
    if isinstance(e, Rel):  # the oracle's relation conjunct: `a BEFORE(1 us) b`
        left, right = (expr_text(r).rsplit(".", 1)[0] for r in (e.left, e.right))
        return f"{left} {relation_text(e.rel)} {right}"
    raise TypeError(f"cannot render {e!r}")


def to_lql(q: A.PatternQuery, *, explicit_default_strategy: bool = True) -> str:
    """LQL text of a pattern query, one clause per line."""
    lines = [f"PATTERN {_pattern_text(q.pattern)}"]
    if q.where is not None:
        if isinstance(q.where, A.BoolOp) and q.where.op == "and":
            lines.append("WHERE " + " AND ".join(expr_text(c) for c in q.where.operands))
        else:
            lines.append("WHERE " + expr_text(q.where))
    if q.partition_by:
        lines.append("PARTITION BY " + ", ".join(q.partition_by))
    if explicit_default_strategy or q.strategy != A.DEFAULT_STRATEGY:
        lines.append(f"STRATEGY {q.strategy}")
    if q.within_us is not None:
        lines.append(f"WITHIN {_duration(q.within_us)}")
    return "\n".join(lines)


# =========================================================================== streams for hand-written tests


def stream(
    spec: str, attrs: dict[str, dict] | None = None, *, gap_s: float = 1.0, **attrs_by_name: dict
) -> list[Event]:
    """Events from a compact spec: "a1 a2 b1" -> types A, A, B; ids 1..n; ts 0, gap, 2 gap ... seconds.

    ``attrs`` / ``attrs_by_name``: token -> attrs dict, e.g. ``b2={"x": 3}``. A token
    ``a1@2.5`` sets ts to 2.5 s instead.
    """
    attrs_by_name = {**(attrs or {}), **attrs_by_name}
    out = []
    for k, token in enumerate(spec.split()):
        name, _, at = token.partition("@")
        ts_s = float(at) if at else k * gap_s
        out.append(Event(k + 1, name[0].upper(), int(round(ts_s * MICROS_PER_S)), dict(attrs_by_name.get(name, {}))))
    return out


# =========================================================================== random cases (hypothesis)

TYPES = "ABCD"
NOISE = "E"
POS_VARS = ("a", "b", "c", "d", "f", "g", "h", "j", "p", "q", "r", "s", "t", "u", "v", "w")
NEG_VARS = ("n", "m", "o")
KLEENE_TYPE_CAP = 10
MAX_EVENTS = 25
OPS = ("=", "!=", "<", "<=", ">", ">=")


class Case:
    """One random test case: the query as text and as a syntax tree, and a stream."""

    def __init__(self, text: str, query: A.PatternQuery, events: list) -> None:
        self.text = text
        self.query = query
        self.events = events

    @property
    def strategy(self) -> str:
        return self.query.strategy

    def describe(self) -> str:
        evs = "\n".join(f"  {e.id:>2} {e.type} ts={e.ts / MICROS_PER_S:g}s {e.attrs}" for e in self.events)
        return f"query:\n{self.text}\nstream ({len(self.events)} events):\n{evs}"

    def __repr__(self) -> str:
        return "Case(\n" + self.describe() + "\n)"

    def _repr_pretty_(self, p, cycle) -> None:  # what hypothesis prints for a falsifying example
        p.text(repr(self))


@dataclass
class _Vars:
    """What the WHERE generator may refer to."""

    singles: list  # (var, is_any) of single positive variables, in pattern order
    kleenes: list  # Kleene variables
    negs: list  # (neg var, singles before it at top level)
    top_singles: list  # single variables that are direct items of the top-level SEQ


@st.composite
def _sub_pattern(draw, names, kleene_budget: list) -> A.PatternNode:
    """A small operand of OR/AND: a single, a Kleene plus, or SEQ of two singles."""
    kind = draw(st.sampled_from(["single", "single", "plus", "seq"]))
    if kind == "plus" and kleene_budget[0] > 0:
        kleene_budget[0] -= 1
        return plus(draw(st.sampled_from(TYPES)), next(names))
    if kind == "seq":
        return seq(single(draw(st.sampled_from(TYPES)), next(names)), single(draw(st.sampled_from(TYPES)), next(names)))
    return single(draw(st.sampled_from(TYPES)), next(names))


@st.composite
def _pattern(draw) -> tuple[A.PatternNode, _Vars, bool]:
    """A random pattern; returns it, its variables, and whether it has a trailing negation."""
    names = iter(POS_VARS)
    neg_names = iter(NEG_VARS)
    kleene_budget = [2]

    if draw(st.integers(0, 9)) == 0:  # occasionally a top-level OR / AND
        op = draw(st.sampled_from([or_, and_]))
        parts = [draw(_sub_pattern(names, kleene_budget)) for _ in range(draw(st.integers(2, 3)))]
        node = op(*parts)
        return node, _collect(node, []), False

    n_items = draw(st.integers(2, 4))
    items: list = []
    negs: list = []
    top_singles: list = []
    for _ in range(n_items):
        # no negation before a component that must bind: the parser rejects SEQ(B* b[], !C n, ...)
        # as starting with a negation (docs/semantics.md would only drop the plan without b)
        bound_before = any(not (isinstance(it, A.Component) and it.kind in ("star", "neg")) for it in items)
        choices = (
            ["single"] * 5 + ["plus"] * 2 + ["star", "any"] + (["neg"] * 3 if bound_before else []) + ["or", "and"]
        )
        kind = draw(st.sampled_from(choices))
        t = draw(st.sampled_from(TYPES))
        if kind in ("plus", "star") and kleene_budget[0] == 0:
            kind = "single"
        if kind == "single":
            v = next(names)
            items.append(single(t, v))
            top_singles.append(v)
        elif kind == "any":
            t2 = draw(st.sampled_from([x for x in TYPES if x != t]))
            v = next(names)
            items.append(single("".join(sorted(t + t2)), v))
            top_singles.append(v)
        elif kind in ("plus", "star"):
            kleene_budget[0] -= 1
            items.append((plus if kind == "plus" else star)(t, next(names)))
        elif kind == "neg":
            n = next(neg_names, None)
            if n is None:
                items.append(single(t, v := next(names)))
                top_singles.append(v)
                continue
            items.append(neg(t, n))
            negs.append((n, list(top_singles)))
        else:
            op = or_ if kind == "or" else and_
            items.append(op(*[draw(_sub_pattern(names, kleene_budget)) for _ in range(2)]))
    positives = [c for c in A.components(seq(*items)) if c.kind != "neg"]
    if all(c.kind == "star" for c in positives):  # keep at least one component that must bind
        first_star = next(k for k, it in enumerate(items) if isinstance(it, A.Component) and it.kind == "star")
        c = items[first_star]
        items[first_star] = plus(c.types[0], c.var)
    node = seq(*items)
    # a negation followed only by negations and stars is trailing in some plan: WITHIN is needed
    trailing = False
    for it in reversed(items):
        if not isinstance(it, A.Component) or it.kind not in ("neg", "star"):
            break
        trailing = trailing or it.kind == "neg"
    vars_ = _collect(node, negs)
    vars_.top_singles = top_singles
    return node, vars_, trailing


def _collect(node: A.PatternNode, negs: list) -> _Vars:
    singles, kleenes = [], []
    for c in A.components(node):
        if c.kind == "single":
            singles.append((c.var, len(c.types) > 1))
        elif c.kind in ("plus", "star"):
            kleenes.append(c.var)
    return _Vars(singles, kleenes, negs, [])


@st.composite
def _conjunct(draw, vs: _Vars) -> A.Expr | None:
    """One WHERE conjunct over the pattern's variables (None when the template does not fit)."""
    singles = [v for v, _ in vs.singles]
    op = draw(st.sampled_from(OPS))
    small = draw(st.integers(0, 5))
    kinds = ["lit", "pair", "key", "arith", "div", "not", "or", "ts", "string", "missing", "type"]
    if vs.kleenes:
        kinds += ["iter", "iter", "iter_single", "first", "last"]
    if vs.negs:
        kinds += ["neg", "neg"]
    kinds += ["equiv"]
    kind = draw(st.sampled_from(kinds))

    def one():
        return draw(st.sampled_from(singles))

    def two():
        return draw(st.permutations(singles))[:2]

    if kind == "lit" and singles:
        return cmp(op, ref(one()), small)
    if kind == "pair" and len(singles) >= 2:
        s1, s2 = two()
        return cmp(op, ref(s1), ref(s2))
    if kind == "key" and len(singles) >= 2:
        s1, s2 = two()
        return cmp(draw(st.sampled_from(["=", "!="])), ref(s1, "k"), ref(s2, "k"))
    if kind == "arith" and singles:
        s1 = one()
        aop = draw(st.sampled_from(["+", "-", "*"]))
        right = ref(draw(st.sampled_from(singles))) if draw(st.booleans()) else lit(draw(st.integers(1, 3)))
        left: A.Expr = arith(aop, ref(s1), right)
        if draw(st.integers(0, 4)) == 0:
            left = A.Neg(left)
        return cmp(op, left, draw(st.integers(-5, 10)))
    if kind == "div" and len(singles) >= 2:
        s1, s2 = two()
        return cmp(op, arith("/", ref(s1), ref(s2)), draw(st.sampled_from([0, 1, 2, 0.5])))
    if kind == "not" and len(singles) >= 2:
        s1, s2 = two()
        return not_(cmp(op, ref(s1), ref(s2)))
    if kind == "or" and singles:
        return any_(cmp(op, ref(one()), small), cmp(draw(st.sampled_from(OPS)), ref(one()), draw(st.integers(0, 5))))
    if kind == "ts" and len(singles) >= 2:
        s1, s2 = two()
        return cmp(
            draw(st.sampled_from(["<", "<=", ">", ">="])),
            arith("-", ref(s2, "ts"), ref(s1, "ts")),
            secs(draw(st.integers(0, 3))),
        )
    if kind == "string" and singles:
        return cmp(draw(st.sampled_from(["=", "!=", "<"])), ref(one()), "A")
    if kind == "missing" and singles:
        c = cmp(">", ref(one(), "y"), 1)
        return not_(c) if draw(st.booleans()) else c
    if kind == "type":
        anys = [v for v, is_any in vs.singles if is_any]
        if anys:
            return cmp(
                draw(st.sampled_from(["=", "!="])),
                ref(draw(st.sampled_from(anys)), "type"),
                draw(st.sampled_from(TYPES)),
            )
        return None
    if kind == "iter":
        b = draw(st.sampled_from(vs.kleenes))
        return cmp(draw(st.sampled_from(["<", "<=", ">", ">=", "!="])), ref(b, "x", "i"), ref(b, "x", "i-1"))
    if kind == "iter_single" and singles:
        b = draw(st.sampled_from(vs.kleenes))
        return cmp(op, ref(b, "x", "i"), ref(one()) if draw(st.booleans()) else lit(small))
    if kind == "first":
        b = draw(st.sampled_from(vs.kleenes))
        return cmp(op, ref(b, "x", "1"), ref(one()) if singles and draw(st.booleans()) else lit(small))
    if kind == "last":
        b = draw(st.sampled_from(vs.kleenes))
        if singles and draw(st.booleans()):
            return cmp(op, ref(b, "x", "last"), ref(one()))
        if singles and draw(st.booleans()):
            return cmp("<=", arith("-", ref(b, "ts", "last"), ref(one(), "ts")), secs(draw(st.integers(1, 4))))
        return cmp(op, ref(b, "x", "last"), small)
    if kind == "neg":
        n, before = draw(st.sampled_from(vs.negs))
        r = draw(st.integers(0, 2))
        if r == 0 or not before:
            return cmp(op, ref(n), small)
        s = draw(st.sampled_from(before))
        if r == 1:
            return cmp(op, ref(n), ref(s))
        return cmp("=", ref(n, "k"), ref(s, "k"))
    if kind == "equiv":
        return equiv("k")
    return None


@st.composite
def queries(draw, strategies: tuple[str, ...] = A.STRATEGIES, min_conjuncts: int = 0) -> A.PatternQuery:
    """A random pattern query (see the module docstring of tests/engine/patterns.py)."""
    node, vs, trailing = draw(_pattern())
    strategy = draw(st.sampled_from(strategies))
    conjs = []
    for _ in range(draw(st.integers(min_conjuncts, 3))):
        c = draw(_conjunct(vs))
        if c is not None:
            conjs.append(c)
    where = None if not conjs else conjs[0] if len(conjs) == 1 else A.BoolOp("and", tuple(conjs))
    within_s = draw(st.sampled_from(range(1, 9))) if trailing or draw(st.booleans()) else None
    partition = ("k",) if draw(st.sampled_from((True, False, False))) else ()
    return query(node, where, partition_by=partition, strategy=strategy, within_s=within_s)


@st.composite
def events_for(draw, q: A.PatternQuery, min_events: int = 0) -> list[Event]:
    """A stream over the query's types (plus a noise type now and then): ids 1..n, ts with or without ties."""
    comps = A.components(q.pattern)
    alphabet = sorted({t for c in comps for t in c.types})
    kleene_types = {t for c in comps if c.is_kleene for t in c.types}
    if draw(st.booleans()):
        alphabet.append(NOISE)
    ties = draw(st.booleans())
    gaps = [0, 0, 0.5, 1, 1, 2] if ties else [0.5, 0.5, 1, 1, 2]  # seconds; windows are 1..8 s
    n = draw(st.sampled_from(range(min_events, MAX_EVENTS + 1)))  # uniform: integers() favours tiny streams
    events: list[Event] = []
    ts_s = 0.0
    n_kleene = 0
    for _ in range(n):
        t = draw(st.sampled_from(alphabet))
        ts_s += draw(st.sampled_from(gaps))
        if t in kleene_types:
            if n_kleene >= KLEENE_TYPE_CAP:
                continue
            n_kleene += 1
        attrs = {"x": draw(st.integers(0, 5)), "k": draw(st.integers(0, 2))}
        events.append(Event(len(events) + 1, t, int(ts_s * MICROS_PER_S), attrs))
    return events


@st.composite
def cases(draw, strategies: tuple[str, ...] = A.STRATEGIES, min_events: int = 0, min_conjuncts: int = 0) -> Case:
    """A random (query text, syntax tree, stream) case; the strategy is the query's STRATEGY.

    ``strategies`` restricts the selection strategy; ``min_events`` / ``min_conjuncts``
    make denser cases for the focused property tests.
    """
    q = draw(queries(strategies, min_conjuncts))
    text = to_lql(q, explicit_default_strategy=draw(st.booleans()))
    return Case(text, q, draw(events_for(q, min_events)))


# =========================================================================== the peer benchmark stream


def bench_events(n: int, *, types: int = 3, keys: int = 100, rate: float = 1000.0, seed: int = 42) -> list[Event]:
    """The stream of ``gen_stream.py --n N --types T --keys K --rate R --seed S`` as events.

    Same algorithm and random calls as ``shared/bench/gen_stream.py``: id = row number
    (1-based), type = letter, ts = ts_ms * 1000 (int microseconds), attrs key and price.
    """
    rng = random.Random(seed)
    names = list(string.ascii_uppercase[:types])
    weights = [1.0] * types
    ts_ms = 0
    mean_gap_ms = 1000.0 / rate
    out = []
    for k in range(n):
        gap = max(1, int(round(rng.expovariate(1.0 / mean_gap_ms))))
        ts_ms += gap
        t = rng.choices(names, weights=weights)[0]
        key = rng.randrange(keys)
        price = round(rng.uniform(1.0, 100.0), 2)
        out.append(Event(k + 1, t, ts_ms * 1000, {"key": key, "price": price}))
    return out
