"""Tree plans (engine.nfa.tree, PLAN tree): every tree shape gives the oracle's matches; the PLAN clause's errors."""
from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from engine.compiler import compile_query
from engine.events import Event
from engine.lql import ast as A
from engine.lql.errors import QueryError
from engine.lql.parser import parse
from engine.matcher import Matcher
from engine.nfa.compiler import PlanCompiler
from engine.nfa.tree import TreeCostModel, all_shapes, cost_model, left_deep, shape_range
from tests.engine.oracle import enumerate_matches
from tests.engine.patterns import (
    NEG_VARS,
    OPS,
    POS_VARS,
    TYPES,
    Case,
    _conjunct,
    _Vars,
    cases,
    cmp,
    events_for,
    lit,
    neg,
    plus,
    query,
    ref,
    seq,
    single,
    star,
    stream,
    to_lql,
)
from tests.engine.test_property_intervals import interval_cases

HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


def tree_query(text: str):
    try:
        return compile_query(dataclasses.replace(parse(text), plan="tree"))
    except QueryError:
        return None


def run(q, events: list[Event]) -> list:
    m = Matcher(q)
    assert m.storage == "tree"
    out = [x for e in events for x in m.push(e)] + m.flush()
    assert m.stats()["live_partial_matches"] == 0
    return out


def every_shape_gives(q, case: Case, expected: set) -> None:
    """Run ``q`` with every tree shape (plan k gets its shape k modulo its number of shapes) and compare."""
    shapes = [list(all_shapes(0, len(p.slots) - 1)) for p in q.plans]
    for k in range(max(len(s) for s in shapes)):
        trees = [(s[k % len(s)], t[1]) for s, t in zip(shapes, q.trees)]
        out = run(dataclasses.replace(q, trees=trees), case.events)
        got = {m.key() for m in out}
        assert got == expected, f"{case.describe()}\n  shapes {[t[0] for t in trees]}"
        assert len(out) == len(got), "duplicate matches"


@settings(max_examples=250, deadline=None, suppress_health_check=HEALTH)
@given(case=cases(strategies=("skip_till_any_match",)))
def test_every_tree_shape_gives_the_oracles_matches(case: Case) -> None:
    q = tree_query(case.text)
    assume(q is not None)
    assert q is not None
    expected = enumerate_matches(case.query, case.events)
    every_shape_gives(q, case, expected)


