"""Kleene closures: B+ and B*, b[i] / b[i-1] / b[1] / b[last] / b[k], Kleene at either end (semantics.md 2-4)."""
from __future__ import annotations

import sys

from tests.engine.helpers import S, both_storages, expected, found, labels, matcher, run, stream

ABC = "PATTERN SEQ(A a, B+ b[], C c)"
# a: p=5; b2..b4 with p = 1, 3, 2
PRICES = "a1{p=5} b2{p=1} b3{p=3} b4{p=2} c5"


@both_storages
def test_plus_takes_every_non_empty_subset_under_any_match(storage):
    assert found(ABC, "a1 b2 b3 b4 c5", storage=storage) == expected(
        "a=1 b=2 c=5", "a=1 b=3 c=5", "a=1 b=4 c=5",
        "a=1 b=2,3 c=5", "a=1 b=2,4 c=5", "a=1 b=3,4 c=5",
        "a=1 b=2,3,4 c=5",
    )


@both_storages
def test_plus_needs_at_least_one_element(storage):
    assert found(ABC, "a1 c2", storage=storage) == []


@both_storages
def test_star_matches_with_and_without_elements(storage):
    q = "PATTERN SEQ(A a, B* b[], C c)"
    assert found(q, "a1 c2", storage=storage) == expected("a=1 c=2")
    assert found(q, "a1 b2 c3", storage=storage) == expected("a=1 c=3", "a=1 b=2 c=3")


@both_storages
def test_an_empty_star_variable_is_listed_with_no_ids(storage):
    (m,) = run("PATTERN SEQ(A a, B* b[], C c)", "a1 c2", storage=storage)
    assert m.ids() == {"a": [1], "b": [], "c": [2]}
    assert m.events["b"] == ()
    assert m.key() == frozenset({("a", (1,)), ("c", (2,))})


@both_storages
def test_b_i_condition_must_hold_for_every_element(storage):
    q = ABC + " WHERE b[i].p >= 2"
    assert found(q, PRICES, storage=storage) == expected("a=1 b=3 c=5", "a=1 b=4 c=5", "a=1 b=3,4 c=5")


@both_storages
def test_b_i_minus_1_condition_applies_from_the_second_element(storage):
    q = ABC + " WHERE b[i].p > b[i-1].p"
    # every singleton; pairs and triples only when p increases: (2,3) 1<3, (2,4) 1<2
    assert found(q, PRICES, storage=storage) == expected(
        "a=1 b=2 c=5", "a=1 b=3 c=5", "a=1 b=4 c=5", "a=1 b=2,3 c=5", "a=1 b=2,4 c=5"
    )


@both_storages
def test_b_i_and_b_i_minus_1_conditions_combine(storage):
    q = ABC + " WHERE b[i].p > b[i-1].p AND b[i].p >= 2"
    assert found(q, PRICES, storage=storage) == expected("a=1 b=3 c=5", "a=1 b=4 c=5")


@both_storages
def test_b_i_may_be_compared_with_a_single_variable(storage):
    q = ABC + " WHERE b[i].p < a.p AND b[i].p > 1"
    assert found(q, PRICES, storage=storage) == expected("a=1 b=3 c=5", "a=1 b=4 c=5", "a=1 b=3,4 c=5")


@both_storages
def test_b_1_is_the_first_element(storage):
    q = ABC + " WHERE b[1].p = 1"
    assert found(q, PRICES, storage=storage) == expected(
        "a=1 b=2 c=5", "a=1 b=2,3 c=5", "a=1 b=2,4 c=5", "a=1 b=2,3,4 c=5"
    )


@both_storages
def test_b_last_is_the_last_element(storage):
    q = ABC + " WHERE b[last].p = 2"
    assert found(q, PRICES, storage=storage) == expected(
        "a=1 b=4 c=5", "a=1 b=2,4 c=5", "a=1 b=3,4 c=5", "a=1 b=2,3,4 c=5"
    )


