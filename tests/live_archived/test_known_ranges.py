"""Requests that read only what no earlier request of their key read (engine/live_archived/known_ranges.py, issue 43):
the same results, in the same order, as requests that read their whole access ranges, with far fewer rows read."""
from __future__ import annotations

import random
import threading

import pytest

from engine.events import Event
from engine.live_archived import compile_live_archived, run_memory
from engine.live_archived.known_ranges import KnownRanges, subtract
from engine.live_archived.runner import make_runner
from engine.live_archived.source import MemoryArchive

S = 1_000_000
GROUPED = """
LIVE PATTERN SEQ(s a, s b) WHERE a.v > 70 AND b.v > 70 PARTITION BY k STRATEGY partition_contiguity WITHIN 60 s
ARCHIVED PATTERN s c WHERE c.v < 30 PARTITION BY k
LOOKBACK 10 min
JOIN a.k = c.k
RETURN a.k AS k, count(c) AS n, min(c.ts) AS first, max(c.ts) AS last, sum(c.v) AS total
"""
PAIRWISE = GROUPED.replace(
    "RETURN a.k AS k, count(c) AS n, min(c.ts) AS first, max(c.ts) AS last, sum(c.v) AS total",
    "RETURN a.k AS k, c.v AS v",
)
EQUI = GROUPED.replace("JOIN a.k = c.k", "JOIN a.k = c.k AND a.g = c.g")
NO_KEY = GROUPED.replace("JOIN a.k = c.k", "JOIN a.g = c.g")
TWO_TYPES = GROUPED.replace("ARCHIVED PATTERN s c", "ARCHIVED PATTERN t c")


def stream(seed: int, n: int = 3000) -> list[Event]:
    rng = random.Random(seed)
    ts = 0
    out = []
    for i in range(1, n + 1):
        ts += rng.randrange(0, 2 * S)  # ties too
        out.append(Event(i, "s", ts, {"k": rng.randrange(6), "v": rng.randrange(100), "g": rng.randrange(3)}))
    return out


def results(text: str, algorithm: str, events: list[Event], **options: object) -> tuple[list, object]:
    found, runner = run_memory(compile_live_archived(text), algorithm, events, **options)
    return [(r.key(), r.start, r.end, r.fields) for r in found], runner


@pytest.mark.parametrize("text", [GROUPED, PAIRWISE, EQUI, NO_KEY])
@pytest.mark.parametrize("algorithm,options", [
    ("llaa", {}), ("sllaa", {"tolerance_us": 30 * S}), ("sllaa", {"tolerance_us": 0, "max_batch": 3}),
    ("ollaa", {"mode": "live"}),
])
def test_results_equal_whole_range_requests_with_fewer_rows_read(text, algorithm, options):
    events = stream(1)
    want, plain = results(text, algorithm, events, **options)
    got, known = results(text, algorithm, events, known_ranges=True, **options)
    assert known.known_ranges is not None and plain.known_ranges is None
    assert got == want and len(want) > 20
    assert known.counters.archive_requests == plain.counters.archive_requests  # 001 section 6 counts these
    assert known.counters.archived_instances == plain.counters.archived_instances
    assert known.counters.archived_events_scanned * 3 < plain.counters.archived_events_scanned
    assert known.stats()["known_ranges"]["requests_from_memory"] >= 0


@pytest.mark.parametrize("algorithm,options", [("llaa", {}), ("sllaa", {"tolerance_us": 30 * S})])
def test_a_bound_that_forgets_still_gives_the_same_results(algorithm, options):
    events = stream(3)
    want, _ = results(EQUI, algorithm, events, **options)
    runner = make_runner(algorithm, compile_live_archived(EQUI), MemoryArchive(), known_ranges=True, **options)
    index_of = runner.known_ranges.index_of
    runner.known_ranges = KnownRanges(max_matches=5)  # forgets all the time
    if index_of is not None:  # SLLAA's hash index, forgotten with the rest
        runner.known_ranges.index_by(index_of)
    archive = runner.source
    got = []
    for e in events:
        archive.append(e)  # type: ignore[attr-defined]
        got += runner.push(e)
    got += runner.flush()
    assert [(r.key(), r.start, r.end, r.fields) for r in got] == want