def test_plan_clause_errors_and_choice() -> None:
    with pytest.raises(QueryError, match="only under skip_till_any_match") as e:
        compile_query("PATTERN SEQ(A a, B b) STRATEGY skip_till_next_match PLAN tree")
    assert (e.value.line, e.value.column) == (1, 53)
    assert compile_query("PATTERN SEQ(A a, B+ b[]) PLAN tree WITHIN 1 s").plan_kind == "tree"
    assert compile_query("PATTERN SEQ(A a, !B n, C* c[], D d) PLAN tree WITHIN 1 s").plan_kind == "tree"
    with pytest.raises(QueryError, match="cannot evaluate a trailing negation") as e:
        compile_query("PATTERN SEQ(A a, C c, !B n) PLAN tree WITHIN 1 s")
    assert (e.value.line, e.value.column) == (1, 29)
    with pytest.raises(QueryError, match="cannot evaluate a trailing negation"):  # the plan without c
        compile_query("PATTERN SEQ(A a, !B n, C* c[]) PLAN tree WITHIN 1 s")
    with pytest.raises(QueryError, match="start with a negation") as e:
        compile_query("PATTERN SEQ(!B n, A a, C c) PLAN tree WITHIN 1 s")
    assert (e.value.line, e.value.column) == (1, 13)
    with pytest.raises(QueryError, match=r"negation condition on a later Kleene variable \(other than its \[1\]\)"):
        compile_query("PATTERN SEQ(A a, !B n, C+ c[]) WHERE n.x = c[last].x PLAN tree WITHIN 1 s")
    with pytest.raises(QueryError, match="only under skip_till_any_match"):
        compile_query("PATTERN SEQ(A a, !B n, C+ c[]) STRATEGY skip_till_next_match PLAN tree WITHIN 1 s")
    with pytest.raises(QueryError, match="unknown plan 'bushy'"):
        compile_query("PATTERN SEQ(A a, B b) PLAN bushy")
    with pytest.raises(QueryError, match="duplicate PLAN"):
        compile_query("PATTERN SEQ(A a, B b) PLAN nfa PLAN tree")
    # the strategy override (lace match --strategy) is checked too
    with pytest.raises(QueryError, match="only under skip_till_any_match"):
        compile_query("PATTERN SEQ(A a, B b) PLAN tree", strategy="strict_contiguity")
    assert compile_query("PATTERN SEQ(A a, B b) PLAN nfa").plan_kind == "nfa"
    # auto without rates keeps the NFA; with a rare last component and a frequent middle one, a tree
    q = "PATTERN SEQ(A a, B b, C c) WHERE c.x = b.x PARTITION BY k WITHIN 1 s"
    assert compile_query(q).plan_kind == "nfa"
    rare_last = compile_query(q, rates={"A": 100.0, "B": 100.0, "C": 0.01})
    assert rare_last.plan_kind == "tree" and rare_last.trees[0][0] == (0, (1, 2))
    assert compile_query(q, rates={"A": 1.0, "B": 1.0, "C": 1.0}).plan_kind == "nfa"


def test_dp_finds_the_cheapest_tree_and_greedy_covers_long_patterns() -> None:
    model = TreeCostModel([5.0, 0.1, 7.0, 0.2, 3.0, 9.0], [(frozenset({1, 2}), 0.1)], 1.0)
    best = model.best()
    assert model.cost(best) == pytest.approx(min(model.cost(s) for s in all_shapes(0, 5)))
    long = TreeCostModel([1.0 + (i % 3) for i in range(12)], [], 0.5)
    shape = long.best()  # 12 components: greedy
    assert shape_range(shape) == (0, 11)
    assert long.cost(shape) <= long.cost(left_deep(12)) * 1.0001


# --------------------------------------------------------------------------- Kleene closure and negation (issue 16)


@st.composite
def kleene_negation_cases(draw) -> Case:
    """SEQ patterns of up to 5 components with Kleene closures (``T+``, ``T*``) and middle negations (their
    neighbours bind in every plan), WHERE conjuncts of every kind the random suite draws plus negation
    conjuncts that read a variable after the negation, and a random stream."""
    n_pos = draw(st.integers(2, 4))
    kinds = [draw(st.sampled_from(["single", "single", "plus", "star"])) for _ in range(n_pos)]
    if not any(k != "star" for k in kinds):
        kinds[0] = "plus"
    names = iter(POS_VARS)
    items: list = []
    singles: list[str] = []
    kleenes: list[str] = []
    negs: list = []
    neg_names = iter(NEG_VARS)
    later: dict[str, list[str]] = {}
    earlier: dict[str, list[str]] = {}  # Kleene variables before the negation: read through b[i] or b[last]
    for j, kind in enumerate(kinds):
        t = draw(st.sampled_from(TYPES))
        v = next(names)
        if j > 0 and len(items) + n_pos - j < 5 and kind != "star" and kinds[j - 1] != "star" and draw(st.booleans()):
            n = next(neg_names)
            items.append(neg(draw(st.sampled_from(TYPES)), n))
            negs.append((n, list(singles)))
            later[n] = []
            earlier[n] = list(kleenes)
        items.append({"single": single, "plus": plus, "star": star}[kind](t, v))
        if kind == "single":
            singles.append(v)
            for n in later:
                later[n].append(v)
        else:
            kleenes.append(v)
            for n in later:
                later[n].append(f"{v}[1]")
    assume(negs or kleenes)
    vs = _Vars([(v, False) for v in singles], kleenes, negs, list(singles))
    conjs = [c for c in (draw(_conjunct(vs)) for _ in range(draw(st.integers(0, 3)))) if c is not None]
    for b in kleenes:  # conjuncts of the closure alone: per element, per pair, on the complete closure
        if draw(st.booleans()):
            index = draw(st.sampled_from(["i", "last", "2", "1"]))
            other = ref(b, "x", "i-1") if index == "i" and draw(st.booleans()) else lit(draw(st.integers(0, 5)))
            conjs.append(cmp(draw(st.sampled_from(OPS)), ref(b, "x", index), other))
    for n, after in later.items():
        if after and draw(st.booleans()):
            target = draw(st.sampled_from(after))
            var, _, index = target.partition("[")
            conjs.append(cmp(draw(st.sampled_from(OPS)), ref(n), ref(var, "x", "1" if index else None)))
        if earlier[n] and draw(st.booleans()):
            b = draw(st.sampled_from(earlier[n]))
            conjs.append(cmp(draw(st.sampled_from(OPS)), ref(n), ref(b, "x", draw(st.sampled_from(["i", "last"])))))
    where = None if not conjs else conjs[0] if len(conjs) == 1 else A.BoolOp("and", tuple(conjs))
    within_s = draw(st.sampled_from([None, 2, 4, 8]))
    q = query(seq(*items), where, partition_by=("k",) if draw(st.booleans()) else (), within_s=within_s)
    return Case(to_lql(q), q, draw(events_for(q, 8)))


