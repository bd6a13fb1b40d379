"""Event time: allowed lateness, reordering, late events, watermarks, flush (engine/matcher.py docstring)."""
from __future__ import annotations

import pytest

from engine.matcher import LateEventError
from tests.engine.helpers import S, both_storages, expected, found, labels, matcher, stream

ABC = "PATTERN SEQ(A a, B b, C c) WITHIN 10 s"
SORTED = "a1@1 b2@2 a3@3 c4@4 b5@5 c6@6"
SORTED_MATCHES = expected("a=1 b=2 c=4", "a=1 b=2 c=6", "a=1 b=5 c=6", "a=3 b=5 c=6")


def push_all(m, spec):
    out = []
    for e in stream(spec):
        out += m.push(e)
    return out


@both_storages
def test_out_of_order_events_within_lateness_give_the_sorted_matches(storage):
    assert found(ABC, SORTED, storage=storage) == SORTED_MATCHES
    shuffled = "a3@3 a1@1 b2@2 c6@6 c4@4 b5@5"
    assert found(ABC, shuffled, storage=storage, lateness=2 * S) == SORTED_MATCHES


@both_storages
def test_equal_timestamps_out_of_id_order_within_lateness_are_reordered(storage):
    q = "PATTERN SEQ(A x, A y)"
    assert found(q, "a2@5 a1@5 a3@9", storage=storage, lateness=1 * S) == expected("x=1 y=2", "x=1 y=3", "x=2 y=3")


@both_storages
def test_per_type_lateness(storage):
    m = matcher(ABC, storage=storage, lateness={"B": 2 * S})
    assert push_all(m, "a1@1 c3@3 b2@2") == []
    with pytest.raises(LateEventError):
        push_all(m, "a4@2")  # A has no lateness: 2 s is behind the newest ts 3 s
    assert labels(m.flush()) == expected("a=1 b=2 c=3")
    assert m.stats()["late"] == 1


@both_storages
def test_late_event_raises_with_a_reason_and_is_counted(storage):
    m = matcher(ABC, storage=storage, lateness=1 * S)
    push_all(m, "a1@1 b2@5")
    (late,) = stream("a3@3")
    with pytest.raises(LateEventError) as info:
        m.push(late)
    assert info.value.event is late
    assert info.value.reason.startswith("late event 3 (type A): ")
    assert "allowed lateness" in info.value.reason
    assert str(info.value) == info.value.reason
    assert m.stats()["late"] == 1
    assert isinstance(info.value, ValueError)


@both_storages
def test_a_late_event_changes_nothing(storage):
    m = matcher(ABC, storage=storage)
    out = push_all(m, "a1@1 b3@3")
    with pytest.raises(LateEventError):
        push_all(m, "a2@2")
    out += push_all(m, "c4@4")
    out += m.flush()
    assert labels(out) == expected("a=1 b=3 c=4")
    assert m.stats()["events"] == 3


@both_storages
def test_equal_timestamp_with_a_lower_id_after_a_processed_event_is_late(storage):
    m = matcher(ABC, storage=storage)
    push_all(m, "a2@5")
    (a1,) = stream("a1@5")
    with pytest.raises(LateEventError) as info:
        m.push(a1)
    assert "id order" in info.value.reason
    assert m.stats()["late"] == 1
    assert push_all(m, "a3@5") == []  # a higher id at the same ts is fine


@both_storages
def test_events_at_or_before_the_watermark_are_late(storage):
    m = matcher(ABC, storage=storage, lateness=10 * S)
    m.advance(5 * S)
    for spec in ("a1@5", "a2@4"):
        with pytest.raises(LateEventError) as info:
            push_all(m, spec)
        assert "watermark" in info.value.reason
    assert push_all(m, "a3@5000001us") == []
    assert m.stats()["late"] == 2


@both_storages
def test_buffered_events_wait_for_the_lateness_then_advance_releases_them(storage):
    m = matcher(ABC, storage=storage, lateness=5 * S)
    assert push_all(m, "a1@1 b2@2 c3@3") == []
    assert m.stats()["buffered"] == 3
    assert labels(m.advance(3 * S)) == expected("a=1 b=2 c=3")
    assert m.stats()["buffered"] == 0


@both_storages
def test_buffered_events_are_released_when_newer_events_pass_the_lateness(storage):
    m = matcher(ABC, storage=storage, lateness=5 * S)
    assert push_all(m, "a1@1 b2@2 c3@3") == []
    assert push_all(m, "a4@7.9") == []
    assert labels(push_all(m, "a5@8")) == expected("a=1 b=2 c=3")


@both_storages
def test_flush_emits_everything_and_leaves_no_state(storage):
    m = matcher("PATTERN SEQ(A a, B+ b[], C c) PARTITION BY k", storage=storage, lateness=2 * S)
    out = push_all(m, "a1@1{k=x} b2@2{k=x} a3@3{k=y} c4@4{k=x} b5@5{k=y}")
    assert m.stats()["live_partial_matches"] > 0
    out += m.flush()
    assert labels(out) == expected("a=1 b=2 c=4")
    stats = m.stats()
    assert (stats["live_partial_matches"], stats["keys"], stats["buffered"], stats["pending"]) == (0, 0, 0, 0)


def test_negative_lateness_is_rejected():
    with pytest.raises(ValueError):
        matcher(ABC, lateness=-1)
    with pytest.raises(ValueError):
        matcher(ABC, lateness={"A": -1})


def test_out_of_order_trailing_negation_within_lateness():
    q = "PATTERN SEQ(A a, B b, !N n) WITHIN 10 s"
    # n3 arrives after b4 but is within the lateness: it negates (a1, b2) only
    assert found(q, "a1@0 b2@1 b4@3 n3@2", lateness=5 * S) == expected("a=1 b=4")


def test_check_late_reports_without_counting_or_processing():
    from engine.compiler import compile_query
    from engine.events import Event
    from engine.matcher import Matcher

    m = Matcher(compile_query("PATTERN SEQ(A a, B b)"))
    m.push(Event(2, "A", 2_000_000))
    assert m.check_late(Event(3, "B", 3_000_000)) is None
    reason = m.check_late(Event(1, "B", 1_000_000))
    assert reason is not None and "allowed lateness" in reason
    assert m.stats()["late"] == 0 and m.stats()["events"] == 1