def test_sllaa_with_unhashable_join_values_compares_them_pair_by_pair():
    """A list attribute in a JOIN equality turns the known ranges' hash index off; results stay those of whole
    reads."""
    events = stream(7, 1500)
    for e in events[::3]:
        e.attrs["g"] = [e.attrs["g"]]
    want, _ = results(EQUI, "sllaa", events, tolerance_us=30 * S)
    got, known = results(EQUI, "sllaa", events, tolerance_us=30 * S, known_ranges=True)
    assert got == want and len(want) > 5
    assert known.known_ranges.index_of is None


def test_it_is_off_where_a_range_read_may_still_change():
    """P_A over another type than P_L's (its late events are not refused by P_L's watermark), a P_A of two
    events, or a caller that did not vouch for its archive: whole ranges, as before."""
    two_types = make_runner("llaa", compile_live_archived(TWO_TYPES), MemoryArchive(), known_ranges=True)
    assert two_types.known_ranges is None
    two = GROUPED.replace("ARCHIVED PATTERN s c WHERE c.v < 30", "ARCHIVED PATTERN SEQ(s c, s d) WHERE c.v < 30")
    two = two.replace(", count(c) AS n, min(c.ts) AS first, max(c.ts) AS last, sum(c.v) AS total", ", count(c) AS n")
    assert make_runner("llaa", compile_live_archived(two), MemoryArchive(), known_ranges=True).known_ranges is None
    assert make_runner("llaa", compile_live_archived(GROUPED), MemoryArchive()).known_ranges is None


