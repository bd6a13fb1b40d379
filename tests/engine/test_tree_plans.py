"""Tree plans (engine.nfa.tree, PLAN tree): every tree shape gives the oracle's matches; the PLAN clause's errors."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, assume, given, settings

from engine.compiler import compile_query
from engine.events import Event
from engine.lql.errors import QueryError
from engine.lql.parser import parse
from engine.matcher import Matcher
from engine.nfa.tree import TreeCostModel, all_shapes, left_deep, shape_range
from tests.engine.oracle import enumerate_matches
from tests.engine.patterns import Case, cases

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


@settings(max_examples=250, deadline=None, suppress_health_check=HEALTH)
@given(case=cases(strategies=("skip_till_any_match",)))
def test_every_tree_shape_gives_the_oracles_matches(case: Case) -> None:
    q = tree_query(case.text)
    assume(q is not None)
    assert q is not None
    expected = enumerate_matches(case.query, case.events)
    shapes = [list(all_shapes(0, len(p.slots) - 1)) for p in q.plans]
    for k in range(max(len(s) for s in shapes)):
        trees = [(s[k % len(s)], t[1]) for s, t in zip(shapes, q.trees)]
        out = run(dataclasses.replace(q, trees=trees), case.events)
        got = {m.key() for m in out}
        assert got == expected, f"{case.describe()}\n  shapes {[t[0] for t in trees]}"
        assert len(out) == len(got), "duplicate matches"


def test_plan_clause_errors_and_choice() -> None:
    with pytest.raises(QueryError, match="only under skip_till_any_match") as e:
        compile_query("PATTERN SEQ(A a, B b) STRATEGY skip_till_next_match PLAN tree")
    assert (e.value.line, e.value.column) == (1, 53)
    with pytest.raises(QueryError, match="cannot evaluate a Kleene closure"):
        compile_query("PATTERN SEQ(A a, B+ b[]) PLAN tree WITHIN 1 s")
    with pytest.raises(QueryError, match="cannot evaluate a negation"):
        compile_query("PATTERN SEQ(A a, !B n, C c) PLAN tree WITHIN 1 s")
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
