"""PARTITION BY and [attr] equivalence: sub-streams, missing attributes (semantics.md 1, 3.3)."""
from __future__ import annotations

from tests.engine.helpers import both_storages, expected, found, matcher, stream

AB = "PATTERN SEQ(A a, B b)"
INTERLEAVED = "a1{k=x} a2{k=y} b3{k=x} b4{k=y}"


@both_storages
def test_matches_never_mix_partition_keys(storage):
    assert found(AB + " PARTITION BY k", INTERLEAVED, storage=storage) == expected("a=1 b=3", "a=2 b=4")
    assert found(AB, INTERLEAVED, storage=storage) == expected("a=1 b=3", "a=1 b=4", "a=2 b=3", "a=2 b=4")


@both_storages
def test_partition_by_two_attributes_uses_the_pair(storage):
    q = AB + " PARTITION BY k, m"
    s = "a1{k=x,m=1} a2{k=x,m=2} b3{k=x,m=1} b4{k=y,m=2} b5{k=x,m=2}"
    assert found(q, s, storage=storage) == expected("a=1 b=3", "a=2 b=5")


@both_storages
def test_a_missing_partition_attribute_is_the_key_none(storage):
    s = "a1 a2{k=x} b3 b4{k=x} b5{m=x}"
    assert found(AB + " PARTITION BY k", s, storage=storage) == expected("a=1 b=3", "a=1 b=5", "a=2 b=4")


@both_storages
def test_partition_by_var_attr_means_the_attribute(storage):
    assert found(AB + " PARTITION BY a.k", INTERLEAVED, storage=storage) == expected("a=1 b=3", "a=2 b=4")


@both_storages
def test_partition_by_a_header_field(storage):
    q = "PATTERN SEQ(ANY(A, B) x, ANY(A, B) y) PARTITION BY type"
    assert found(q, "a1 b2 a3 b4", storage=storage) == expected("x=1 y=3", "x=2 y=4")


@both_storages
def test_state_is_kept_per_key(storage):
    m = matcher(AB + " PARTITION BY k", storage=storage)
    for e in stream("a1{k=x} a2{k=y} a3{k=x} a4"):
        m.push(e)
    assert m.stats()["keys"] == 3


@both_storages
def test_partition_applies_to_kleene_elements(storage):
    q = "PATTERN SEQ(A a, B+ b[], C c) PARTITION BY k"
    s = "a1{k=x} b2{k=x} b3{k=y} b4{k=x} c5{k=x}"
    assert found(q, s, storage=storage) == expected("a=1 b=2 c=5", "a=1 b=4 c=5", "a=1 b=2,4 c=5")


# ------------------------------------------------------------ [attr] equivalence


@both_storages
def test_equivalence_behaves_like_partition_by_under_any_match(storage):
    assert found(AB + " WHERE [k]", INTERLEAVED, storage=storage) == expected("a=1 b=3", "a=2 b=4")


@both_storages
def test_equivalence_applies_to_every_kleene_element(storage):
    q = "PATTERN SEQ(A a, B+ b[], C c) WHERE [k]"
    s = "a1{k=x} b2{k=x} b3{k=y} b4{k=x} c5{k=x}"
    assert found(q, s, storage=storage) == expected("a=1 b=2 c=5", "a=1 b=4 c=5", "a=1 b=2,4 c=5")


@both_storages
def test_equivalence_restricts_negated_events_to_the_same_value(storage):
    q = "PATTERN SEQ(A a, !B n, C c) WHERE [k]"
    assert found(q, "a1{k=x} b2{k=y} c3{k=x}", storage=storage) == expected("a=1 c=3")
    assert found(q, "a1{k=x} b2{k=x} c3{k=x}", storage=storage) == []


@both_storages
def test_equivalence_combines_with_partition_by(storage):
    q = AB + " WHERE [m] PARTITION BY k"
    s = "a1{k=x,m=1} a2{k=x,m=2} b3{k=x,m=2} b4{k=y,m=1}"
    assert found(q, s, storage=storage) == expected("a=2 b=3")


@both_storages
def test_equivalence_with_a_missing_attribute_groups_the_none_values(storage):
    assert found(AB + " WHERE [k]", "a1 b2 a3{k=x} b4{k=x}", storage=storage) == expected("a=1 b=2", "a=3 b=4")


def test_equivalence_is_not_a_partition_for_partition_contiguity():
    s = "a1{k=x} a2{k=y} b3{k=x}"
    # PARTITION BY k: a1 b3 are consecutive in the k=x sub-stream
    assert found(AB + " PARTITION BY k", s, strategy="partition_contiguity") == expected("a=1 b=3")
    # [k]: there is one sub-stream, the query stream, where a2 sits between a1 and b3
    assert found(AB + " WHERE [k]", s, strategy="partition_contiguity") == []


def test_equivalence_under_strict_contiguity_checks_values_of_consecutive_events():
    # unlike skip_till_any_match, events of other values still break the contiguity
    s = "a1{k=x} a2{k=y} b3{k=x} a4{k=y} b5{k=y}"
    assert found(AB + " WHERE [k]", s) == expected("a=1 b=3", "a=2 b=5", "a=4 b=5")
    assert found(AB + " WHERE [k]", s, strategy="strict_contiguity") == expected("a=4 b=5")
    assert found(AB + " PARTITION BY k", s, strategy="strict_contiguity") == expected("a=4 b=5")
    assert found(AB + " WHERE [k]", "a1{k=x} b2{k=y}", strategy="strict_contiguity") == []


def test_equivalence_under_skip_till_next_match_keeps_runs_per_value():
    q = "PATTERN SEQ(A a, B b, C c) WHERE [k] STRATEGY skip_till_next_match"
    s = "a1{k=x} a2{k=y} b3{k=y} b4{k=x} c5{k=x} c6{k=y}"
    assert found(q, s) == expected("a=1 b=4 c=5", "a=2 b=3 c=6")