@both_storages
def test_b_k_is_the_kth_element(storage):
    q = ABC + " WHERE b[2].p = 3"
    assert found(q, PRICES, storage=storage) == expected("a=1 b=2,3 c=5", "a=1 b=2,3,4 c=5")


@both_storages
def test_b_k_beyond_the_length_makes_a_plain_comparison_false(storage):
    q = ABC + " WHERE b[2].p != 3"
    assert found(q, PRICES, storage=storage) == expected("a=1 b=2,4 c=5", "a=1 b=3,4 c=5")


@both_storages
def test_a_conjunct_with_b_k_beyond_the_length_is_false_even_under_not(storage):
    q = ABC + " WHERE NOT b[2].p = 3"
    # singletons have no b[2]: the whole conjunct is false (not just the comparison)
    assert found(q, PRICES, storage=storage) == expected("a=1 b=2,4 c=5", "a=1 b=3,4 c=5")


@both_storages
def test_kleene_at_the_start(storage):
    q = "PATTERN SEQ(B+ b[], C c)"
    assert found(q, "b1 b2 c3", storage=storage) == expected("b=1 c=3", "b=2 c=3", "b=1,2 c=3")


@both_storages
def test_trailing_kleene_emits_a_match_on_each_element(storage):
    m = matcher("PATTERN SEQ(A a, B+ b[])", storage=storage)
    a1, b2, b3 = stream("a1 b2 b3")
    assert m.push(a1) == []
    assert labels(m.push(b2)) == expected("a=1 b=2")
    assert labels(m.push(b3)) == expected("a=1 b=3", "a=1 b=2,3")
    assert m.flush() == []


@both_storages
def test_trailing_star_emits_the_empty_match_on_the_first_component(storage):
    m = matcher("PATTERN SEQ(A a, B* b[])", storage=storage)
    a1, b2 = stream("a1 b2")
    assert labels(m.push(a1)) == expected("a=1")
    assert labels(m.push(b2)) == expected("a=1 b=2")


@both_storages
def test_two_adjacent_kleene_closures(storage):
    q = "PATTERN SEQ(B+ b[], C+ c[])"
    assert found(q, "b1 b2 c3 c4", storage=storage) == expected(
        *(f"b={b} c={c}" for b in ("1", "2", "1,2") for c in ("3", "4", "3,4"))
    )


@both_storages
def test_kleene_followed_by_a_single_of_the_same_type(storage):
    # c must come after every element of b; all are B
    q = "PATTERN SEQ(A a, B+ b[], B c)"
    assert found(q, "a1 b2 b3 b4", storage=storage) == expected(
        "a=1 b=2 c=3", "a=1 b=2 c=4", "a=1 b=3 c=4", "a=1 b=2,3 c=4"
    )


def test_long_kleene_under_skip_till_next_match_completes():
    n = 1000
    events = stream("a1@0 " + " ".join(f"b{i}@{i}us" for i in range(2, n + 2)) + f" c{n + 2}@{n + 2}us")
    (m,) = run(ABC + " STRATEGY skip_till_next_match RETURN count(b) AS n", events)
    assert m.ids() == {"a": [1], "b": list(range(2, n + 2)), "c": [n + 2]}
    assert m.fields == {"n": n}
    assert n > sys.getrecursionlimit() // 2  # deep enough to catch per-element recursion


def test_long_trailing_kleene_under_skip_till_next_match_emits_each_prefix():
    n = 200
    events = stream("a1 " + " ".join(f"b{i}" for i in range(2, n + 2)))
    out = run("PATTERN SEQ(A a, B+ b[]) STRATEGY skip_till_next_match WITHIN 1 d", events)
    assert [m.ids()["b"] for m in out] == [list(range(2, k + 1)) for k in range(2, n + 2)]
    assert out[-1].end - out[-1].start == n * S
