"""Selection strategies: any match, next match (SASE+ runs), strict and partition contiguity (semantics.md 4)."""
from __future__ import annotations

import pytest

from tests.engine.helpers import STORAGES, expected, found, labels, matcher, stream

ABC = "PATTERN SEQ(A a, B b, C c)"
# one stream, four strategies
STREAM = "a1 b2 c3 a4 b5 b6 c7"
BY_STRATEGY = {
    "skip_till_any_match": expected(
        "a=1 b=2 c=3", "a=1 b=2 c=7", "a=1 b=5 c=7", "a=1 b=6 c=7", "a=4 b=5 c=7", "a=4 b=6 c=7"
    ),
    # run a1: b2, c3 -> emits and ends; run a4: b5, then b6 is skipped (waiting for C), c7
    "skip_till_next_match": expected("a=1 b=2 c=3", "a=4 b=5 c=7"),
    # a4 b5 c7 has b6 in between; a4 b6 c7 has b5 in between
    "strict_contiguity": expected("a=1 b=2 c=3"),
    "partition_contiguity": expected("a=1 b=2 c=3"),
}


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("strategy", list(BY_STRATEGY))
def test_four_strategies_on_one_stream(strategy, storage):
    assert found(ABC, STREAM, strategy=strategy, storage=storage) == BY_STRATEGY[strategy]
    assert found(ABC + f" STRATEGY {strategy}", STREAM, storage=storage) == BY_STRATEGY[strategy]


def test_strategy_override_replaces_the_query_strategy():
    q = ABC + " STRATEGY strict_contiguity"
    assert found(q, STREAM, strategy="skip-till-next-match") == BY_STRATEGY["skip_till_next_match"]
    assert found(q, STREAM, strategy="SKIP_TILL_ANY_MATCH") == BY_STRATEGY["skip_till_any_match"]


# ------------------------------------------------------------ skip_till_next_match: bench definitions

NEXT = " PARTITION BY k STRATEGY skip_till_next_match WITHIN 1 s"


def test_next_match_p1_takes_the_first_b_after_a_then_the_first_c_after_that_b():
    q = "PATTERN SEQ(A a, B b, C c)" + NEXT
    assert found(q, "a1@0.1 b2@0.2 b3@0.3 c4@0.4 c5@0.5") == expected("a=1 b=2 c=4")


def test_next_match_p1_keeps_one_run_per_a():
    q = "PATTERN SEQ(A a, B b, C c)" + NEXT
    assert found(q, "a1@0.1 a2@0.2 b3@0.3 c4@0.4") == expected("a=1 b=3 c=4", "a=2 b=3 c=4")


def test_next_match_p1_keeps_runs_per_key():
    q = "PATTERN SEQ(A a, B b, C c)" + NEXT
    s = "a1@0.1{k=x} a2@0.2{k=y} b3@0.3{k=y} b4@0.4{k=x} c5@0.5{k=x} c6@0.6{k=y}"
    assert found(q, s) == expected("a=1 b=4 c=5", "a=2 b=3 c=6")


def test_next_match_p2_takes_all_b_from_the_first_b_up_to_the_first_c():
    q = "PATTERN SEQ(A a, B+ b[], C c)" + NEXT
    assert found(q, "a1@0.1 b2@0.2 b3@0.3 c4@0.4 b5@0.5 c6@0.6") == expected("a=1 b=2,3 c=4")


def test_next_match_p3_pairs_a_with_the_first_c_if_no_b_between():
    q = "PATTERN SEQ(A a, !B n, C c)" + NEXT
    assert found(q, "a1@0.1 c2@0.2 c3@0.3") == expected("a=1 c=2")
    # the run of a1 dies at c3 (b2 between); a4 pairs with c5 only
    assert found(q, "a1@0.1 b2@0.2 c3@0.3 a4@0.4 c5@0.5 c6@0.6") == expected("a=4 c=5")


