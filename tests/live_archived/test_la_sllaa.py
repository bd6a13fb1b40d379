"""SLLAA (001 section 4.3 (2), Lemma 1): subwindows, one request each, nothing lost at their edges."""
from __future__ import annotations

import pytest

from engine.events import Event
from engine.live_archived import compile_live_archived, run_memory

S = 1_000_000


def ev(i: int, t: str, ts_s: float, **attrs) -> Event:
    return Event(i, t, int(ts_s * S), attrs)


QUERY = """
LIVE PATTERN SEQ(B b)
ARCHIVED PATTERN SEQ(A a, C c) WITHIN 5 s
LOOKBACK 10 s
"""
# live B at 10, 11 | 13.5, 14 | 20 (T_L = 2 s: three subwindows); archived pairs (a, c) whose
# access ranges straddle the subwindows, and one pair (a@8, c@10.2) inside the union of the first
# subwindow's ranges but inside only the second instance's own range
EVENTS = sorted(
    [
        ev(1, "A", 1), ev(2, "C", 3), ev(3, "A", 5), ev(4, "C", 9), ev(5, "A", 8), ev(6, "B", 10),
        ev(7, "C", 10.2), ev(8, "B", 11), ev(9, "A", 12), ev(10, "C", 13), ev(11, "B", 13.5), ev(12, "B", 14),
        ev(13, "C", 19), ev(14, "B", 20),
    ],
    key=Event.order_key,
)


def pairs(results) -> set[tuple[int, int, int]]:
    return {(r.ids()["b"][0], r.ids()["a"][0], r.ids()["c"][0]) for r in results}


def expected() -> set[tuple[int, int, int]]:
    a = [e for e in EVENTS if e.type == "A"]
    c = [e for e in EVENTS if e.type == "C"]
    out = set()
    for b in (e for e in EVENTS if e.type == "B"):
        for x in a:
            for y in c:
                if x.ts < y.ts and y.ts - x.ts <= 5 * S and x.ts >= b.ts - 10 * S and y.ts < b.ts:
                    out.add((b.id, x.id, y.id))
    return out


def test_instances_whose_ranges_straddle_subwindows_lose_nothing():
    plan = compile_live_archived(QUERY)
    got, runner = run_memory(plan, "sllaa", EVENTS, tolerance_us=2 * S)
    assert pairs(got) == expected()
    assert (8, 5, 7) in pairs(got) and (6, 5, 7) not in pairs(got)  # a@8, c@10.2: only in B@11's own range
    assert runner.counters.archive_requests == 3 == runner.stats()["sllaa"]["subwindows"]
    llaa, baseline = run_memory(plan, "llaa", EVENTS)
    assert pairs(llaa) == pairs(got) and baseline.counters.archive_requests == 5


def test_one_request_per_subwindow_covers_the_merged_union_of_its_ranges():
    plan = compile_live_archived(QUERY)
    _, sllaa = run_memory(plan, "sllaa", EVENTS, tolerance_us=2 * S)
    _, llaa = run_memory(plan, "llaa", EVENTS)
    # B@10 and B@11 read [0, 11) once instead of [0, 10) and [1, 11); likewise [3.5, 14)
    assert sllaa.counters.archived_events_scanned < llaa.counters.archived_events_scanned


@pytest.mark.parametrize("tolerance_s, requests", [(0, 5), (2, 3), (4, 2), (100, 1)])
def test_a_subwindow_closes_when_the_watermark_passes_its_earliest_start_plus_the_tolerance(tolerance_s, requests):
    plan = compile_live_archived(QUERY)
    got, runner = run_memory(plan, "sllaa", EVENTS, tolerance_us=tolerance_s * S)
    assert pairs(got) == expected()
    assert runner.counters.archive_requests == requests
    # a result waits at most until the first event after its subwindow's deadline
    assert max(runner.counters.delay_event_us) <= max(tolerance_s * S, 0) + 6 * S


def test_max_batch_closes_a_subwindow_early_and_max_batch_one_is_llaa():
    plan = compile_live_archived(QUERY)
    got, runner = run_memory(plan, "sllaa", EVENTS, tolerance_us=100 * S, max_batch=2)
    assert pairs(got) == expected() and runner.counters.archive_requests == 3
    got, runner = run_memory(plan, "sllaa", EVENTS, tolerance_us=100 * S, max_batch=1)
    assert pairs(got) == expected() and runner.counters.archive_requests == 5


def test_keyed_subwindow_requests_each_key_over_its_own_ranges():
    q = """
    LIVE PATTERN SEQ(B b) PARTITION BY k
    ARCHIVED PATTERN SEQ(A a) PARTITION BY k
    LOOKBACK 5 s
    JOIN b.k = a.k
    """
    events = [ev(1, "A", 1, k=1), ev(2, "A", 2, k=2), ev(3, "A", 7, k=2), ev(4, "B", 8, k=1), ev(5, "B", 9, k=2)]
    plan = compile_live_archived(q)
    assert plan.key is not None and plan.key.attr == "k"
    got, runner = run_memory(plan, "sllaa", events, tolerance_us=10 * S)
    assert {(r.ids()["b"][0], r.ids()["a"][0]) for r in got} == {(5, 3)}
    # key 1 reads [3, 8), key 2 reads [4, 9): a@1 and a@2 are never scanned
    assert runner.counters.archive_requests == 1 and runner.counters.archived_events_scanned == 1


def test_bad_tolerance_or_batch_is_refused():
    plan = compile_live_archived(QUERY)
    with pytest.raises(ValueError):
        run_memory(plan, "sllaa", EVENTS, tolerance_us=-1)
    with pytest.raises(ValueError):
        run_memory(plan, "sllaa", EVENTS, max_batch=0)


def test_deferred_subwindows_merged_into_one_request_give_the_same_results():
    """The service defers SLLAA's requests and merges subwindows that wait together (ArchiveWork.merged)."""
    from engine.live_archived import MemoryArchive
    from engine.live_archived.base import ArchiveWork
    from engine.live_archived.runner import make_runner

    plan = compile_live_archived(QUERY)
    archive = MemoryArchive()
    works: list[ArchiveWork] = []
    runner = make_runner("sllaa", plan, archive, tolerance_us=2 * S, defer=works.append)
    for e in EVENTS:
        archive.append(e)
        assert runner.push(e) == []  # deferred: nothing comes from push
    assert runner.flush() == []
    assert len(works) == 3 and all(w.mergeable for w in works)
    requests_before = runner.counters.archive_requests
    merged = ArchiveWork.merged(works)
    assert pairs(merged.run()) == expected()
    assert runner.counters.archive_requests == requests_before + 1  # one request for three subwindows
    assert pairs([m for w in works for m in w.run()]) == expected()


def test_alaa_closes_its_live_window_when_the_streams_are_quiet():
    """ALAA's live window batches the archive's catch-up, like an SLLAA subwindow: when the streams go quiet
    (``idle``) its complete instances are joined at once, with the results the end of input would give."""
    from engine.live_archived.runner import make_runner
    from engine.live_archived.source import MemoryArchive

    plan = compile_live_archived(QUERY)
    archive = MemoryArchive()
    runner = make_runner("alaa", plan, archive)
    got = []
    for e in EVENTS:
        archive.append(e)
        got += runner.push(e)
    assert runner.waiting()  # the last live window is open: nothing more comes in event time
    got += runner.idle()
    assert pairs(got) == expected() and not runner.waiting()
    assert runner.flush() == []  # the end of input finds nothing left
