"""Runs that share work (engine/nfa/shared_runs.py; docs/semantics.md section 4, "Runs that share work").

The compile-time rule (which slots may merge), and merged runs against one run per partial match and
against the oracle on the cases the rule is about: a climb, WITHIN dropping starts of a merged group
one by one, negations, RETURN aggregates over the Kleene variable, partition keys.
"""
from __future__ import annotations

from collections import Counter

import pytest

from engine.compiler import compile_query
from engine.events import MICROS_PER_S, Event
from engine.lql.parser import parse
from engine.matcher import Matcher
from engine.nfa.counters import Counters
from engine.nfa.runs import RunStorage
from engine.nfa.shared_runs import SharedRunStorage
from tests.engine.oracle import enumerate_matches

CLIMB = (
    "PATTERN SEQ(E a, E+ b[], E c) WHERE b[1].x > a.x AND b[i].x > b[i-1].x AND c.x <= b[last].x "
    "PARTITION BY key STRATEGY {strategy} WITHIN {within}"
)


def climb_query(strategy: str = "skip_till_next_match", within: str = "10 min") -> str:
    return CLIMB.format(strategy=strategy, within=within)


def series(xs: list[float], key: str = "k", start_id: int = 1, gap_s: float = 1.0) -> list[Event]:
    """One event of type E per value, ``gap_s`` apart."""
    return [
        Event(start_id + i, "E", int(i * gap_s * MICROS_PER_S), {"key": key, "x": x}) for i, x in enumerate(xs)
    ]


def interleave(*streams: list[Event]) -> list[Event]:
    """Merge streams by ts, renumbering ids 1..n in (ts, stream) order."""
    tagged = sorted((e.ts, k, e) for k, s in enumerate(streams) for e in s)
    return [Event(i + 1, e.type, e.ts, dict(e.attrs)) for i, (_, _, e) in enumerate(tagged)]


def run(text: str, events: list[Event], share: bool | None) -> tuple[Counter, dict]:
    m = Matcher(compile_query(text), storage="runs", share_runs=share)
    out = []
    for e in events:
        out += m.push(e)
    out += m.flush()
    got = Counter((x.key(), tuple(sorted((x.fields or {}).items()))) for x in out)
    return got, m.stats()


def check(text: str, events: list[Event], oracle: bool = True) -> dict:
    """Shared == unshared (keys and RETURN fields) == the oracle (keys); the shared run's stats."""
    shared, stats = run(text, events, True)
    unshared, _ = run(text, events, False)
    assert shared == unshared
    if oracle:
        assert {k for k, _ in shared} == enumerate_matches(parse(text), events)
    assert stats["live_partial_matches"] == 0
    return stats


def shareable(text: str) -> list[bool]:
    (plan,) = compile_query(text).plans
    return plan.shareable


# --------------------------------------------------------------------------- the compile-time rule


@pytest.mark.parametrize(
    "where,flags",
    [
        ("b[1].x > a.x AND b[i].x > b[i-1].x AND c.x <= b[last].x", [True, True, True]),
        ("b[i].x > b[i-1].x", [True, True, True]),
        # c reads a: runs in b with different a's have different futures
        ("c.x > a.x", [True, False, True]),
        # b[1] and b[k] differ between runs that share the last element
        ("c.x > b[1].x", [True, False, True]),
        ("c.x > b[2].x", [True, False, True]),
        # each take compares with a
        ("b[i].x > a.x", [True, False, True]),
        # an entry condition over every element of b
        ("c.x > b[i].x", [True, False, True]),
    ],
)
def test_which_slots_may_merge(where: str, flags: list[bool]) -> None:
    assert shareable(f"PATTERN SEQ(A a, B+ b[], C c) WHERE {where} STRATEGY skip_till_next_match") == flags


def test_a_negation_reading_an_earlier_variable_blocks_merging_before_it() -> None:
    base = "PATTERN SEQ(A a, B+ b[], !N n, C c) WHERE {} STRATEGY skip_till_next_match"
    assert shareable(base.format("n.x > b[last].x")) == [True, True, True]
    assert shareable(base.format("n.x > a.x")) == [True, False, True]


def test_the_matcher_shares_only_where_it_can() -> None:
    text = climb_query()
    assert isinstance(Matcher(compile_query(text), storage="runs").engines[0], SharedRunStorage)
    assert isinstance(Matcher(compile_query(text), storage="runs", share_runs=False).engines[0], RunStorage)
    assert isinstance(Matcher(compile_query(text), storage="runs", pm_capacity=100).engines[0], RunStorage)
    unshareable = "PATTERN SEQ(A a, B+ b[], C c) WHERE b[i].x > a.x STRATEGY skip_till_next_match"
    assert isinstance(Matcher(compile_query(unshareable), storage="runs", share_runs=True).engines[0], RunStorage)
    # by default only where runs pile up: the Kleene slot's types can also start a run (the climb)
    disjoint = "PATTERN SEQ(A a, B+ b[], C c) STRATEGY skip_till_next_match"
    assert isinstance(Matcher(compile_query(disjoint), storage="runs").engines[0], RunStorage)
    assert isinstance(Matcher(compile_query(disjoint), storage="runs", share_runs=True).engines[0], SharedRunStorage)
    any_match = "PATTERN SEQ(A a, B+ b[], C c) STRATEGY skip_till_any_match"
    assert not isinstance(Matcher(compile_query(any_match), storage="runs").engines[0], SharedRunStorage)


