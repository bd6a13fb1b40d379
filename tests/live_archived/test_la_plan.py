"""Compiling live-and-archived queries: JOIN and RETURN over both sides, archive keys, access ranges."""
from __future__ import annotations

import random

import pytest

from engine.compiler import compile_query
from engine.events import Event
from engine.live_archived import MemoryArchive, compile_live_archived, make_runner, replay, run_memory
from engine.live_archived.plan import NO_KEY
from engine.lql.errors import QueryError

S = 1_000_000


def ev(i: int, t: str, ts_s: float, **attrs) -> Event:
    return Event(i, t, int(ts_s * S), attrs)


SPEEDING = """
NAME speeding
LIVE     PATTERN SEQ(Pass p) WHERE p.checkpoint = 'B'
ARCHIVED PATTERN SEQ(Pass q) WHERE q.checkpoint = 'A' PARTITION BY car
         LOOKBACK 30 min
JOIN     p.car = q.car AND p.ts - q.ts < 20 min
RETURN   p.car AS car, q.ts AS entered, p.ts AS left
"""


def test_the_design_example_joins_a_live_pass_with_an_archived_one():
    events = [
        ev(1, "Pass", 0, car="x", checkpoint="A"),
        ev(2, "Pass", 60, car="y", checkpoint="A"),
        ev(3, "Pass", 25 * 60, car="y", checkpoint="B"),  # 24 min after A: too slow for the JOIN
        ev(4, "Pass", 26 * 60, car="x", checkpoint="A"),
        ev(5, "Pass", 30 * 60, car="x", checkpoint="B"),  # 4 min after x's second A, 30 min after its first
    ]
    plan = compile_live_archived(SPEEDING)
    assert plan.key is not None and plan.key.attr == "car" and plan.key.text == "p.car = q.car"
    results, runner = run_memory(plan, "llaa", events)
    assert [r.to_json() for r in results] == [
        {
            "query": "speeding",
            "events": {"p": [5], "q": [4]},
            "start": 26 * 60 * S,
            "end": 30 * 60 * S,
            "fields": {"car": "x", "entered": 26 * 60 * S, "left": 30 * 60 * S},
        }
    ]
    # x's first A is at the very start of [0, 30 min): in the range, but the JOIN's 20 min fail
    assert runner.counters.archive_requests == 2 and runner.counters.join_pairs_tried == 3


def test_the_access_range_is_half_open_before_the_live_start():
    q = "LIVE PATTERN B b ARCHIVED PATTERN A a LOOKBACK 10 s"
    events = [ev(1, "A", 0), ev(2, "A", 0.5), ev(3, "A", 10), ev(4, "B", 10)]
    got, _ = run_memory(compile_live_archived(q), "llaa", events)
    # [0, 10): a@0 is in, a@10 (same ts as the live start) is not
    assert sorted(r.ids()["a"][0] for r in got) == [1, 2]


def test_an_archived_instance_must_lie_entirely_in_the_access_range():
    q = "LIVE PATTERN B b ARCHIVED PATTERN SEQ(A a, C c) LOOKBACK 10 s"
    events = [ev(1, "A", 1), ev(2, "A", 5), ev(3, "C", 9), ev(4, "C", 12), ev(5, "B", 12.5)]
    got, _ = run_memory(compile_live_archived(q), "llaa", events)
    # a@1 is out of [2.5, 12.5); c@12 is in; so (a@5, c@9) and (a@5, c@12)
    assert {(r.ids()["a"][0], r.ids()["c"][0]) for r in got} == {(2, 3), (2, 4)}


def test_a_trailing_negation_of_the_archived_side_must_be_decided_inside_the_range():
    q = "LIVE PATTERN B b ARCHIVED PATTERN SEQ(A a, !N n) WITHIN 3 s LOOKBACK 10 s"
    plan = compile_live_archived(q)
    assert plan.archived_deadline_us == 3 * S
    events = [ev(1, "A", 1), ev(2, "A", 6), ev(3, "B", 8), ev(4, "B", 9.5)]
    got, _ = run_memory(plan, "llaa", events)
    # a@6's negation window [6, 9] is not inside [-2, 8) but is inside [-0.5, 9.5)
    assert sorted((r.ids()["b"][0], r.ids()["a"][0]) for r in got) == [(3, 1), (4, 1), (4, 2)]


