"""SEQ: order of components, (ts, id) order with equal timestamps, the query stream, ANY (semantics.md 1-3)."""
from __future__ import annotations

from tests.engine.helpers import S, both_storages, expected, found, matcher, run, stream

ABC = "PATTERN SEQ(A a, B b, C c)"


@both_storages
def test_components_bind_events_in_pattern_order(storage):
    assert found(ABC, "a1 b2 c3", storage=storage) == expected("a=1 b=2 c=3")
    assert found(ABC, "c1 b2 a3", storage=storage) == []
    assert found(ABC, "a1 c2 b3", storage=storage) == []


@both_storages
def test_skip_till_any_match_combines_every_ordered_choice(storage):
    assert found(ABC, "a1 a2 b3 c4 b5 c6", storage=storage) == expected(
        "a=1 b=3 c=4", "a=1 b=3 c=6", "a=1 b=5 c=6",
        "a=2 b=3 c=4", "a=2 b=3 c=6", "a=2 b=5 c=6",
    )


@both_storages
def test_equal_timestamps_are_ordered_by_id(storage):
    assert found(ABC, "a1@5 b2@5 c3@5", storage=storage) == expected("a=1 b=2 c=3")
    # same ts, but b has a lower id than a: b comes first in (ts, id) order
    assert found(ABC, "b1@5 a2@5 c3@5", storage=storage) == []
    assert found(ABC, "a2@5 c3@5", storage=storage) == []


@both_storages
def test_one_event_binds_at_most_one_component(storage):
    assert found("PATTERN SEQ(A x, A y)", "a1 a2 a3", storage=storage) == expected(
        "x=1 y=2", "x=1 y=3", "x=2 y=3"
    )
    assert found("PATTERN SEQ(A x, A y)", "a1@0 a2@0", storage=storage) == expected("x=1 y=2")
    assert found("PATTERN SEQ(A x, A y)", "a1", storage=storage) == []


@both_storages
def test_a_lone_component_matches_every_event_of_its_type(storage):
    assert found("PATTERN A a", "a1 b2 a3", storage=storage) == expected("a=1", "a=3")
    assert found("PATTERN SEQ(A a)", "a1 b2 a3", storage=storage) == expected("a=1", "a=3")


@both_storages
def test_types_not_in_the_pattern_are_ignored(storage):
    assert found(ABC, "x1 a2 y3 b4 x5 c6 z7", storage=storage) == expected("a=2 b=4 c=6")
    m = matcher(ABC, storage=storage)
    for e in stream("x1 a2 y3 b4 c5"):
        m.push(e)
    assert m.stats()["ignored"] == 2
    assert m.stats()["events"] == 3


def test_types_not_in_the_pattern_do_not_break_strict_contiguity():
    q = ABC + " STRATEGY strict_contiguity"
    assert found(q, "a1 x2 b3 y4 c5") == expected("a=1 b=3 c=5")
    # a type of the pattern in between does break it
    assert found(q, "a1 c2 b3 c4") == []
    assert found(q, "a1 a2 b3 c4") == expected("a=2 b=3 c=4")


@both_storages
def test_match_start_and_end_are_the_first_and_last_timestamps(storage):
    (m,) = run(ABC, "x1@0 a2@1.5 b3@2 c4@7", storage=storage)
    assert (m.start, m.end) == (int(1.5 * S), 7 * S)
    assert m.ids() == {"a": [2], "b": [3], "c": [4]}
    assert [e.id for e in m.events["b"]] == [3]


@both_storages
def test_any_binds_an_event_of_any_listed_type(storage):
    q = "PATTERN SEQ(ANY(A, B) x, C c)"
    assert found(q, "a1 b2 d3 c4", storage=storage) == expected("x=1 c=4", "x=2 c=4")
    assert found(q + " WHERE x.type = 'B'", "a1 b2 d3 c4", storage=storage) == expected("x=2 c=4")


@both_storages
def test_any_kleene_mixes_the_listed_types(storage):
    q = "PATTERN SEQ(ANY(A, B)+ x[], C c)"
    assert found(q, "a1 b2 c3", storage=storage) == expected("x=1 c=3", "x=2 c=3", "x=1,2 c=3")


@both_storages
def test_any_types_are_part_of_the_query_stream(storage):
    # B only appears inside ANY: it still breaks strict contiguity, and it is not "ignored"
    q = "PATTERN SEQ(A a, ANY(B, C) x, D d) STRATEGY strict_contiguity"
    assert found(q, "a1 b2 d3 a4 c5 b6 d7") == expected("a=1 x=2 d=3")
    m = matcher("PATTERN SEQ(ANY(A, B) x, C c)", storage=storage)
    for e in stream("a1 b2 d3"):
        m.push(e)
    assert m.stats()["ignored"] == 1
