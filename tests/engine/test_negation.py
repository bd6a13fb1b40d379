"""Negation: between components, with conditions, several, trailing, per partition (semantics.md 3.5)."""
from __future__ import annotations

from tests.engine.helpers import S, both_storages, expected, found, labels, matcher, stream

ANC = "PATTERN SEQ(A a, !B n, C c)"
TRAIL = "PATTERN SEQ(A a, B b, !N n) WITHIN 10 s"


@both_storages
def test_an_event_of_the_negated_type_between_kills_the_match(storage):
    assert found(ANC, "a1 c2", storage=storage) == expected("a=1 c=2")
    assert found(ANC, "a1 b2 c3", storage=storage) == []
    assert found(ANC, "a1 c2 b3 c4", storage=storage) == expected("a=1 c=2")
    assert found(ANC, "a1 b2 a3 c4", storage=storage) == expected("a=3 c=4")


@both_storages
def test_negation_looks_strictly_between_in_ts_id_order(storage):
    assert found(ANC, "a1@5 b2@5 c3@5", storage=storage) == []
    assert found(ANC, "b1@5 a2@5 c3@5 b4@5", storage=storage) == expected("a=2 c=3")


@both_storages
def test_negation_condition_on_the_negated_event_and_the_previous_component(storage):
    q = ANC + " WHERE n.p > a.p"
    assert found(q, "a1{p=5} b2{p=3} c3", storage=storage) == expected("a=1 c=3")
    assert found(q, "a1{p=5} b2{p=7} c3", storage=storage) == []


@both_storages
def test_negation_condition_on_the_next_component(storage):
    q = ANC + " WHERE n.p = c.p"
    # b2 negates c3 (same p) but not c4
    assert found(q, "a1 b2{p=1} c3{p=1} c4{p=2}", storage=storage) == expected("a=1 c=4")


@both_storages
def test_negation_conditions_do_not_filter_the_positive_events(storage):
    q = ANC + " WHERE n.p > 10 AND c.p > 0"
    assert found(q, "a1 b2{p=5} c3{p=1} c4", storage=storage) == expected("a=1 c=3")


@both_storages
def test_several_negations_between_the_same_components_are_checked_independently(storage):
    q = "PATTERN SEQ(A a, !B n, !B m, C c) WHERE n.p = 1 AND m.p = 2"
    # b2 (p=3) negates nothing; b5 (p=2) is an m, b8 (p=1) an n
    assert found(q, "a1 b2{p=3} c3 a4 b5{p=2} c6 a7 b8{p=1} c9", storage=storage) == expected("a=1 c=3")


@both_storages
def test_negations_of_different_types_between_the_same_components(storage):
    q = "PATTERN SEQ(A a, !B n, !D m, C c)"
    assert found(q, "a1 b2 c3 a4 d5 c6 a7 c8", storage=storage) == expected("a=7 c=8")


@both_storages
def test_negations_in_different_gaps(storage):
    q = "PATTERN SEQ(A a, !N n, B b, !N m, C c)"
    assert found(q, "a1 n2 b3 c4", storage=storage) == []
    assert found(q, "a1 b2 n3 c4", storage=storage) == []
    assert found(q, "a1 b2 c3 n4", storage=storage) == expected("a=1 b=2 c=3")
    assert found(q, "a1 n2 a3 b4 c5", storage=storage) == expected("a=3 b=4 c=5")


@both_storages
def test_negation_after_a_kleene_only_looks_after_its_last_element(storage):
    q = "PATTERN SEQ(A a, B+ b[], !N n, C c)"
    assert found(q, "a1 b2 n3 b4 c5", storage=storage) == expected("a=1 b=4 c=5", "a=1 b=2,4 c=5")


@both_storages
def test_negation_before_a_kleene_only_looks_before_its_first_element(storage):
    q = "PATTERN SEQ(A a, !N n, B+ b[])"
    assert found(q, "a1 b2 n3 b4", storage=storage) == expected("a=1 b=2", "a=1 b=2,4")


@both_storages
def test_trailing_negation_is_emitted_when_the_watermark_reaches_first_ts_plus_window(storage):
    m = matcher(TRAIL, storage=storage)
    for e in stream("a1@0 b2@1"):
        assert m.push(e) == []
    assert m.advance(10 * S - 1) == []
    assert labels(m.advance(10 * S)) == expected("a=1 b=2")
    assert m.flush() == []


@both_storages
def test_trailing_negation_is_emitted_at_flush(storage):
    m = matcher(TRAIL, storage=storage)
    for e in stream("a1@0 b2@1"):
        m.push(e)
    assert m.stats()["pending"] == 1
    assert labels(m.flush()) == expected("a=1 b=2")
    assert m.stats()["pending"] == 0


@both_storages
def test_trailing_negation_is_emitted_by_a_later_event_of_the_query(storage):
    m = matcher(TRAIL, storage=storage)
    for e in stream("a1@0 b2@1 b3@10"):
        assert m.push(e) == []
    (a4,) = stream("a4@10000001us")
    assert labels(m.push(a4)) == expected("a=1 b=2", "a=1 b=3")


