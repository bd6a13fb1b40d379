"""Issue 15: live-and-archived over interval events: the JOIN relates a live interval to archived ones
("the same segment jammed now and within the last 14 days" with a relation on their times)."""
from __future__ import annotations

import pytest

from engine.events import Event
from engine.live_archived import ALGORITHMS, compile_live_archived, make_runner, replay
from engine.live_archived.source import MemoryArchive

H = 3_600_000_000
D = 24 * H
QUERY = """LIVE PATTERN SEQ(episode e)
ARCHIVED PATTERN SEQ(episode p)
LOOKBACK 14 d
JOIN e.key = p.key AND p BEFORE(1 d) e AND p.duration >= 1 h
RETURN e.key AS key, p.ts AS before_ts"""


def episode(i: int, key: int, start_h: float, hours: float) -> Event:
    return Event(i, "episode", int(start_h * H), {"key": key}, int((start_h + hours) * H))


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_a_live_interval_joins_archived_intervals_by_relation(algorithm: str) -> None:
    plan = compile_live_archived(QUERY)
    past = [
        episode(1, 7, 0, 2),  # key 7, ends at 2 h, 198 h before the live one -> BEFORE(1 d) holds
        episode(2, 7, 100, 0.5),  # too short (30 min)
        episode(3, 8, 10, 3),  # another key
        episode(4, 7, 180, 2),  # ends at 182 h, 18 h before the live one: under the 1 d minimum gap
    ]
    live = [episode(5, 7, 200, 1), episode(6, 8, 201, 1)]  # access ranges [start - 14 d, start)
    archive = MemoryArchive()
    for e in past:
        archive.append(e)
    options = {"alaa": {"window_us": 20 * D}}.get(algorithm, {})
    runner = make_runner(algorithm, plan, archive, **options)
    results = list(replay(live, runner, archive.append))
    got = sorted((m.fields["key"], m.fields["before_ts"] // H) for m in results)
    assert got == [(7, 0), (8, 10)]


# ---------------------------------------------------------------------------- issue 24 item 4
# The archived side of a live-and-archived query over interval events: requests select archived events by
# their end and the matcher gets them in (ts_end, id) order; an archived interval lies in the access range
# when it starts at or after I.start - lookback and ends before I.start (docs/semantics.md section 6).

SECOND = 1_000_000
ORDERED = """LIVE PATTERN SEQ(A a)
ARCHIVED PATTERN SEQ(B b)
LOOKBACK 100 seconds
RETURN a.x AS ax"""


def options(algorithm: str) -> dict:
    return {"alaa": {"window_us": 5 * SECOND}, "sllaa": {"tolerance_us": 0}}.get(algorithm, {})


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_an_archived_interval_that_starts_later_and_ends_earlier_is_found(algorithm: str) -> None:
    """b1 = [0, 50) s, b2 = [10, 20) s: b2 starts after b1 and ends before it; both end before a starts."""
    from engine.live_archived import run_memory

    stream = [
        Event(2, "B", 10 * SECOND, {"x": 0}, 20 * SECOND),
        Event(1, "B", 0, {"x": 0}, 50 * SECOND),
        Event(3, "A", 60 * SECOND, {"x": 1}),
    ]
    results, _ = run_memory(compile_live_archived(ORDERED), algorithm, stream, **options(algorithm))
    assert sorted(r.ids()["b"][0] for r in results) == [1, 2]


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_an_archived_interval_still_running_at_the_live_start_is_not_in_the_access_range(algorithm: str) -> None:
    from engine.live_archived import run_memory

    stream = [
        Event(1, "B", 0, {"x": 0}, 30 * SECOND),  # ends before a starts: in range
        Event(3, "A", 40 * SECOND, {"x": 1}),
        Event(2, "B", 20 * SECOND, {"x": 0}, 50 * SECOND),  # started before a, ends after a started: not in range
        Event(4, "A", 60 * SECOND, {"x": 1}, 70 * SECOND),  # 2 ended at 50 s < 60 s: in its range
    ]
    results, _ = run_memory(compile_live_archived(ORDERED), algorithm, stream, **options(algorithm))
    got = sorted((r.ids()["a"][0], r.ids()["b"][0]) for r in results)
    assert got == [(3, 1), (4, 1), (4, 2)]


def _intervals(case, durations: list[int]):
    """``case``'s events in (ts_end, id) order, those of types only the ARCHIVED side reads lasting
    ``durations[i]`` half-seconds (0: a point event). The live side keeps point events: a one-event live
    pattern without WITHIN has a live span of 0, which holds for point events only (see the report of
    issue 24 item 4: interval events on the LIVE side of such a pattern are not covered here)."""
    live = compile_live_archived(case.text).live_types
    out = [
        Event(e.id, e.type, e.ts, dict(e.attrs), e.ts + (0 if e.type in live else d * SECOND // 2))
        for e, d in zip(case.events, durations, strict=False)
    ]
    return sorted(out, key=Event.order_key)


def _check(case, events, algorithm: str, **opts) -> None:
    from engine.live_archived import run_memory
    from engine.lql.parser import parse
    from tests.live_archived.oracle import expected_results

    query = parse(case.text)
    results, _ = run_memory(compile_live_archived(query), algorithm, events, **opts)
    got = [r.key() for r in results]
    assert len(got) == len(set(got)), f"{algorithm} emitted a pair twice"
    want = expected_results(query, events)
    assert set(got) == want, (
        f"{algorithm} {opts}: extra {set(got) - want}, missing {want - set(got)}\n{case.text}\n"
        + "\n".join(repr(e) for e in events)
    )


def _random_interval_cases():
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tests.live_archived.cases import la_cases

    return (
        settings(max_examples=150, suppress_health_check=list(HealthCheck), deadline=None),
        given(la_cases(), st.lists(st.integers(0, 8), min_size=30, max_size=30), st.integers(0, 4), st.integers(1, 4)),
    )


_settings, _given = _random_interval_cases()


@_settings
@_given
def test_every_algorithm_equals_the_oracle_on_random_interval_streams(case, durations, tolerance_s, window_s) -> None:
    events = _intervals(case, durations)
    _check(case, events, "llaa")
    _check(case, events, "sllaa", tolerance_us=tolerance_s * SECOND)
    _check(case, events, "alaa", window_us=window_s * SECOND)
    _check(case, events, "ollaa", mode="archive", tolerance_us=tolerance_s * SECOND // 2, sample_rate=0.0)
    _check(case, events, "ollaa", mode="live")
