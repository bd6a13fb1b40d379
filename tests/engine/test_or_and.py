"""OR, AND and their nesting: linear plans, conjuncts of absent variables, duplicates (semantics.md 2, 3.3)."""
from __future__ import annotations

from tests.engine.helpers import both_storages, expected, found, run


@both_storages
def test_or_matches_either_alternative(storage):
    q = "PATTERN SEQ(A a, OR(B b, C c), D d)"
    assert found(q, "a1 b2 c3 d4", storage=storage) == expected("a=1 b=2 d=4", "a=1 c=3 d=4")


@both_storages
def test_or_branch_not_taken_lists_its_variable_with_no_ids(storage):
    (m,) = run("PATTERN SEQ(A a, OR(B b, C c))", "a1 c2", storage=storage)
    assert m.ids() == {"a": [1], "b": [], "c": [2]}


@both_storages
def test_conjuncts_on_the_absent_branch_are_ignored(storage):
    q = "PATTERN SEQ(A a, OR(B b, C c), D d) WHERE b.p = 1 AND c.p = 2"
    s = "a1 b2{p=1} c3{p=1} b4{p=2} c5{p=2} d6"
    assert found(q, s, storage=storage) == expected("a=1 b=2 d=6", "a=1 c=5 d=6")


@both_storages
def test_conjunct_mentioning_both_branches_is_ignored_in_each(storage):
    q = "PATTERN SEQ(A a, OR(B b, C c)) WHERE b.p = c.p"
    assert found(q, "a1 b2{p=1} c3{p=2}", storage=storage) == expected("a=1 b=2", "a=1 c=3")


@both_storages
def test_only_top_level_and_parts_are_ignored_for_absent_variables(storage):
    # one conjunct (an OR) mentions b and c: in the b branch it is ignored as a whole
    q = "PATTERN SEQ(A a, OR(B b, C c)) WHERE (a.p = 1 OR c.p = 1) AND a.p > 0"
    assert found(q, "a1{p=2} b2 c3{p=1}", storage=storage) == expected("a=1 b=2", "a=1 c=3")


@both_storages
def test_or_alternatives_may_reuse_a_variable(storage):
    q = "PATTERN SEQ(A a, OR(B x, C x)) WHERE x.p > 0"
    assert found(q, "a1 b2{p=1} c3{p=1} c4{p=0}", storage=storage) == expected("a=1 x=2", "a=1 x=3")


@both_storages
def test_or_of_sequences(storage):
    q = "PATTERN OR(SEQ(A a, B b), SEQ(C c, D d))"
    assert found(q, "a1 c2 b3 d4", storage=storage) == expected("a=1 b=3", "c=2 d=4")


@both_storages
def test_negation_inside_an_or_branch_only_applies_to_that_branch(storage):
    q = "PATTERN SEQ(A a, OR(SEQ(!N n, B b), C c))"
    assert found(q, "a1 n2 b3 c4", storage=storage) == expected("a=1 c=4")


@both_storages
def test_negation_conjunct_mentioning_an_absent_variable_is_ignored(storage):
    q = "PATTERN SEQ(A a, OR(B b, C c), !N n, D d) WHERE n.p = b.p"
    # b branch: n3 (p=1) = b2.p negates; c branch: the conjunct is ignored, so every N negates
    assert found(q, "a1 b2{p=1} n3{p=1} d4", storage=storage) == []
    assert found(q, "a1 b2{p=1} n3{p=2} d4", storage=storage) == expected("a=1 b=2 d=4")
    assert found(q, "a1 c2 n3{p=2} d4", storage=storage) == []


@both_storages
def test_and_matches_in_any_order(storage):
    q = "PATTERN AND(A a, B b)"
    assert found(q, "a1 b2", storage=storage) == expected("a=1 b=2")
    assert found(q, "b1 a2", storage=storage) == expected("a=2 b=1")
    assert found(q, "a1 b2 a3", storage=storage) == expected("a=1 b=2", "a=3 b=2")


@both_storages
def test_and_of_three_takes_every_permutation(storage):
    q = "PATTERN AND(A a, B b, C c)"
    assert found(q, "c1 a2 b3", storage=storage) == expected("a=2 b=3 c=1")
    assert found(q, "b1 c2 a3 b4", storage=storage) == expected("a=3 b=1 c=2", "a=3 b=4 c=2")


@both_storages
def test_and_moves_a_kleene_part_as_one_block(storage):
    # b1 and b3 cannot form one b around a2: each interleaving keeps B+ contiguous in the plan
    q = "PATTERN AND(A a, B+ b[])"
    assert found(q, "b1 a2 b3", storage=storage) == expected("a=2 b=1", "a=2 b=3")


@both_storages
def test_and_keeps_the_order_inside_a_seq_part(storage):
    q = "PATTERN AND(SEQ(A a, B b), C c)"
    assert found(q, "c1 a2 b3", storage=storage) == expected("a=2 b=3 c=1")
    assert found(q, "a1 c2 b3", storage=storage) == expected("a=1 b=3 c=2")
    assert found(q, "b1 a2 c3", storage=storage) == []


@both_storages
def test_nested_seq_and_or(storage):
    q = "PATTERN SEQ(A a, AND(B b, OR(C c, D d)), E e)"
    assert found(q, "a1 d2 b3 c4 e5", storage=storage) == expected("a=1 b=3 c=4 e=5", "a=1 b=3 d=2 e=5")
    assert found(q, "d1 a2 b3 e4", storage=storage) == []


@both_storages
def test_same_match_from_two_plans_is_reported_once(storage):
    # SEQ(A, D) is a plan of both stars (each without its component)
    q = "PATTERN SEQ(A a, OR(B* b[], C* c[]), D d)"
    assert found(q, "a1 d2", storage=storage) == expected("a=1 d=2")
    assert found(q, "a1 b2 c3 d4", storage=storage) == expected("a=1 d=4", "a=1 b=2 d=4", "a=1 c=3 d=4")


@both_storages
def test_identical_or_branches_report_each_match_once(storage):
    q = "PATTERN SEQ(OR(A x, A x), B b)"
    assert found(q, "a1 a2 b3", storage=storage) == expected("x=1 b=3", "x=2 b=3")


@both_storages
def test_overlapping_or_branches_report_each_match_once(storage):
    q = "PATTERN SEQ(OR(A x, ANY(A, C) x), B b)"
    assert found(q, "a1 c2 b3", storage=storage) == expected("x=1 b=3", "x=2 b=3")


def test_or_under_skip_till_next_match_runs_per_plan():
    q = "PATTERN SEQ(A a, OR(B b, C c)) STRATEGY skip_till_next_match"
    assert found(q, "a1 c2 b3") == expected("a=1 c=2", "a=1 b=3")


def test_and_under_strict_contiguity():
    q = "PATTERN AND(A a, B b) STRATEGY strict_contiguity"
    assert found(q, "a1 a2 b3 b4 a5") == expected("a=2 b=3", "a=5 b=4")


@both_storages
def test_negation_in_an_and_part_spans_the_neighbours_of_each_interleaving(storage):
    # plans: C,A,!N,B / A,C,!N,B / A,!N,C,B / A,!N,B,C: the negation stays in place, between
    # whatever components the interleaving puts around it
    q = "PATTERN AND(SEQ(A a, !N n, B b), C c)"
    assert found(q, "a1 c2 n3 b4 a5 b6", storage=storage) == expected(
        "a=1 b=4 c=2", "a=1 b=6 c=2", "a=5 b=6 c=2"
    )
