"""Every algorithm equals the brute-force oracle on random small streams (docs/architecture.md section 7.7).

Random live and archived patterns (every operator, Kleene, negation, windows, partitions,
strategies), random JOINs and look-backs, over streams of up to 25 events, with a memory archive.
"""
from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.live_archived import compile_live_archived, run_memory
from engine.live_archived.runner import make_runner
from engine.live_archived.source import MemoryArchive
from engine.lql.parser import parse
from tests.live_archived.cases import la_cases
from tests.live_archived.oracle import expected_results

SECOND = 1_000_000
SETTINGS = settings(max_examples=120, suppress_health_check=list(HealthCheck), deadline=None)


def check(case, algorithm: str, **options) -> None:
    query = parse(case.text)
    results, runner = run_memory(compile_live_archived(query), algorithm, case.events, **options)
    got = [r.key() for r in results]
    assert len(got) == len(set(got)), f"{algorithm} emitted a pair twice"
    want = expected_results(query, case.events)
    assert set(got) == want, f"{algorithm} {options}: extra {set(got) - want}, missing {want - set(got)}"
    assert runner.counters.results == len(got)


@SETTINGS
@given(la_cases(), st.integers(0, 4), st.integers(1, 5), st.integers(1, 4))
def test_every_algorithm_equals_the_oracle(case, tolerance_s, max_batch, window_s):
    check(case, "llaa")
    check(case, "sllaa", tolerance_us=tolerance_s * SECOND, max_batch=max_batch)
    check(case, "alaa", window_us=window_s * SECOND)
    check(case, "ollaa", mode="archive", tolerance_us=tolerance_s * SECOND // 2, sample_rate=0.0)
    check(case, "ollaa", mode="live")
    # requests that read only what no earlier request read (a one-event P_A over P_L's one type; others ignore it)
    check(case, "llaa", known_ranges=True)
    check(case, "sllaa", tolerance_us=tolerance_s * SECOND, max_batch=max_batch, known_ranges=True)
    check(case, "ollaa", mode="live", known_ranges=True)


@settings(max_examples=80, suppress_health_check=list(HealthCheck), deadline=None)
@given(la_cases(), st.integers(0, 3), st.integers(1, 4))
def test_ollaa_switching_modes_at_every_decision_loses_and_adds_nothing(case, tolerance_s, every_s):
    flip = itertools.cycle(["archive", "live"])
    check(
        case,
        "ollaa",
        tolerance_us=tolerance_s * SECOND,
        decide_every_us=every_s * SECOND,
        min_sample=0,
        sample_rate=0.0,
        chooser=lambda sel_live, sel_archived: next(flip),
    )


@settings(max_examples=100, suppress_health_check=list(HealthCheck), deadline=None)
@given(la_cases(keyed=True), st.integers(0, 3), st.sampled_from([0.0, 0.5]))
def test_ollaa_filtering_live_events_by_key_is_exact(case, tolerance_s, sample_rate):
    check(case, "ollaa", mode="archive", tolerance_us=tolerance_s * SECOND, sample_rate=sample_rate)
    check(case, "sllaa", tolerance_us=tolerance_s * SECOND)


@settings(max_examples=60, suppress_health_check=list(HealthCheck), deadline=None)
@given(la_cases(), st.lists(st.integers(1, 6), min_size=1, max_size=30), st.integers(0, 3))
def test_events_pushed_in_batches_give_the_oracles_results(case, sizes, tolerance_s):
    """:meth:`Runner.push_many` (a service worker's batch, archived before it is matched) equals pushing one by
    one: every algorithm, random batch sizes."""
    query = parse(case.text)
    want = expected_results(query, case.events)
    for algorithm, options in (
        ("llaa", {}), ("sllaa", {"tolerance_us": tolerance_s * SECOND}), ("alaa", {"window_us": SECOND}),
        ("ollaa", {"mode": "live"}),
    ):
        archive = MemoryArchive()
        runner = make_runner(algorithm, compile_live_archived(query), archive, **options)
        results, events, pushed, late = [], list(case.events), 0, 0
        for n in itertools.cycle(sizes):
            batch, events = events[:n], events[n:]
            if not batch:
                break
            for e in batch:
                archive.append(e)
            found, dropped = runner.push_many(batch)
            results += found
            pushed, late = pushed + len(batch), late + dropped
        results += runner.flush()
        got = [r.key() for r in results]
        assert set(got) == want and len(got) == len(want), algorithm
        assert runner.counters.live_events == pushed == len(case.events)
        assert late == runner.live.stats()["late"]