def test_join_conjuncts_on_an_unbound_variable_are_ignored_like_where():
    q = """LIVE PATTERN B b ARCHIVED PATTERN OR(A a, C c) LOOKBACK 10 s
           JOIN b.x = a.x AND b.y = c.y"""
    events = [ev(1, "A", 1, x=1), ev(2, "A", 2, x=2), ev(3, "C", 3, y=5), ev(4, "C", 4, y=6), ev(5, "B", 5, x=1, y=6)]
    plan = compile_live_archived(q)
    assert plan.key is None  # an OR variable is not bound by every match: no archive key
    got, _ = run_memory(plan, "llaa", events)
    assert sorted(tuple(sorted((v, i[0]) for v, i in r.ids().items() if i)) for r in got) == [
        (("a", 1), ("b", 5)),
        (("b", 5), ("c", 4)),
    ]


def test_a_kleene_index_beyond_the_length_makes_its_join_conjunct_false():
    q = "LIVE PATTERN B b ARCHIVED PATTERN SEQ(A+ a[]) LOOKBACK 10 s JOIN NOT (a[2].x = b.x)"
    events = [ev(1, "A", 1, x=1), ev(2, "A", 2, x=2), ev(3, "B", 3, x=7)]
    got, _ = run_memory(compile_live_archived(q), "llaa", events)
    # a = [1] has no a[2]: the conjunct is false even under NOT; a = [1, 2] and [2] ... only [1, 2] has a[2]
    assert [r.ids()["a"] for r in got] == [[1, 2]]


def test_return_reads_both_sides_with_live_aggregates_one_result_per_pair():
    q = """NAME n LIVE PATTERN SEQ(B b, D+ d[]) WITHIN 10 s ARCHIVED PATTERN SEQ(A+ a[]) STRATEGY strict_contiguity
           LOOKBACK 10 s RETURN count(d) AS nd, a[last].v AS last_a, a[1].v AS first_a, b.ts - a[1].ts AS gap"""
    events = [ev(1, "A", 1, v=3), ev(2, "A", 2, v=9), ev(3, "B", 4), ev(4, "D", 5), ev(5, "D", 6)]
    plan = compile_live_archived(q)
    assert not plan.grouped
    got, _ = run_memory(plan, "llaa", events)
    fields = sorted((r.fields["nd"], r.fields["last_a"], r.fields["first_a"], r.fields["gap"]) for r in got)
    # archived (strict): [1], [2], [1, 2]; live: d = [4], [5], [4, 5]
    archived = ((3, 3, 3 * S), (9, 9, 2 * S), (9, 3, 3 * S))  # a[last].v, a[1].v, b.ts - a[1].ts
    assert fields == sorted((nd, la, fa, gap) for nd in (1, 1, 2) for la, fa, gap in archived)
    assert all(r.query == "n" and set(r.events) == {"b", "d", "a"} for r in got)


def test_an_archived_aggregate_gives_one_result_per_live_instance():
    q = """NAME n LIVE PATTERN SEQ(B b, D+ d[]) WITHIN 10 s ARCHIVED PATTERN SEQ(A+ a[]) STRATEGY strict_contiguity
           LOOKBACK 10 s RETURN count(d) AS nd, count(a) AS na, max(a.v) AS top, first(a.v) AS first_a,
           min(a.ts) AS since, b.ts AS now"""
    events = [ev(1, "A", 1, v=3), ev(2, "A", 2, v=9), ev(3, "B", 4), ev(4, "D", 5), ev(5, "D", 6)]
    plan = compile_live_archived(q)
    assert plan.grouped
    got, runner = run_memory(plan, "llaa", events)
    # three live instances (d = [4], [5], [4, 5]), each joined with the archived [1], [2], [1, 2]:
    # the events of a over the three joined instances, each once: [1, 2]
    assert sorted((r.fields["nd"], r.ids()["d"]) for r in got) == [(1, [4]), (1, [5]), (2, [4, 5])]
    for r in got:
        assert r.ids()["a"] == [1, 2] and r.ids()["b"] == [3] and r.start == 1 * S
        assert r.end == max(e.ts for e in r.events["d"])
        assert (r.fields["na"], r.fields["top"], r.fields["first_a"], r.fields["since"], r.fields["now"]) == (
            2, 9, 3, 1 * S, 4 * S
        )
    assert runner.counters.results == 3 and runner.counters.join_pairs_tried == 9
    assert len(runner.counters.delay_event_us) == 3


