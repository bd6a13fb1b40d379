"""WITHIN: the inclusive window, no window, expiry of partial matches, advance() (semantics.md 3.1)."""
from __future__ import annotations

import pytest

from engine.matcher import LateEventError
from tests.engine.helpers import S, both_storages, expected, found, labels, matcher, stream

AB = "PATTERN SEQ(A a, B b)"
AB10 = AB + " WITHIN 10 s"


@both_storages
def test_window_is_inclusive(storage):
    assert found(AB10, "a1@0 b2@10", storage=storage) == expected("a=1 b=2")
    assert found(AB10, "a1@0 b2@10000001us", storage=storage) == []
    assert found(AB10, "a1@0 a2@0.5 b3@10.5", storage=storage) == expected("a=2 b=3")


@both_storages
def test_window_units_are_converted_to_microseconds(storage):
    assert found(AB + " WITHIN 1500 ms", "a1@0 b2@1.5", storage=storage) == expected("a=1 b=2")
    assert found(AB + " WITHIN 1500 ms", "a1@0 b2@1500001us", storage=storage) == []
    assert found(AB + " WITHIN 1 min", "a1@0 b2@60 b3@61", storage=storage) == expected("a=1 b=2")


@both_storages
def test_window_spans_from_the_first_to_the_last_bound_event(storage):
    q = "PATTERN SEQ(A a, B+ b[], C c) WITHIN 10 s"
    assert found(q, "a1@0 b2@5 b3@9 c4@10 c5@11", storage=storage) == expected(
        "a=1 b=2 c=4", "a=1 b=3 c=4", "a=1 b=2,3 c=4"
    )


@both_storages
def test_window_bounds_a_trailing_kleene(storage):
    q = "PATTERN SEQ(A a, B+ b[]) WITHIN 5 s"
    assert found(q, "a1@0 b2@3 b3@6", storage=storage) == expected("a=1 b=2")


@both_storages
def test_window_bounds_a_leading_kleene(storage):
    q = "PATTERN SEQ(B+ b[], C c) WITHIN 5 s"
    assert found(q, "b1@0 b2@3 c3@6", storage=storage) == expected("b=2 c=3")


@both_storages
def test_no_window_matches_across_any_distance(storage):
    assert found(AB, "a1@0 b2@1000000000", storage=storage) == expected("a=1 b=2")


@both_storages
def test_partial_matches_expire_after_events_far_in_the_future(storage):
    m = matcher(AB10, storage=storage)
    for e in stream(" ".join(f"a{i}@{i}" for i in range(1, 21))):
        m.push(e)
    before = m.stats()["live_partial_matches"]
    assert before >= 20
    (late_b,) = stream("b21@1000")
    assert m.push(late_b) == []
    assert m.stats()["live_partial_matches"] < before
    assert m.stats()["live_partial_matches"] <= 1


@both_storages
def test_partial_matches_expire_per_key(storage):
    m = matcher(AB10 + " PARTITION BY k", storage=storage)
    for e in stream(" ".join(f"a{i}@{i}{{k=k{i}}}" for i in range(1, 21))):
        m.push(e)
    assert m.stats()["keys"] == 20
    (far,) = stream("a99@1000{k=other}")
    m.push(far)
    assert m.stats()["keys"] <= 1
    assert m.stats()["live_partial_matches"] <= 1


@both_storages
def test_advance_far_ahead_drops_every_partial_match(storage):
    m = matcher(AB10, storage=storage)
    for e in stream("a1@0 a2@1 a3@2"):
        m.push(e)
    assert m.stats()["live_partial_matches"] > 0
    assert m.advance(100 * S) == []
    assert m.stats()["live_partial_matches"] == 0
    assert m.stats()["keys"] == 0


@both_storages
def test_advance_inside_the_window_keeps_partial_matches(storage):
    m = matcher(AB10, storage=storage)
    a1, b2 = stream("a1@0 b2@10")
    m.push(a1)
    assert m.advance(10 * S - 1) == []
    assert labels(m.push(b2)) == expected("a=1 b=2")


@both_storages
def test_advance_makes_events_at_or_before_the_watermark_late(storage):
    m = matcher(AB10, storage=storage)
    a1, b2, b3 = stream("a1@0 b2@10 b3@10000001us")
    m.push(a1)
    m.advance(10 * S)
    with pytest.raises(LateEventError):
        m.push(b2)
    assert m.push(b3) == []


@both_storages
def test_advance_does_not_emit_matches_without_trailing_negation(storage):
    m = matcher(AB10, storage=storage)
    a1, b2 = stream("a1@0 b2@1")
    m.push(a1)
    assert labels(m.push(b2)) == expected("a=1 b=2")
    assert m.advance(100 * S) == []
    assert m.flush() == []


def test_advance_never_moves_the_watermark_back():
    m = matcher(AB10)
    m.advance(10 * S)
    assert m.advance(5 * S) == []
    (a1,) = stream("a1@7")
    with pytest.raises(LateEventError):
        m.push(a1)
