"""A one-event archived pattern's instances are matched once per event and reused by later requests
(engine/live_archived/memo.py, issue 25): the same matches, in the same order, as a fresh matcher over each request."""
from __future__ import annotations

import random

import pytest

from engine.events import Event
from engine.live_archived import compile_live_archived
from engine.live_archived.llaa import LLAA
from engine.live_archived.memo import ArchivedMemo
from engine.live_archived.source import MemoryArchive

S = 1_000_000
ONE_EVENT = """
LIVE PATTERN SEQ(B b) PARTITION BY k
ARCHIVED PATTERN SEQ(A c) WHERE c.x > 3 AND c.x != 7 PARTITION BY k
LOOKBACK 50 s
JOIN b.k = c.k
"""
TWO_EVENTS = """
LIVE PATTERN SEQ(B b)
ARCHIVED PATTERN SEQ(A a, A c) WHERE c.x > a.x WITHIN 5 s
LOOKBACK 10 s
"""


def events(seed: int, n: int = 400) -> list[Event]:
    rng = random.Random(seed)
    out = [Event(i, "A", rng.randrange(0, 100 * S, S // 4), {"k": rng.randrange(4), "x": rng.randrange(10)})
           for i in range(1, n + 1)]
    return sorted(out, key=Event.order_key)


def ids(matches) -> list[tuple[int, ...]]:
    return [tuple(e.id for bound in m.events.values() for e in bound) for m in matches]


@pytest.mark.parametrize("max_events", [1_000_000, 40])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_requests_through_the_memo_equal_a_fresh_matcher(seed, max_events):
    """Overlapping random requests (some rows twice, some out of order), a memo large enough and one that must
    forget: each request's matches equal a fresh matcher's over the same rows, in the same order."""
    plan = compile_live_archived(ONE_EVENT)
    runner = LLAA(plan, MemoryArchive())
    runner.archived_memo = ArchivedMemo(max_events)
    rng = random.Random(seed)
    pool = events(seed)
    reused = 0
    for _ in range(60):
        lo = rng.randrange(len(pool))
        rows = pool[lo : lo + rng.randrange(1, 120)]
        rows = rows + rng.sample(rows, min(len(rows), rng.randrange(3)))  # an event returned twice
        rng.shuffle(rows)
        want = runner._match_fresh(sorted(rows, key=Event.order_key))
        got = runner.match_archived(rows)
        assert ids(got) == ids(want) and [m.start for m in got] == [m.start for m in want]
        assert all(g.fields == w.fields for g, w in zip(got, want))
        reused = runner.archived_memo.stats()["reused"]
    assert reused > 0  # later requests did reuse earlier events' matches
    assert runner.archived_memo.stats()["events"] <= max(max_events, 120)


def test_a_second_identical_request_matches_nothing_again():
    plan = compile_live_archived(ONE_EVENT)
    runner = LLAA(plan, MemoryArchive())
    rows = events(7, 50)
    first = runner.match_archived(rows)
    matched = runner.archived_memo.stats()["matched"]
    assert matched == 50
    again = runner.match_archived(rows)
    assert ids(again) == ids(first) and runner.archived_memo.stats() == {"events": 50, "reused": 50, "matched": 50}
    assert runner.counters.archived_instances == 2 * len(first)  # still counted per request (001 section 6)


def test_a_pattern_of_several_events_is_matched_afresh_each_time():
    runner = LLAA(compile_live_archived(TWO_EVENTS), MemoryArchive())
    assert runner.archived_memo is None


EQUI = """
LIVE PATTERN SEQ(B b) PARTITION BY k
ARCHIVED PATTERN SEQ(A c) PARTITION BY k
LOOKBACK 40 s
JOIN b.k = c.k AND c.g = b.g AND b.h + 1 = c.h AND c.x < b.x
RETURN b.k AS k, count(c) AS n
"""
PAIRWISE = EQUI.replace("RETURN b.k AS k, count(c) AS n", "RETURN b.k AS k, c.x AS x")


def mixed_events(seed: int, n: int = 600) -> list[Event]:
    """Join values with nulls (missing attributes), NaN, and ints equal to floats (1 = 1.0)."""
    rng = random.Random(seed)
    values = [0, 1, 1.0, 2, float("nan"), None]
    out = []
    for i in range(1, n + 1):
        attrs = {"k": rng.randrange(3), "x": rng.randrange(10)}
        for a in ("g", "h"):
            v = rng.choice(values)
            if v is not None:
                attrs[a] = v
        out.append(Event(i, rng.choice("AAB"), rng.randrange(0, 200 * S, S // 8), attrs))
    return sorted(out, key=Event.order_key)


@pytest.mark.parametrize("text", [EQUI, PAIRWISE], ids=["grouped", "pairwise"])
@pytest.mark.parametrize("algorithm", ["llaa", "sllaa", "alaa"])
@pytest.mark.parametrize("seed", [4, 5])
def test_join_equalities_taken_apart_give_the_conjunct_by_conjunct_results(text, algorithm, seed):
    """The JOIN's equalities evaluated once per side (plan.join_equi, Runner.join) against every conjunct on every
    pair (join_equi emptied): the same results, with nulls, NaN and 1 = 1.0 among the values."""
    from engine.live_archived import run_memory

    plan = compile_live_archived(text)
    assert len(plan.join_equi) == 2 and len(plan.join_rest) == 1
    pairwise = compile_live_archived(text)
    pairwise.join_equi, pairwise.join_rest = [], pairwise.join_same_key
    evs = mixed_events(seed)
    opts = {"tolerance_us": 3 * S} if algorithm == "sllaa" else {}
    got, runner = run_memory(plan, algorithm, evs, **opts)
    want, scanned = run_memory(pairwise, algorithm, evs, **opts)
    assert len(want) > 10
    canon = lambda ms: sorted((sorted(m.ids().items()), sorted(m.fields.items())) for m in ms)  # noqa: E731
    assert canon(got) == canon(want)
    if algorithm == "sllaa":  # a hash join on the equalities: only the pairs with equal values are tried
        assert runner.counters.join_pairs_tried < scanned.counters.join_pairs_tried / 2