def test_shared_storage_refuses_skip_till_any_match() -> None:
    plan = compile_query("PATTERN SEQ(A a, B+ b[], C c)").plans[0]
    with pytest.raises(ValueError, match="skip_till_next_match"):
        SharedRunStorage(plan, None, "skip_till_any_match", Counters(), None, lambda s, e: None)


# --------------------------------------------------------------------------- same matches


def test_a_climb_merges_runs_and_finds_the_same_matches() -> None:
    xs = [1, 2, 3, 4, 5, 6, 7, 3, 4, 5, 6, 2]
    stats = check(climb_query(), series(xs))
    # every start inside a climb joins the group of the run that started before it
    assert stats["merged"] > 0
    shared, _ = run(climb_query(), series(xs), True)
    ends = Counter(dict(k)["c"] for k, _ in shared)
    assert ends == {(8,): 6, (12,): 3}  # a = x1..x6 end at x=3 (id 8); a = x8..x10 end at id 12


def test_within_drops_the_starts_of_a_merged_group_one_by_one() -> None:
    xs = [1, 2, 3, 4, 5, 6, 7, 8, 0]
    stats = check(climb_query(within="4 seconds"), series(xs))
    shared, _ = run(climb_query(within="4 seconds"), series(xs), True)
    # only a start at most 4 s before the drop (ts 8 s) survives: a = x5 (ts 4 s) .. x7 (ts 6 s)
    assert sorted(dict(k)["a"] for k, _ in shared) == [(5,), (6,), (7,)]
    assert stats["merged"] > 0


@pytest.mark.parametrize("strategy", ["skip_till_next_match", "partition_contiguity", "strict_contiguity"])
def test_strategies_and_windows_agree_with_the_oracle(strategy: str) -> None:
    xs = [3, 1, 2, 4, 4, 5, 7, 6, 8, 9, 10, 1, 2, 3]
    for within in ("3 seconds", "6 seconds", "1 min"):
        check(climb_query(strategy, within), series(xs))


def test_partition_keys_keep_their_own_groups() -> None:
    events = interleave(series([1, 2, 3, 4, 1], "p"), series([5, 6, 2, 3, 4, 5, 0], "q"), series([1, 1, 2, 3, 2], "r"))
    stats = check(climb_query(), events)
    assert stats["merged"] > 0


def test_middle_negation_after_the_kleene_component() -> None:
    text = (
        "PATTERN SEQ(A a, B+ b[], !N n, C c) WHERE b[i].x >= b[i-1].x AND n.x > b[last].x "
        "STRATEGY skip_till_next_match WITHIN 20 seconds"
    )
    spec = [("A", 0), ("A", 0), ("B", 1), ("A", 0), ("B", 2), ("N", 1), ("C", 0), ("A", 0), ("B", 3), ("B", 3),
            ("N", 5), ("C", 0), ("A", 0), ("B", 1), ("C", 0)]
    events = [Event(i + 1, t, i * MICROS_PER_S, {"x": x}) for i, (t, x) in enumerate(spec)]
    assert shareable(text) == [True, True, True]
    stats = check(text, events)
    assert stats["merged"] > 0


def test_return_aggregates_are_per_start() -> None:
    text = (
        "PATTERN SEQ(A a, B+ b[], C c) WHERE b[i].x > b[i-1].x STRATEGY skip_till_next_match "
        "RETURN a.x AS ax, count(b) AS n, sum(b.x) AS total, first(b.x) AS b1, last(b.x) AS bl"
    )
    spec = [("A", 10), ("A", 20), ("B", 1), ("A", 30), ("B", 2), ("B", 3), ("C", 0)]
    events = [Event(i + 1, t, i * MICROS_PER_S, {"x": x}) for i, (t, x) in enumerate(spec)]
    stats = check(text, events)
    assert stats["merged"] > 0
    shared, _ = run(text, events, True)
    rows = sorted((d["ax"], d["n"], d["total"], d["b1"], d["bl"]) for _, f in shared for d in [dict(f)])
    # a1 and a2 wait for b3 and share every element from then on; a4 starts at b5
    assert rows == [(10, 3, 6, 1, 3), (20, 3, 6, 1, 3), (30, 2, 5, 2, 3)]


def test_a_group_splits_where_futures_start_to_differ() -> None:
    # runs in b merge (what comes later reads c only); runs in c do not (c[1] differs between them)
    text = (
        "PATTERN SEQ(A a, B+ b[], C+ c[]) WHERE c[i].x > c[1].x "
        "STRATEGY skip_till_next_match WITHIN 30 seconds"
    )
    assert shareable(text) == [True, True, False]
    spec = [("A", 0), ("B", 1), ("A", 0), ("B", 4), ("B", 2), ("C", 3), ("C", 5), ("C", 4), ("C", 6)]
    events = [Event(i + 1, t, i * MICROS_PER_S, {"x": x}) for i, (t, x) in enumerate(spec)]
    assert check(text, events)["merged"] > 0