@settings(max_examples=300, deadline=None, suppress_health_check=HEALTH)
@given(case=kleene_negation_cases())
def test_kleene_and_negation_trees_give_the_nfas_and_the_oracles_matches(case: Case) -> None:
    q = tree_query(case.text)
    assert q is not None, case.text
    expected = enumerate_matches(case.query, case.events)
    nfa = Matcher(compile_query(dataclasses.replace(parse(case.text), plan="nfa")))
    assert {m.key() for e in case.events for m in nfa.push(e)} | {m.key() for m in nfa.flush()} == expected
    every_shape_gives(q, case, expected)


def test_kleene_leaf_and_nseq_by_hand() -> None:
    text = (
        "PATTERN SEQ(A a, !B n, C* c[], D d) WHERE d.x = a.x AND n.x = d.x AND c[i].x > c[i-1].x "
        "AND c[last].x < 9 PLAN tree WITHIN 10 s"
    )
    events = stream(
        "a1 b1 c1 c2 c3 d1 b2 d2",
        a1={"x": 1}, b1={"x": 0}, c1={"x": 1}, c2={"x": 3}, c3={"x": 2}, d1={"x": 1}, b2={"x": 1}, d2={"x": 1},
    )
    expected = enumerate_matches(parse(text), events)
    # (a1 d1), and (a1 c d) for c = c1, c2, c3, c1c2, c1c3 and d = d1, d2; b2 (x = d2.x) kills (a1 d2) only
    assert len(expected) == 11 and not any(("d", (8,)) in k and len(k) == 2 for k in expected)
    q = compile_query(text)
    for shape in all_shapes(0, 2):
        trees = [((0, 1), t[1]) if len(p.slots) == 2 else (shape, t[1]) for p, t in zip(q.plans, q.trees)]
        assert {m.key() for m in run(dataclasses.replace(q, trees=trees), events)} == expected


