"""WHERE: arithmetic, NOT/OR, strings, timestamps and durations, the null rules (semantics.md 3.3)."""
from __future__ import annotations

import pytest

from tests.engine.helpers import both_storages, expected, found

AB = "PATTERN SEQ(A a, B b)"


def ab(where: str, spec: str, storage: str = "chain") -> list[str]:
    """Matches of SEQ(A a, B b) WHERE <where>."""
    return found(f"{AB} WHERE {where}", spec, storage=storage)


@both_storages
def test_arithmetic_follows_precedence(storage):
    s = "a1{p=2} b2{p=7} b3{p=8}"
    assert ab("b.p = a.p * 3 + 1", s, storage) == expected("a=1 b=2")
    assert ab("b.p = a.p * (3 + 1)", s, storage) == expected("a=1 b=3")
    assert ab("b.p - a.p - 1 = 4", s, storage) == expected("a=1 b=2")
    assert ab("-a.p + b.p = 5", s, storage) == expected("a=1 b=2")
    assert ab("b.p = a.p - -6", s, storage) == expected("a=1 b=3")


@both_storages
def test_division_is_true_division(storage):
    s = "a1{p=2} b2{p=3} b3{p=4}"
    assert ab("b.p / a.p = 1.5", s, storage) == expected("a=1 b=2")
    assert ab("b.p / a.p = 1", s, storage) == []


@both_storages
def test_ints_and_floats_compare_as_numbers(storage):
    assert ab("a.p = b.p", "a1{p=1} b2{p=1.0} b3{p=1.5}", storage) == expected("a=1 b=2")
    assert ab("a.p < b.p", "a1{p=1} b2{p=1.0} b3{p=1.5}", storage) == expected("a=1 b=3")


@both_storages
def test_not_and_or(storage):
    s = "a1{p=1} a2{p=6} b3{p=1} b4{p=2}"
    assert ab("NOT a.p > 5", s, storage) == expected("a=1 b=3", "a=1 b=4")
    assert ab("a.p > 5 OR b.p = 1", s, storage) == expected("a=1 b=3", "a=2 b=3", "a=2 b=4")
    # NOT binds tighter than AND, AND tighter than OR
    assert ab("NOT a.p > 5 AND b.p = 2", s, storage) == expected("a=1 b=4")
    assert ab("a.p = 6 OR a.p = 1 AND b.p = 2", s, storage) == expected("a=1 b=4", "a=2 b=3", "a=2 b=4")
    assert ab("NOT (a.p = 6 OR b.p = 1)", s, storage) == expected("a=1 b=4")


@both_storages
def test_boolean_literals_and_attributes(storage):
    s = "a1{ok=true} a2{ok=false} b3"
    assert ab("a.ok = true", s, storage) == expected("a=1 b=3")
    assert ab("a.ok != TRUE", s, storage) == expected("a=2 b=3")
    assert ab("true", s, storage) == expected("a=1 b=3", "a=2 b=3")
    assert ab("FALSE", s, storage) == []


@both_storages
def test_string_comparisons(storage):
    s = "a1{s=abc} b2{s=abc} b3{s=abd} b4{s=ABC}"
    assert ab("a.s = b.s", s, storage) == expected("a=1 b=2")
    assert ab("a.s != b.s", s, storage) == expected("a=1 b=3", "a=1 b=4")
    assert ab("a.s < b.s", s, storage) == expected("a=1 b=3")  # Python order: 'ABC' < 'abc' < 'abd'
    assert ab("b.s >= 'abd'", s, storage) == expected("a=1 b=3")
    assert ab("b.s = \"ABC\"", s, storage) == expected("a=1 b=4")


@both_storages
def test_string_with_quotes_and_spaces(storage):
    assert ab("b.s = 'it\\'s x'", "a1 b2{s=\"it's x\"} b3{s=its}", storage) == expected("a=1 b=2")


@both_storages
def test_header_fields_id_and_type(storage):
    assert ab("a.id = 2", "a1 a2 b3", storage) == expected("a=2 b=3")
    assert ab("a.type = 'A' AND b.type = 'B'", "a1 b2", storage) == expected("a=1 b=2")


@both_storages
def test_timestamp_differences_with_durations(storage):
    s = "a1@0 b2@1.5 b3@2 b4@2.000001"
    assert ab("b.ts - a.ts >= 2 s", s, storage) == expected("a=1 b=3", "a=1 b=4")
    assert ab("b.ts - a.ts < 2 s", s, storage) == expected("a=1 b=2")
    assert ab("b.ts <= a.ts + 1500 ms", s, storage) == expected("a=1 b=2")
    assert ab("b.ts - a.ts = 2000001 us", s, storage) == expected("a=1 b=4")
    assert ab("b.ts - a.ts > 2000000", s, storage) == expected("a=1 b=4")


@both_storages
def test_a_comparison_with_a_missing_attribute_is_false(storage):
    s = "a1 b2{p=1}"
    for op in ("=", "!=", "<", "<=", ">", ">="):
        assert ab(f"a.p {op} b.p", s, storage) == [], op
    assert ab("a.p = a.p", s, storage) == []


@both_storages
def test_not_of_a_comparison_with_a_missing_attribute_is_true(storage):
    s = "a1 b2{p=1}"
    assert ab("NOT a.p > 1", s, storage) == expected("a=1 b=2")
    assert ab("NOT a.p = b.p", s, storage) == expected("a=1 b=2")
    assert ab("a.p > 1 OR b.p = 1", s, storage) == expected("a=1 b=2")


@both_storages
def test_arithmetic_on_a_missing_attribute_makes_the_comparison_false(storage):
    s = "a1 b2{p=1}"
    assert ab("a.p + 1 > 0", s, storage) == []
    assert ab("NOT a.p + 1 > 0", s, storage) == expected("a=1 b=2")


@both_storages
def test_comparing_a_string_with_a_number_is_false_except_for_not_equal(storage):
    s = "a1{p=x} b2{p=1}"
    for op in ("=", "<", "<=", ">", ">="):
        assert ab(f"a.p {op} b.p", s, storage) == [], op
    assert ab("a.p != b.p", s, storage) == expected("a=1 b=2")
    assert ab("NOT a.p = b.p", s, storage) == expected("a=1 b=2")


@both_storages
def test_division_by_zero_makes_the_comparison_false(storage):
    s = "a1{p=1} b2{z=0} b3{z=2}"
    assert ab("a.p / b.z > 0", s, storage) == expected("a=1 b=3")
    assert ab("a.p / b.z != 7", s, storage) == expected("a=1 b=3")
    assert ab("NOT a.p / b.z > 0", s, storage) == expected("a=1 b=2")


@both_storages
def test_conjuncts_are_checked_on_every_plan_component(storage):
    q = "PATTERN SEQ(A a, B b, C c) WHERE a.p < b.p AND b.p < c.p AND c.p - a.p <= 10"
    s = "a1{p=1} b2{p=5} b3{p=0} c4{p=8} c5{p=20}"
    assert found(q, s, storage=storage) == expected("a=1 b=2 c=4")


@pytest.mark.parametrize("strategy", ["skip_till_next_match", "strict_contiguity", "partition_contiguity"])
def test_null_rules_are_the_same_under_every_strategy(strategy):
    s = "a1 b2{p=1}"
    assert found(f"{AB} WHERE a.p = b.p", s, strategy=strategy) == []
    assert found(f"{AB} WHERE NOT a.p = b.p", s, strategy=strategy) == expected("a=1 b=2")
    assert found(f"{AB} WHERE b.p / a.q > 0", "a1{q=0} b2{p=1}", strategy=strategy) == []
