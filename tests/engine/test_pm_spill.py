"""Partial-match management: spilling never changes results (docs/architecture.md section 7.6).

With ``pm_capacity=10`` (and a spill batch of 1-3), every strategy, both storages and both
policies give exactly the matches of an unbounded matcher; the counters add up.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.compiler import compile_query
from engine.events import MICROS_PER_S, Event
from engine.matcher import Matcher
from engine.pm.policy import STPM, TPM
from engine.pm.store import MemoryStore
from tests.engine.patterns import Case, cases


def keys(text: str, events: list, **kw) -> list:
    m = Matcher(compile_query(text), **kw)
    out = []
    for e in events:
        out += m.push(e)
    out += m.flush()
    assert m.stats()["live_partial_matches"] == 0
    return sorted(sorted(k) for k in (x.key() for x in out))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases(min_events=12), storage=st.sampled_from(["chain", "runs"]), policy=st.sampled_from(["stpm", "tpm"]),
       capacity=st.integers(1, 10), batch=st.integers(1, 3))
def test_spilling_never_changes_results(case: Case, storage: str, policy: str, capacity: int, batch: int) -> None:
    expected = keys(case.text, case.events, storage=storage)
    got = keys(case.text, case.events, storage=storage, pm_capacity=capacity, pm_policy=policy, pm_batch=batch)
    assert got == expected, case.describe()


@pytest.mark.parametrize("storage", ["chain", "runs"])
@pytest.mark.parametrize("policy", ["stpm", "tpm"])
def test_bench_stream_with_capacity_10_gives_the_published_counts(bench_10k, storage, policy):
    store = MemoryStore()
    m = Matcher(compile_query("PATTERN SEQ(A a, B b, C c) PARTITION BY key WITHIN 1 s"), storage=storage,
                pm_capacity=10, pm_policy=policy, pm_store=store)
    n = sum(len(m.push(e)) for e in bench_10k) + len(m.flush())
    s = m.stats()
    assert n == 9_899
    assert s["spilled"] > 0 and s["reloaded"] > 0 and s["misses"] > 0
    # every spilled partial match was reloaded or expired (or dropped at the end of the stream)
    assert s["reloaded"] + s["expired"] <= s["spilled"]
    assert s["pms_bytes"] == 0 and s["spilled_now"] == 0


def test_capacity_keeps_memory_bounded(bench_10k):
    m = Matcher(compile_query("PATTERN SEQ(A a, B+ b[], C c) PARTITION BY key WITHIN 1 s"), storage="runs",
                pm_capacity=50, pm_batch=5)
    peak_in_memory = 0
    for e in bench_10k:
        m.push(e)
        peak_in_memory = max(peak_in_memory, m.stats()["live"])
    unbounded = Matcher(compile_query("PATTERN SEQ(A a, B+ b[], C c) PARTITION BY key WITHIN 1 s"), storage="runs")
    for e in bench_10k:
        unbounded.push(e)
    assert unbounded.stats()["peak_live"] > 200
    # after each event the buffer is back within capacity (a reload may overshoot during the event)
    assert peak_in_memory <= 50


def test_stpm_drops_stale_records_and_spills_lowest_priority_first():
    p = STPM()
    p.touch((0, "k1", 0), 100, 0, 1)
    p.touch((0, "k2", 0), 50, 0, 1)
    assert next(p.victims()) == (0, "k2", 0)  # the tree is built here; later touches add records
    p.touch((0, "k2", 0), 60, 0, 1)
    p.touch((0, "k1", 0), 10, 500, 1)  # k1 updated: W = 510, its W = 100 record is stale
    assert list(p.victims()) == [(0, "k2", 0), (0, "k1", 0)]


def test_tpm_spills_the_oldest_created_partial_matches_even_if_recently_updated():
    p = TPM()
    p.touch((0, "old", 2), 900, 0, 1)  # a partial match created at 1 that just reached state 2
    p.touch((0, "new", 0), 500, 0, 500)
    assert list(p.victims()) == [(0, "old", 2), (0, "new", 0)]


def test_bad_capacity_and_policy_are_rejected():
    q = compile_query("PATTERN SEQ(A a, B b)")
    with pytest.raises(ValueError, match="at least 1"):
        Matcher(q, pm_capacity=0)
    with pytest.raises(ValueError, match="unknown partial-match policy"):
        Matcher(q, pm_capacity=5, pm_policy="lru")


def _stream(spec: list[tuple[str, int, str]]) -> list[Event]:
    """(type, ts in seconds, key) -> events with ids in order."""
    return [Event(i, t, s * MICROS_PER_S, {"key": k}) for i, (t, s, k) in enumerate(spec, start=1)]


SEQ_ABC = "PATTERN SEQ(A a, B b, C c) PARTITION BY key WITHIN 100 s"


@pytest.mark.parametrize("policy", ["stpm", "tpm"])
def test_a_buffer_that_never_fills_records_nothing(policy):
    events = _stream([("A", 1, "x"), ("B", 2, "x"), ("A", 3, "y"), ("C", 4, "x"), ("B", 5, "y")])
    m = Matcher(compile_query(SEQ_ABC), storage="runs", pm_capacity=1_000, pm_policy=policy)
    for e in events:
        m.push(e)
    pmb = m.pmb
    assert pmb is not None and not pmb.watching and not pmb.active
    assert len(pmb.policy) == 0 and pmb.last_seen == [{}] and pmb.seen == [[0, 0, 0]]  # type: ignore[arg-type]
    s = m.stats()
    assert s["hits"] == 5 and s["misses"] == 0 and s["spilled"] == 0


@pytest.mark.parametrize("storage", ["chain", "runs"])
def test_stpm_bootstraps_its_estimates_from_the_resident_partial_matches(storage):
    # x: A@1 -> B@4; y: A@2 -> B@3; then z's A@5 is the 5th partial match (A, AB of x and y): over capacity 4
    events = _stream([("A", 1, "x"), ("A", 2, "y"), ("B", 3, "y"), ("B", 4, "x"), ("A", 5, "z")])
    m = Matcher(compile_query(SEQ_ABC + " STRATEGY skip_till_any_match"), storage=storage, pm_capacity=4, pm_batch=1)
    for e in events[:-1]:
        m.push(e)
    pmb = m.pmb
    assert pmb is not None and not pmb.active and pmb.seen == [[0, 0, 0]]
    m.push(events[-1])
    assert pmb.active and m.stats()["spilled"] >= 1
    # A events of x, y, z seen, x's and y's followed by a B; the largest A -> B gap is x's 3 s
    assert pmb.seen[0][0] == 3 and pmb.followed[0][0] == 2 and pmb.max_gap[0][0] == 3 * MICROS_PER_S
    assert pmb.weight(0, 0) == pytest.approx(3 * MICROS_PER_S * 2 / 3)
    # B -> C completes matches, which are not kept: that transition is learnt online only
    assert pmb.seen[0][1] == 0 and pmb.weight(0, 1) == 0.0
    m.push(Event(6, "C", 7 * MICROS_PER_S, {"key": "y"}))  # y's B@3 followed by C@7
    assert pmb.followed[0][1] == 1 and pmb.max_gap[0][1] == 4 * MICROS_PER_S


def test_rows_left_in_the_store_by_an_interrupted_run_are_not_read_back():
    q = compile_query("PATTERN SEQ(A a, B b) PARTITION BY key WITHIN 100 s STRATEGY skip_till_any_match")
    events = _stream([("A", 1, "x"), ("A", 2, "y"), ("A", 3, "z"), ("B", 4, "x"), ("B", 5, "y"), ("B", 6, "z")])
    store = MemoryStore()
    interrupted = Matcher(q, pm_capacity=1, pm_batch=1, pm_store=store)
    for e in events[:3]:
        interrupted.push(e)  # x's and y's A are in the store; no flush
    assert interrupted.stats()["spilled_now"] == 2
    rerun = Matcher(q, pm_capacity=1, pm_batch=1, pm_store=store)
    found = [x for e in events[1:] for x in rerun.push(e)] + rerun.flush()  # from y's A on: no A for x
    plain = Matcher(q)
    expected = [x for e in events[1:] for x in plain.push(e)] + plain.flush()
    assert sorted(x.key() for x in found) == sorted(x.key() for x in expected) and len(expected) == 2