@pytest.mark.parametrize(
    "archived, join, key",
    [
        ("SEQ(A a) PARTITION BY k", "b.k = a.k", "k"),
        ("SEQ(A a) PARTITION BY k", "a.k = b.k + 1", "k"),
        ("SEQ(A a)", "b.k = a.k", None),  # not partitioned
        ("SEQ(A a) PARTITION BY k STRATEGY strict_contiguity", "b.k = a.k", None),  # contiguity spans keys
        ("SEQ(A a) PARTITION BY k", "b.k = a.j", None),  # not the partition attribute
        ("SEQ(A a) PARTITION BY k", "b.k < a.k", None),
        ("SEQ(A a) PARTITION BY k", "b.k = a.k OR b.x = 1", None),
        ("SEQ(A a, A* c[]) PARTITION BY k", "b.k = c[1].k", None),  # c may bind nothing
        ("SEQ(A a) WHERE [k]", "b.k = a.k", "k"),  # [k] under skip_till_any_match acts as PARTITION BY k
        ("SEQ(A a) PARTITION BY k, j", "b.x = a.j AND b.k = a.k", "j"),
    ],
)
def test_archive_keys_come_from_a_join_equality_on_an_archived_partition_attribute(archived, join, key):
    plan = compile_live_archived(f"LIVE PATTERN B b ARCHIVED PATTERN {archived} LOOKBACK 1 h JOIN {join}")
    assert (plan.key.attr if plan.key else None) == key


def test_key_hint_prefers_the_archive_key_attribute():
    q = "LIVE PATTERN B b ARCHIVED PATTERN SEQ(A a) PARTITION BY k, j LOOKBACK 1 h JOIN b.x = a.j AND b.k = a.k"
    assert compile_live_archived(q, key_hint="k").key.attr == "k"


def test_a_live_instance_without_a_key_value_needs_no_request():
    q = "LIVE PATTERN B b ARCHIVED PATTERN SEQ(A a) PARTITION BY k LOOKBACK 1 h JOIN b.k = a.k"
    plan = compile_live_archived(q)
    events = [ev(1, "A", 1, k=1), ev(2, "B", 2), ev(3, "B", 3, k=1)]
    got, runner = run_memory(plan, "llaa", events)
    assert [r.ids() for r in got] == [{"b": [3], "a": [1]}]
    assert runner.counters.archive_requests == 1 and plan.key_of(got[0]) == 1
    assert plan.key_of(_instance(events[1])) is NO_KEY


def _instance(e: Event):
    from engine.match import Match

    return Match(None, {"b": (e,)}, e.ts, e.ts)


def test_live_only_text_and_live_and_archived_compile_apart():
    with pytest.raises(QueryError, match="not a live-and-archived query"):
        compile_live_archived("PATTERN SEQ(A a)")
    with pytest.raises(QueryError, match="needs `lace replay`"):
        compile_query("LIVE PATTERN A a ARCHIVED PATTERN B b LOOKBACK 1 h")


def test_unknown_algorithm_is_refused():
    plan = compile_live_archived("LIVE PATTERN A a ARCHIVED PATTERN B b LOOKBACK 1 h")
    with pytest.raises(ValueError, match="unknown algorithm"):
        make_runner("fastest", plan, MemoryArchive())


def test_alaa_answers_at_the_end_of_the_live_window():
    q = "LIVE PATTERN B b WITHIN 10 s ARCHIVED PATTERN A a LOOKBACK 1 min"
    events = [ev(1, "A", 1), ev(2, "B", 12), ev(3, "X", 15), ev(4, "X", 21)]
    plan = compile_live_archived(q)
    archive = MemoryArchive()
    runner = make_runner("alaa", plan, archive)
    out = []
    for e in events:
        archive.append(e)
        out.append(len(runner.push(e)))
    assert out == [0, 0, 0, 1]  # window [10 s, 20 s) closes when the watermark reaches 20 s
    assert runner.counters.delay_event_us == [9 * S]


