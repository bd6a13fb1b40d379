"""RETURN: fields, aggregates over Kleene variables, default fields, Match.to_json() (semantics.md 5)."""
from __future__ import annotations

import json

from tests.engine.helpers import S, both_storages, run

ABC = "PATTERN SEQ(A a, B+ b[], C c)"
STAR = "PATTERN SEQ(A a, B* b[], C c)"
AGGREGATES = (
    "count(b) AS n, sum(b.p) AS total, avg(b.p) AS mean, min(b.p) AS lo, max(b.p) AS hi, "
    "first(b.p) AS f, last(b.p) AS l, b[1].p AS b1, b[last].p AS bl"
)


def fields_by_b(query: str, spec: str, storage: str = "chain") -> dict[tuple[int, ...], dict]:
    """RETURN fields of each match, by the ids of b."""
    out = {}
    for m in run(query, spec, storage=storage):
        key = tuple(m.ids()["b"])
        assert key not in out
        out[key] = m.fields
    return out


@both_storages
def test_single_variable_fields_and_arithmetic(storage):
    (m,) = run(
        "PATTERN SEQ(A a, C c) RETURN a.p AS p, c.p - a.p AS gain, (a.p + 1) * 2 AS x, c.ts - a.ts AS dt, a.k",
        "a1@1{p=2,k=x} c2@3.5{p=7}",
        storage=storage,
    )
    assert m.fields == {"p": 2, "gain": 5, "x": 6, "dt": int(2.5 * S), "a.k": "x"}


@both_storages
def test_aggregates_over_a_kleene_variable(storage):
    got = fields_by_b(f"{ABC} RETURN {AGGREGATES}", "a1 b2{p=4} b3{p=1} b4{p=7} c5", storage)
    assert got[(2,)] == {"n": 1, "total": 4, "mean": 4, "lo": 4, "hi": 4, "f": 4, "l": 4, "b1": 4, "bl": 4}
    assert got[(2, 3, 4)] == {"n": 3, "total": 12, "mean": 4, "lo": 1, "hi": 7, "f": 4, "l": 7, "b1": 4, "bl": 7}
    assert got[(3, 4)] == {"n": 2, "total": 8, "mean": 4, "lo": 1, "hi": 7, "f": 1, "l": 7, "b1": 1, "bl": 7}
    assert len(got) == 7


@both_storages
def test_avg_is_true_division(storage):
    got = fields_by_b(f"{ABC} RETURN avg(b.p) AS mean", "a1 b2{p=1} b3{p=2} c4", storage)
    assert got[(2, 3)] == {"mean": 1.5}


@both_storages
def test_b_k_in_return(storage):
    got = fields_by_b(f"{ABC} RETURN b[2].p AS second", "a1 b2{p=4} b3{p=1} c4", storage)
    assert got[(2, 3)] == {"second": 1}


@both_storages
def test_aggregates_over_an_empty_star_are_none(storage):
    # semantics.md 5: "(None when empty)" read as covering sum, avg, min, max, first and last
    (m,) = run(
        f"{STAR} RETURN sum(b.p) AS total, avg(b.p) AS mean, min(b.p) AS lo, max(b.p) AS hi, "
        "first(b.p) AS f, last(b.p) AS l",
        "a1 c2",
        storage=storage,
    )
    assert m.fields == {"total": None, "mean": None, "lo": None, "hi": None, "f": None, "l": None}


@both_storages
def test_count_of_an_empty_star_is_zero(storage):
    (m,) = run(f"{STAR} RETURN count(b) AS n", "a1 c2", storage=storage)
    assert m.fields == {"n": 0}


@both_storages
def test_aggregates_over_a_non_empty_star(storage):
    got = fields_by_b(f"{STAR} RETURN count(b) AS n, sum(b.p) AS total", "a1 b2{p=4} c3", storage)
    assert got[(2,)] == {"n": 1, "total": 4}


@both_storages
def test_default_field_names_are_the_normalized_expression(storage):
    (m,) = run(
        "PATTERN SEQ(A a, B+ b[]) RETURN COUNT( b ), Min(b.p), b[LAST].p, (a.p+1)*2, a.ts + 600 s",
        "a1@0{p=1} b2{p=3}",
        storage=storage,
    )
    assert m.fields == {
        "count(b)": 1,
        "min(b.p)": 3,
        "b[last].p": 3,
        "(a.p + 1) * 2": 4,
        "a.ts + 10 min": 600 * S,
    }


@both_storages
def test_no_return_means_empty_fields_and_every_event_id(storage):
    matches = run(ABC, "a1 b2 b3 c4", storage=storage)
    assert {tuple(m.ids()["b"]) for m in matches} == {(2,), (3,), (2, 3)}
    assert all(m.fields == {} for m in matches)


@both_storages
def test_to_json_shape(storage):
    (m,) = run(
        "NAME q1 PATTERN SEQ(A a, B* b[], C c) RETURN a.p AS p", "a1@1{p=2} c2@3", storage=storage
    )
    assert m.to_json() == {
        "query": "q1",
        "events": {"a": [1], "b": [], "c": [2]},
        "start": 1 * S,
        "end": 3 * S,
        "fields": {"p": 2},
    }
    assert json.loads(json.dumps(m.to_json())) == m.to_json()


@both_storages
def test_to_json_without_name_or_return(storage):
    (m,) = run("PATTERN SEQ(A a, B+ b[])", "a1@0 b2@2", storage=storage)
    assert m.to_json() == {"query": None, "events": {"a": [1], "b": [2]}, "start": 0, "end": 2 * S, "fields": {}}


def test_return_under_skip_till_next_match():
    (m,) = run(
        f"{ABC} STRATEGY skip_till_next_match RETURN count(b) AS n, b[last].p AS bl, c.p AS cp",
        "a1 b2{p=1} b3{p=2} c4{p=3}",
    )
    assert m.fields == {"n": 2, "bl": 2, "cp": 3}


@both_storages
def test_return_with_a_trailing_negation_is_evaluated_at_emission(storage):
    (m,) = run(
        "PATTERN SEQ(A a, B b, !N n) WITHIN 10 s RETURN b.p - a.p AS d", "a1@0{p=1} b2@1{p=5}", storage=storage
    )
    assert m.fields == {"d": 4}