def test_subtract_and_concurrent_adds_keep_each_match_once():
    assert subtract([(0, 10)], [(0, 10)]) == []
    assert subtract([(0, 10), (12, 15)], [(2, 3), (5, 13)]) == [(0, 2), (3, 5), (13, 15)]
    events = stream(4, 400)
    runner = make_runner("llaa", compile_live_archived(GROUPED), MemoryArchive(), known_ranges=True)
    for e in events:
        runner.source.append(e)  # type: ignore[attr-defined]
    hi = events[-1].ts + 1
    requests = [{k: [(lo, hi)]} for k in range(6) for lo in (0, hi // 3, hi // 2)]
    threads = [threading.Thread(target=runner.archived_in, args=(r,)) for r in requests * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    whole = runner.archived_in({k: [(0, hi)] for k in range(6)})
    plain = make_runner("llaa", compile_live_archived(GROUPED), runner.source)
    for k in range(6):
        want = plain.match_archived(plain.request([k], [(0, hi)]))
        assert [m.key() for m in whole[k]] == [m.key() for m in want]


INTERVALS = """
LIVE PATTERN SEQ(iv a, iv b) WHERE a.v > 70 AND b.v > 70 PARTITION BY k STRATEGY partition_contiguity WITHIN 60 s
ARCHIVED PATTERN iv c WHERE c.v < 30 PARTITION BY k
LOOKBACK 10 min
JOIN a.k = c.k
RETURN a.k AS k, count(c) AS n, min(c.ts) AS first, max(c.ts) AS last
"""


@pytest.mark.parametrize("algorithm,options", [("llaa", {}), ("sllaa", {"tolerance_us": 30 * S})])
def test_interval_events_are_kept_by_their_end(algorithm, options):
    """An archived interval is read by its end (``ts_end``): kept and found by it, the same results."""
    rng = random.Random(5)
    events, ts = [], 0
    for i in range(1, 2001):
        ts += rng.randrange(0, 2 * S)
        end = ts + rng.randrange(1, 90 * S)  # long ones end after later ones start
        events.append(Event(i, "iv", ts, {"k": rng.randrange(4), "v": rng.randrange(100)}, end))
    events.sort(key=Event.order_key)
    plan = compile_live_archived(INTERVALS)
    want, plain = run_memory(plan, algorithm, events, **options)
    got, known = run_memory(plan, algorithm, events, known_ranges=True, **options)
    assert known.known_ranges is not None
    assert [(r.key(), r.start, r.end, r.fields) for r in got] == [(r.key(), r.start, r.end, r.fields) for r in want]
    assert len(want) > 10 and known.counters.archived_events_scanned < plain.counters.archived_events_scanned


def ingested(seed: int, n: int, lateness_us: int) -> list[Event]:
    """Events in ingest order as ingest takes them: each ends at or after the newest end so far minus the lateness."""
    rng = random.Random(seed)
    newest, out = 0, []
    for i in range(1, n + 1):
        newest += rng.randrange(0, 2 * S)
        ts = newest - rng.randrange(0, lateness_us + 1)  # late by up to the lateness (ties too)
        out.append(Event(i, "s", ts, {"k": rng.randrange(6), "v": rng.randrange(100), "g": rng.randrange(3)}))
    return out


@pytest.mark.parametrize("algorithm,options", [("llaa", {}), ("sllaa", {"tolerance_us": 30 * S})])
@pytest.mark.parametrize("max_events", [200_000, 40])
def test_a_runner_started_mid_stream_answers_the_newest_parts_from_the_events_it_was_fed(
    algorithm, options, max_events
):
    """The archive holds what was ingested before the runner's first event (ending up to ``lateness`` after it);
    the runner is fed the rest in ingest order. Parts before ``first end + lateness`` are read, later ones come
    from the fed events (also when most were forgotten: ``max_events`` 40), with the results of whole reads."""
    lateness = 20 * S
    events = ingested(6, 3000, lateness)
    before, after = events[:1200], events[1200:]

    def run(known: bool) -> tuple[list, object]:
        archive = MemoryArchive()
        for e in before:
            archive.append(e)
        runner = make_runner(algorithm, compile_live_archived(GROUPED), archive, known_ranges=known,
                             allowed_lateness_us=lateness, **options)
        if runner.fed is not None:
            runner.fed.max_matches = max_events
        found = []
        for e in after:
            archive.append(e)
            found += runner.push(e)
        found += runner.flush()
        return [(r.key(), r.start, r.end, r.fields) for r in found], runner

    want, plain = run(False)
    got, known = run(True)
    assert got == want and len(want) > 20
    stats = known.stats()["known_ranges"]
    if max_events > 1000:  # each key's first request reads the archive, the rest come from the fed events
        assert stats["requests_from_memory"] > known.counters.archive_requests * 3 // 4
        assert known.counters.archived_events_scanned < len(before)
        assert stats["fed_events"] == len(after)
        assert known.known_ranges.every  # the first request read every key at once
    else:
        assert stats["fed_matches"] <= max_events + 10  # forgotten as fed (a request matches, then trims)


def test_fed_events_never_claim_a_range_they_forgot():
    """Past the bound the older half of ``[lo, hi)`` is forgotten and ``lo`` moves up; no later batch moves it back
    below what was forgotten, and a request there is left to the archive."""
    runner = make_runner("llaa", compile_live_archived(GROUPED), MemoryArchive(), known_ranges=True)
    fed = runner.fed
    fed.max_matches = 50
    events = [Event(i, "s", i * S, {"k": i % 3, "v": 10, "g": 0}) for i in range(1, 401)]
    for i in range(0, 400, 20):
        fed.feed(events[i:i + 20])
    covered, found, rest = fed.take({0: [(0, 400 * S)]})
    lo, hi = fed.complete()
    assert fed.floor is not None and lo == fed.floor > S and hi == 400 * S
    assert covered == {0: [(lo, hi)]} and rest == {0: [(0, lo)]}
    assert sorted(m.end for m in found[0]) == [e.ts for e in events if e.attrs["k"] == 0 and lo <= e.ts < hi]
    fed.feed([Event(401, "s", 2 * S, {"k": 0, "v": 10, "g": 0})])  # ends long before: lo stays where it was
    assert fed.complete()[0] == lo
