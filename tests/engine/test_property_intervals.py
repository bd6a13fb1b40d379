"""Property test of issue 15: interval events, relation conjuncts and ``SEQ(...) BY rel`` against the oracle.

Random queries of the pattern suite (tests/engine/patterns.py) get relation conjuncts between their
variables (``a OVERLAPS(1 s) b``, ``b[i] DURING c``, ``NOT (a MEETS b)``) and, now and then, a BY relation
on the top-level SEQ; streams sit on a small integer grid (starts 0..8 s, durations 0..3 s, so point
events, ties and exactly touching intervals are the common case) and arrive in the matcher's order
(ts_end, id). The matcher reads the LQL text, which the parser rewrites into ts/ts_end comparisons; the
oracle evaluates each relation on the endpoints directly (tests/engine/oracle.py).
"""
from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.events import MICROS_PER_S, Event
from engine.lql import ast as A
from engine.lql.relations import ARITY
from tests.engine.oracle import Rel, enumerate_matches
from tests.engine.patterns import Case, queries, to_lql
from tests.engine.test_property_matcher import check_against_oracle

HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
NAMES = sorted(ARITY)


@st.composite
def relations(draw, names: list[str] = NAMES) -> A.Relation:
    name = draw(st.sampled_from(names))
    n = draw(st.sampled_from(ARITY[name]))
    args = [draw(st.integers(0, 3)) * MICROS_PER_S for _ in range(n)]
    if n == 2 and name != "equals":
        args.sort()
    if n == 4:
        args = sorted(args[:2]) + sorted(args[2:])
    return A.Relation(name, tuple(args))


def _vars(node: A.PatternNode) -> tuple[list[str], list[str]]:
    comps = A.components(node)
    return [c.var for c in comps if c.kind == "single"], [c.var for c in comps if c.is_kleene]


@st.composite
def interval_cases(draw, by_only: bool = False) -> Case:
    """A random query with relation conjuncts (or, ``by_only``: a BY relation and no WHERE) and a grid stream."""
    q = draw(queries())
    singles, kleenes = _vars(q.pattern)
    where = q.where
    conjs = list(where.operands if isinstance(where, A.BoolOp) and where.op == "and" else [where] if where else [])
    if by_only:
        conjs = []
    for _ in range(0 if by_only else draw(st.integers(1, 3))):
        refs = [A.AttrRef(v, "ts") for v in singles] + [A.AttrRef(k, "ts", A.Index("i")) for k in kleenes[:1]]
        if len(refs) < 2:
            break
        left, right = draw(st.permutations(refs))[:2]
        if left.index is not None and right.index is not None:
            continue
        rel: A.Expr = Rel(left, right, draw(relations()))
        if draw(st.integers(0, 4)) == 0:
            rel = A.Not(rel)
        conjs.append(rel)
    where = None if not conjs else conjs[0] if len(conjs) == 1 else A.BoolOp("and", tuple(conjs))
    pattern = q.pattern
    if by_only:
        common = ["before", "meets", "intersects", "overlaps", "during", "equals", "met_by"]
        pattern = dataclasses.replace(A.Seq((pattern,)) if not isinstance(pattern, A.Seq) else pattern,
                                      by=draw(relations(common)))
    elif isinstance(pattern, A.Seq) and draw(st.booleans()):
        pattern = dataclasses.replace(pattern, by=draw(relations()))
    q = dataclasses.replace(q, pattern=pattern, where=where)
    return Case(to_lql(q), q, draw(interval_events(q)))


@st.composite
def interval_events(draw, q: A.PatternQuery) -> list[Event]:
    types = sorted({t for c in A.components(q.pattern) for t in c.types})
    n = draw(st.integers(0, 14 if draw(st.booleans()) else 9))
    raw = []
    for _ in range(n):
        start = draw(st.integers(0, 8))
        length = draw(st.sampled_from([0, 0, 1, 1, 2, 3]))
        attrs = {"x": draw(st.integers(0, 5)), "k": draw(st.integers(0, 2))}
        raw.append((start + length, start, draw(st.sampled_from(types)), attrs))
    raw.sort(key=lambda r: r[0])  # the matcher's order (ts_end, id): ids follow it
    return [
        Event(i + 1, t, s * MICROS_PER_S, attrs, e * MICROS_PER_S) for i, (e, s, t, attrs) in enumerate(raw)
    ]


@settings(max_examples=500, deadline=None, suppress_health_check=HEALTH)
@given(case=interval_cases())
def test_interval_matches_equal_the_oracle(case: Case) -> None:
    check_against_oracle(case)


@settings(max_examples=300, deadline=None, suppress_health_check=HEALTH)
@given(case=interval_cases(by_only=True))
def test_by_relation_matches_equal_the_oracle(case: Case) -> None:
    check_against_oracle(case)


def test_by_relates_consecutive_events_inside_a_kleene_run() -> None:
    q = A.PatternQuery(
        A.Seq((A.Component("single", ("A",), "a"), A.Component("plus", ("B",), "b")), by=A.Relation("meets"))
    )
    s = MICROS_PER_S
    events = [Event(1, "A", 0, {}, 1 * s), Event(2, "B", 1 * s, {}, 2 * s), Event(3, "B", 2 * s, {}, 3 * s),
              Event(4, "B", 2 * s, {}, 4 * s)]
    expected = {frozenset({("a", (1,)), ("b", (2,))}), frozenset({("a", (1,)), ("b", (2, 3))}),
                frozenset({("a", (1,)), ("b", (2, 4))})}
    assert enumerate_matches(q, events) == expected
    check_against_oracle(Case(to_lql(q), q, events))