def test_next_match_p4_takes_the_first_b_cheaper_than_a_then_the_first_c():
    q = "PATTERN SEQ(A a, B b, C c) WHERE b.price < a.price" + NEXT
    s = "a1@0.1{price=10} b2@0.2{price=12} b3@0.3{price=8} b4@0.4{price=5} c5@0.5 c6@0.6"
    assert found(q, s) == expected("a=1 b=3 c=5")
    assert found(q, s, strategy="skip_till_any_match") == expected(
        "a=1 b=3 c=5", "a=1 b=3 c=6", "a=1 b=4 c=5", "a=1 b=4 c=6"
    )


def test_next_match_run_dies_when_the_window_is_exceeded():
    q = "PATTERN SEQ(A a, B b, C c)" + NEXT
    assert found(q, "a1@0 b2@0.5 c3@1.5 a4@2 b5@2.5 c6@3") == expected("a=4 b=5 c=6")


# ------------------------------------------------------------ skip_till_next_match: Kleene


def test_next_match_kleene_branches_when_take_and_proceed_both_apply():
    # b3 can be appended to b (take) or bind c (proceed): the run splits; same for b4
    q = "PATTERN SEQ(A a, B+ b[], B c) STRATEGY skip_till_next_match"
    assert found(q, "a1 b2 b3 b4") == expected("a=1 b=2 c=3", "a=1 b=2,3 c=4")


def test_next_match_kleene_skips_elements_that_fail_b_i_conditions():
    q = "PATTERN SEQ(A a, B+ b[], C c) WHERE b[i].p > b[i-1].p STRATEGY skip_till_next_match"
    assert found(q, "a1 b2{p=1} b3{p=3} b4{p=2} b5{p=4} c6") == expected("a=1 b=2,3,5 c=6")


def test_next_match_proceed_checks_b_last_conditions():
    q = "PATTERN SEQ(A a, B+ b[], C c) WHERE c.p > b[last].p"
    s = "a1 b2{p=5} c3{p=3} b4{p=1} c5{p=2}"
    # c3 cannot proceed (3 <= 5) and is skipped; b4 is taken; c5 proceeds
    assert found(q, s, strategy="skip_till_next_match") == expected("a=1 b=2,4 c=5")
    assert found(q, s) == expected("a=1 b=4 c=5", "a=1 b=2,4 c=5")


def test_next_match_trailing_kleene_emits_on_each_taken_element():
    q = "PATTERN SEQ(A a, B+ b[]) STRATEGY skip_till_next_match"
    m = matcher(q)
    a1, b2, c3, b4 = stream("a1 b2 c3 b4")
    assert m.push(a1) == []
    assert labels(m.push(b2)) == expected("a=1 b=2")
    assert m.push(c3) == []
    assert labels(m.push(b4)) == expected("a=1 b=2,4")


def test_next_match_negation_failing_kills_the_run():
    # b2 negates c3 (n.p = c.p): the run of a1 dies there and does not wait for c4
    q = "PATTERN SEQ(A a, !B n, C c) WHERE n.p = c.p"
    s = "a1 b2{p=1} c3{p=1} c4{p=2}"
    assert found(q, s, strategy="skip_till_next_match") == []
    assert found(q, s) == expected("a=1 c=4")


def test_next_match_a_new_run_does_not_see_the_event_that_created_it():
    q = "PATTERN SEQ(A x, A y) STRATEGY skip_till_next_match"
    assert found(q, "a1 a2 a3") == expected("x=1 y=2", "x=2 y=3")


def test_next_match_trailing_negation_holds_the_match_until_the_window_closes():
    q = "PATTERN SEQ(A a, B b, !N n) STRATEGY skip_till_next_match WITHIN 10 s"
    assert found(q, "a1@0 b2@1 n3@10 a4@20 b5@21 n6@31") == expected("a=4 b=5")


# ------------------------------------------------------------ contiguity


def test_strict_contiguity_counts_every_key_but_partition_contiguity_only_the_match_key():
    s = "a1{k=x} a2{k=y} b3{k=x} b4{k=y} c5{k=x} c6{k=y}"
    q = ABC + " PARTITION BY k"
    assert found(q, s, strategy="strict_contiguity") == []
    assert found(q, s, strategy="partition_contiguity") == expected("a=1 b=3 c=5", "a=2 b=4 c=6")
    assert found(q, s, strategy="skip_till_any_match") == expected("a=1 b=3 c=5", "a=2 b=4 c=6")