# ------------------------------------------------------------------ the memory archive


def test_memory_archive_requests_equal_a_plain_filter():
    rng = random.Random(3)
    events = [Event(i, rng.choice("AB"), rng.randrange(100) * S, {"k": rng.randrange(4)}) for i in range(1, 300)]
    archive = MemoryArchive()
    archive.extend(events)  # out of order: kept sorted
    for _ in range(50):
        types = rng.choice([["A"], ["B"], ["A", "B"]])
        ranges = [(lo := rng.randrange(100) * S, lo + rng.randrange(30) * S) for _ in range(rng.randrange(1, 4))]
        keys = rng.choice([None, [0], [1, 3]])
        per_key = rng.random() < 0.3
        req = {k: ranges for k in (keys or [0, 2])} if per_key else ranges
        got = archive.extract(types, None if per_key else keys, req, key_attr="k")
        want = sorted(
            (
                e
                for e in events
                if e.type in types
                and ((e.attrs["k"] in (keys or [0, 2])) if (per_key or keys) else True)
                and any(lo <= e.ts < hi for lo, hi in ranges)
            ),
            key=Event.order_key,
        )
        assert got == want
        if not per_key:
            lo, hi = ranges[0]
            counted = [
                e for e in events if e.type in types and (keys is None or e.attrs["k"] in keys) and lo <= e.ts < hi
            ]
            assert archive.count(types, keys, ranges[0], key_attr="k") == len(counted)


def test_memory_archive_selectivity_is_matches_per_event_of_the_pattern_types():
    archive = MemoryArchive()
    archive.extend([ev(i, "A", i, v=i % 4) for i in range(1, 101)] + [ev(200, "B", 1)])
    assert archive.selectivity(compile_query("PATTERN A a WHERE a.v = 0"), (0, 200 * S)) == 0.25
    assert archive.selectivity(compile_query("PATTERN A a"), (500 * S, 600 * S)) == 0.0


@pytest.mark.parametrize("algorithm", ["alaa", "llaa", "ollaa", "sllaa"])
def test_every_archive_request_names_the_archived_pattern(algorithm):
    """Runner.request passes ``P_A`` to the source, which may leave out events none of its matches can hold."""

    class Recording(MemoryArchive):
        def __init__(self) -> None:
            super().__init__()
            self.patterns: list = []

        def extract(self, types, keys, ranges, *, key_attr=None, pattern=None):
            self.patterns.append(pattern)
            return super().extract(types, keys, ranges, key_attr=key_attr, pattern=pattern)

    plan = compile_live_archived(SPEEDING)
    source = Recording()
    events = [ev(1, "Pass", 0, car="x", checkpoint="A"), ev(2, "Pass", 60, car="x", checkpoint="B")]
    runner = make_runner(algorithm, plan, source, tolerance_us=0)
    got = list(replay(events, runner, source.append))
    assert [r.ids() for r in got] == [{"p": [2], "q": [1]}]
    assert source.patterns and all(p is plan.archived for p in source.patterns)


def test_the_event_time_delay_is_measured_when_the_request_is_made_not_when_it_is_answered():
    """Issue 25: a deferred request answered after the stream's event time jumped by years reported a delay of
    years (the watermark at the answer). The delay is the event time from the instance's completion to its
    request: here the LLAA request goes out at once (0), and an answer after a 3-year jump changes nothing."""
    q = "LIVE PATTERN B b ARCHIVED PATTERN A a LOOKBACK 1 min"
    plan = compile_live_archived(q)
    archive = MemoryArchive()
    deferred = []
    runner = make_runner("llaa", plan, archive, defer=deferred.append)
    for e in [ev(1, "A", 1), ev(2, "B", 12)]:
        archive.append(e)
        assert runner.push(e) == []
    assert len(deferred) == 1
    jump = ev(3, "X", 3 * 365 * 86_400)
    archive.append(jump)
    runner.push(jump)  # the watermark moves on by 3 years before the request is answered
    assert len(deferred[0].run()) == 1
    assert runner.counters.delay_event_us == [0]
