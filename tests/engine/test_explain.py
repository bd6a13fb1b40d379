"""EXPLAIN (engine.nfa.explain): the plan, conjuncts in evaluation order, 004's cost model against measured counts."""
from __future__ import annotations

import random

import pytest

from engine.compiler import compile_query
from engine.events import Event
from engine.matcher import Matcher
from engine.nfa.explain import explain

QUERY = (
    "PATTERN SEQ(A a, B b, C c) WHERE a.x < 0.5 AND b.y < 0.25 AND c.x < a.x + 0.1 AND b.x < 0.5 "
    "PARTITION BY k WITHIN 100 ms"
)
TRUE_PASS = {"a.x < 0.5": 0.5, "b.y < 0.25": 0.25, "b.x < 0.5": 0.5, "c.x < a.x + 0.1": 0.35}


def small_stream(n: int = 12_000, seed: int = 3) -> list[Event]:
    """A, B, C in random order, gaps uniform in [1, 2) ms, five keys, x and y uniform in [0, 1)."""
    rnd = random.Random(seed)
    ts = 0
    out = []
    for i in range(n):
        ts += rnd.randrange(1_000, 2_000)
        out.append(Event(i, rnd.choice("ABC"), ts, {"x": rnd.random(), "y": rnd.random(), "k": rnd.randrange(5)}))
    return out


def test_predicted_per_node_counts_are_within_2x_of_measured() -> None:
    result = explain(compile_query(QUERY, estimates=TRUE_PASS), events=small_stream())
    nodes = result["plans"][0]["nodes"]
    assert [n["var"] for n in nodes] == ["a", "b", "c"]
    for n in nodes:
        est, got = n["estimate"], n["measured"]
        assert got["input"] > 100 and got["output"] > 10, n
        assert 0.5 <= est["input"] / got["input"] <= 2.0, n
        assert 0.5 <= est["output"] / got["output"] <= 2.0, n
    assert result["measured_matches"] == nodes[-1]["measured"]["output"]


def test_conjuncts_are_listed_in_evaluation_order_lowest_pass_first() -> None:
    q = "PATTERN SEQ(A a, B b) WHERE b.x < 90 AND b.y < 50 AND b.z < 2 WITHIN 1 s"
    est = {"b.x < 90": 0.9, "b.y < 50": 0.5, "b.z < 2": 0.02}
    node = explain(compile_query(q, estimates=est))["plans"][0]["nodes"][1]
    assert [c["text"] for c in node["conjuncts"]] == ["b.z < 2", "b.y < 50", "b.x < 90"]
    declared = explain(compile_query(q, estimates=est, order="declared"))["plans"][0]["nodes"][1]
    assert [c["text"] for c in declared["conjuncts"]] == ["b.x < 90", "b.y < 50", "b.z < 2"]
    # formula (9): 3 + 3 * 0.02 + 3 * 0.02 * 0.5, plus building the partial match (c_F = 1) times the pass rate
    p = 0.9 * 0.5 * 0.02
    assert node["estimate"]["cost_per_input"] == pytest.approx(3 + 3 * 0.02 + 3 * 0.01 + p)
    assert declared["estimate"]["cost_per_input"] > node["estimate"]["cost_per_input"]


def test_rates_and_keys_scale_the_estimates_without_events() -> None:
    q = compile_query("PATTERN SEQ(A a, B b) PARTITION BY k WITHIN 2 s")
    one = explain(q, rates={"A": 10, "B": 20}, keys=1)["plans"][0]["nodes"][1]["estimate"]
    ten = explain(q, rates={"A": 10, "B": 20}, keys=10)["plans"][0]["nodes"][1]["estimate"]
    assert one["input_rate"] == pytest.approx(10 * 20 * 2)  # out_0 * R_1 * W / 1
    assert ten["input_rate"] == pytest.approx(one["input_rate"] / 10)
    with pytest.raises(ValueError):
        explain(q, keys=0)


def test_push_down_off_moves_every_conjunct_to_the_final_node() -> None:
    q = "PATTERN SEQ(A a, B b, C c) WHERE a.x < 0.5 AND b.y < 0.25 WITHIN 100 ms"
    nodes = explain(compile_query(q, push_down=False), events=small_stream(3000))["plans"][0]["nodes"]
    assert [c["group"] for n in nodes for c in n["conjuncts"]] == ["emit_general", "emit_general"]
    assert nodes[1]["estimate"]["pass_probability"] == 1.0
    with pytest.raises(ValueError, match="skip_till_any_match"):
        compile_query(q + " STRATEGY skip_till_next_match", push_down=False)


@pytest.mark.parametrize("experiment", ["b", "c"])
def test_model_within_2x_on_the_plan_benchmark_streams(experiment: str) -> None:
    from bench.plans import WE, query_b, uniform_events

    if experiment == "b":
        text, events = query_b(), uniform_events("ABCD", 800, 12.0, 1_000_000, seed=4)
        est = dict(WE.values())
    else:
        text = "PATTERN SEQ(A a, B b) WHERE b.p1 = a.p1 AND b.p2 = a.p2 AND b.p3 = a.p3 WITHIN 1 s"
        events = uniform_events("AB", 5000, 4.0, 1_000_000, seed=5)
        est = {WE[k][0]: WE[k][1] for k in ("WE1", "WE2", "WE3")}
    for n in explain(compile_query(text, estimates=est), events=events)["plans"][0]["nodes"]:
        est_n, got = n["estimate"], n["measured"]
        assert got["output"] >= 20, n
        assert 0.5 <= est_n["input"] / got["input"] <= 2.0, n
        assert 0.5 <= est_n["output"] / got["output"] <= 2.0, n


def test_measured_estimates_feed_the_next_compile() -> None:
    from engine.nfa.explain import measured_estimates

    first = explain(compile_query(QUERY), events=small_stream(6000))
    est = measured_estimates(first)
    assert set(est) == set(TRUE_PASS)
    assert est["b.y < 0.25"] == pytest.approx(0.25, abs=0.05)
    node = explain(compile_query(QUERY, estimates=est))["plans"][0]["nodes"][1]
    assert [c["text"] for c in node["conjuncts"]] == ["b.y < 0.25", "b.x < 0.5"]


def test_a_tree_plan_is_named_and_still_measured() -> None:
    q = compile_query("PATTERN SEQ(A a, B b, C c) WHERE c.x < a.x PLAN tree WITHIN 100 ms")
    result = explain(q, events=small_stream(3000))
    assert result["plan_kind"] == "tree" and result["plans"][0]["tree"] in ("(a (b c))", "((a b) c)")
    nodes = result["plans"][0]["nodes"]
    assert nodes[-1]["measured"]["output"] == result["measured_matches"] > 0


def test_a_tree_plan_with_kleene_closure_and_negation_is_named_and_measured() -> None:
    text = "PATTERN SEQ(A a, !B n, C* c[], A d) WHERE d.x < a.x AND c[i].y < 0.3 AND n.x > a.x PLAN tree WITHIN 8 ms"
    q = compile_query(text, rates={"A": 1.0, "B": 1.0, "C": 1.0})
    events = small_stream(3000)
    result = explain(q, events=events)
    assert result["plan_kind"] == "tree"
    assert result["plans"][0]["tree"] == "(a d)" and result["plans"][1]["tree"] in ("(a (c d))", "((a c) d)")
    m = Matcher(q)  # measured on the NFA; the tree finds the same matches
    assert m.storage == "tree"
    assert len([x for e in events for x in m.push(e)] + m.flush()) == result["measured_matches"] > 0