def test_strict_contiguity_with_keys_that_do_not_interleave():
    s = "a1{k=x} b2{k=x} c3{k=x} a4{k=y} b5{k=y} c6{k=y}"
    q = ABC + " PARTITION BY k"
    assert found(q, s, strategy="strict_contiguity") == expected("a=1 b=2 c=3", "a=4 b=5 c=6")
    assert found(q, s, strategy="partition_contiguity") == expected("a=1 b=2 c=3", "a=4 b=5 c=6")


def test_partition_contiguity_without_partition_by_is_strict_contiguity():
    s = "a1 b2 c3 a4 x5 b6 a7 c8"
    assert found(ABC, s, strategy="partition_contiguity") == expected("a=1 b=2 c=3")
    assert found(ABC, s, strategy="strict_contiguity") == expected("a=1 b=2 c=3")


def test_strict_contiguity_kleene_takes_consecutive_runs_only():
    q = "PATTERN SEQ(A a, B+ b[], C c) STRATEGY strict_contiguity"
    assert found(q, "a1 b2 b3 c4") == expected("a=1 b=2,3 c=4")
    assert found(q, "a1 b2 a3 b4 c5") == expected("a=3 b=4 c=5")


def test_strict_contiguity_negated_types_are_in_the_query_stream():
    # n2 does not negate (p != 1) but it is a query-stream event between a1 and c3
    q = "PATTERN SEQ(A a, !N n, C c) WHERE n.p = 1"
    assert found(q, "a1 n2{p=2} c3", strategy="strict_contiguity") == []
    assert found(q, "a1 n2{p=2} c3") == expected("a=1 c=3")


def test_strict_contiguity_with_a_star_that_took_nothing():
    q = "PATTERN SEQ(A a, B* b[], C c) STRATEGY strict_contiguity"
    assert found(q, "a1 c2 a3 b4 c5") == expected("a=1 c=2", "a=3 b=4 c=5")


def test_strict_contiguity_still_checks_trailing_negation_over_the_window():
    q = "PATTERN SEQ(A a, B b, !N n) STRATEGY strict_contiguity WITHIN 10 s"
    assert found(q, "a1@0 b2@1 n3@10") == []
    assert found(q, "a1@0 b2@1 n3@11") == expected("a=1 b=2")


def test_strict_contiguity_where_conditions_filter_after_contiguity():
    # a1 b2 c3 is contiguous but fails the condition; a1 b2 c4 is not contiguous
    q = "PATTERN SEQ(A a, B b, C c) WHERE c.p = 1 STRATEGY strict_contiguity"
    assert found(q, "a1 b2 c3{p=2} c4{p=1}") == []


def test_strict_contiguity_trailing_kleene_emits_each_consecutive_prefix():
    q = "PATTERN SEQ(A a, B+ b[]) STRATEGY strict_contiguity"
    assert found(q, "a1 b2 b3 a4 b5") == expected("a=1 b=2", "a=1 b=2,3", "a=4 b=5")


def test_next_match_star_runs_once_per_plan():
    # plans SEQ(A, C) and SEQ(A, B+, C) keep their own runs
    q = "PATTERN SEQ(A a, B* b[], C c) STRATEGY skip_till_next_match"
    assert found(q, "a1 c2 a3 b4 c5") == expected("a=1 c=2", "a=3 c=5", "a=1 b=4 c=5", "a=3 b=4 c=5")


def test_next_match_b_i_condition_on_a_later_component_is_checked_at_proceed():
    # b takes b2, b3, b4; c5 cannot proceed because b3.p >= c5.p, and nothing else comes
    q = "PATTERN SEQ(A a, B+ b[], C c) WHERE b[i].p < c.p"
    s = "a1 b2{p=1} b3{p=5} b4{p=2} c5{p=3}"
    assert found(q, s, strategy="skip_till_next_match") == []
    assert found(q, s) == expected("a=1 b=2 c=5", "a=1 b=4 c=5", "a=1 b=2,4 c=5")