def test_cost_model_counts_kleene_closures_and_negation_pass_probability() -> None:
    text = "PATTERN SEQ(A a, !B n, C+ c[], D d) WHERE c[i].x > c[i-1].x AND d.x = a.x WITHIN 2 s"
    q = compile_query(text + " PLAN tree", estimates={"c[i].x > c[i-1].x": 0.5, "d.x = a.x": 0.25})
    compiler = PlanCompiler(parse(text), tuple(c for c in A.components(parse(text).pattern)), 0, False)
    conj = [(comps, c, 0.5 if len(comps) == 1 else 0.25) for comps, c in q.trees[0][1]]
    rates = {"A": 1.0, "B": 3.0, "C": 2.0, "D": 0.5}
    model = cost_model(q.plans[0], conj, rates, 2.0, compiler.negation_estimates())
    # closures ending at one C event: exp(r * q * W) with r = 2/s, q = 1/2, W = 2 s
    assert model.results(1, 1) == pytest.approx(2.0 * math.exp(2.0))
    # no B (3/s, no conjunct) in the mean gap W/3 between a and c: exp(-3 * 2/3)
    (span, p, scan), = model.negations
    assert span == {0, 1} and p == pytest.approx(math.exp(-2.0)) and scan == 1.0
    assert model.results(0, 1) == pytest.approx(1.0 * model.results(1, 1) * p * 2.0)
    assert model.cost(model.best()) == pytest.approx(min(model.cost(s) for s in all_shapes(0, 2)))
    # a negation conjunct that reads a later variable: checked where d joins, scanning the B events in the gap
    q2 = compile_query("PATTERN SEQ(A a, !B n, C c, D d) WHERE n.x = d.x PLAN tree WITHIN 2 s")
    model2 = cost_model(q2.plans[0], [], rates, 2.0, [(1.0, 0.1)])
    (span, p, scan), = model2.negations
    assert span == {0, 1, 2} and p == pytest.approx(math.exp(-3 * 0.1 * 2 / 3)) and scan == pytest.approx(2.0)


def test_long_stream_cuts_stale_results_and_matches_the_nfa() -> None:
    """Benchmark (a)'s pattern over a few thousand events: stale left results and closures are cut while
    running (more than the cut threshold between sweeps), and every shape still finds the NFA's matches."""
    rnd = random.Random(16)
    events = []
    for i in range(3000):
        attrs = {"p1": rnd.randrange(4), "p2": rnd.randrange(3), "p3": rnd.randrange(2), "p6": rnd.randrange(4)}
        events.append(Event(i, rnd.choice("ABCD"), i * 50_000, attrs))
    text = (
        "PATTERN SEQ(A a, !B b, C* c[], D d) WHERE d.p1 = a.p1 AND b.p3 = a.p3 AND c[i].p2 = a.p2 "
        "AND c[i].p1 >= c[i-1].p1 AND d.p6 = 0 WITHIN 300 ms"
    )
    nfa = Matcher(compile_query(text + " PLAN nfa"))
    expected = [m.key() for e in events for m in nfa.push(e)] + [m.key() for m in nfa.flush()]
    assert len(expected) > 50
    q = compile_query(text + " PLAN tree")
    for shape in all_shapes(0, 2):
        trees = [((0, 1), t[1]) if len(p.slots) == 2 else (shape, t[1]) for p, t in zip(q.plans, q.trees)]
        m = Matcher(dataclasses.replace(q, trees=trees))
        got = [x.key() for e in events for x in m.push(e)]
        assert m.stats()["peak_live"] < 250  # 309 in (a (c d)) without the cuts: the sweep runs every 10 s only
        got += [x.key() for x in m.flush()]
        assert sorted(map(sorted, got)) == sorted(map(sorted, expected))
        assert m.stats()["live_partial_matches"] == 0


@settings(max_examples=120, deadline=None, suppress_health_check=HEALTH)
@given(case=interval_cases())
def test_every_tree_shape_orders_interval_events_as_the_matcher(case: Case) -> None:
    """Interval events (issue 15): a tree orders by (ts_end, id) and bounds ``last.ts_end - first.ts``."""
    assume(case.query.strategy == "skip_till_any_match")
    q = tree_query(case.text)
    assume(q is not None)
    every_shape_gives(q, case, enumerate_matches(case.query, case.events))