@both_storages
def test_trailing_negation_killed_by_a_negating_event_at_exactly_first_ts_plus_window(storage):
    assert found(TRAIL, "a1@0 b2@1 n3@10", storage=storage) == []


@both_storages
def test_trailing_negation_not_killed_by_a_negating_event_after_the_window(storage):
    m = matcher(TRAIL, storage=storage)
    a1, b2, n3 = stream("a1@0 b2@1 n3@10000001us")
    m.push(a1)
    m.push(b2)
    assert labels(m.push(n3)) == expected("a=1 b=2")
    assert m.flush() == []


@both_storages
def test_trailing_negation_ignores_negating_events_before_the_last_component(storage):
    assert found(TRAIL, "a1@0 n2@0.5 b3@1", storage=storage) == expected("a=1 b=3")


@both_storages
def test_trailing_negation_deadline_is_first_ts_plus_window_for_each_match(storage):
    # deadlines: (a1, b2) and (a1, b4) at 10 s, (a3, b4) at 15 s; n5 at 12 s kills only the last
    assert found(TRAIL, "a1@0 b2@1 a3@5 b4@6 n5@12", storage=storage) == expected("a=1 b=2", "a=1 b=4")


@both_storages
def test_trailing_negation_with_a_condition(storage):
    q = "PATTERN SEQ(A a, B b, !N n) WHERE n.p = a.p WITHIN 10 s"
    assert found(q, "a1@0{p=1} b2@1 n3@2{p=2}", storage=storage) == expected("a=1 b=2")
    assert found(q, "a1@0{p=1} b2@1 n3@2{p=1}", storage=storage) == []


@both_storages
def test_trailing_negation_after_a_trailing_kleene(storage):
    q = "PATTERN SEQ(A a, B+ b[], !N n) WITHIN 10 s"
    # n3 negates every b set ending before it
    assert found(q, "a1@0 b2@1 n3@2 b4@3", storage=storage) == expected("a=1 b=4", "a=1 b=2,4")


@both_storages
def test_negation_under_partition_by_only_sees_its_key(storage):
    q = ANC + " PARTITION BY k"
    assert found(q, "a1{k=x} b2{k=y} c3{k=x}", storage=storage) == expected("a=1 c=3")
    assert found(q, "a1{k=x} b2{k=x} c3{k=x}", storage=storage) == []
    # b3 has no k: it belongs to the None sub-stream and negates only a2 .. c5
    assert found(q, "a1{k=x} a2 b3 c4{k=x} c5", storage=storage) == expected("a=1 c=4")


@both_storages
def test_trailing_negation_under_partition_by_only_sees_its_key(storage):
    q = "PATTERN SEQ(A a, B b, !N n) PARTITION BY k WITHIN 10 s"
    assert found(q, "a1@0{k=x} b2@1{k=x} n3@2{k=y} a4@3{k=y} b5@4{k=y} n6@5{k=y}", storage=storage) == expected(
        "a=1 b=2"
    )


@both_storages
def test_trailing_negation_killed_at_the_last_events_ts_with_a_higher_id(storage):
    assert found(TRAIL, "a1@0 b2@10 n3@10", storage=storage) == []
    assert found(TRAIL, "a1@0 b2@10 n3@10000001us", storage=storage) == expected("a=1 b=2")


@both_storages
def test_two_trailing_negations(storage):
    q = "PATTERN SEQ(A a, B b, !N n, !M m) WITHIN 10 s"
    assert found(q, "a1@0 b2@1 m3@5 a4@20 b5@21 n6@40", storage=storage) == expected("a=4 b=5")


@both_storages
def test_negation_of_any_types(storage):
    q = "PATTERN SEQ(A a, !ANY(B, D) n, C c)"
    assert found(q, "a1 b2 c3 a4 d5 c6 a7 e8 c9", storage=storage) == expected("a=7 c=9")


def test_held_counts_what_waits_for_the_watermark():
    """Issue 47: buffered events (allowed lateness) and trailing-negation matches are counted with their times."""
    from engine.compiler import compile_query
    from engine.events import Event
    from engine.matcher import Matcher

    m = Matcher(compile_query("PATTERN SEQ(A a, A b, !B c) WHERE b.x < a.x WITHIN 1 min"))
    assert m.held() == {"events": 0, "matches": 0, "earliest_us": None, "latest_us": None}
    m.push(Event(1, "A", 0, {"x": 10}))
    m.push(Event(2, "A", 1_000_000, {"x": 5}))
    assert m.held() == {"events": 0, "matches": 1, "earliest_us": 1_000_000, "latest_us": 1_000_000}
    assert len(m.advance(60_000_000)) == 1 and m.held()["matches"] == 0
    late = Matcher(compile_query("PATTERN SEQ(A a, A b) WITHIN 1 min"), allowed_lateness_us=5_000_000)
    for i, ts in enumerate((0, 10_000_000, 12_000_000)):
        late.push(Event(i + 1, "A", ts, {"x": 1}))
    assert late.held() == {"events": 2, "matches": 0, "earliest_us": 10_000_000, "latest_us": 12_000_000}
