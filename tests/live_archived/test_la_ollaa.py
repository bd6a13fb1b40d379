"""OLLAA (001 section 4.3 (1)): the side with the lower selectivity drives; the choice is reported."""
from __future__ import annotations

import random

import pytest

from engine.events import Event
from engine.live_archived import compile_live_archived, run_memory

S = 1_000_000
QUERY = """
LIVE     PATTERN SEQ(T l) PARTITION BY key
ARCHIVED PATTERN SEQ(T a) WHERE a.v < {theta} PARTITION BY key
LOOKBACK 30 s
JOIN     l.key = a.key
"""


def stream(n: int = 3000, keys: int = 20, seed: int = 1) -> list[Event]:
    rng = random.Random(seed)
    return [Event(i, "T", i * S, {"key": rng.randrange(keys), "v": rng.random()}) for i in range(1, n + 1)]


def keys_of(results) -> set:
    return {r.key() for r in results}


@pytest.mark.parametrize("theta, mode", [(0.05, "archive"), (1.0, "live")])
def test_the_lower_selectivity_side_drives_and_the_choice_is_reported(theta, mode):
    plan = compile_live_archived(QUERY.format(theta=theta))
    events = stream()
    got, runner = run_memory(plan, "ollaa", events, tolerance_us=10 * S, decide_every_us=300 * S)
    want, llaa = run_memory(plan, "llaa", events)
    assert keys_of(got) == keys_of(want) and len(got) == len(want)
    report = runner.stats()["ollaa"]
    decided = [d for d in report["decisions"] if "sel_live" in d]
    assert decided and all(d["mode"] == mode for d in decided)
    assert report["mode"] == mode
    # every live event is a live instance: Sel_PL = 1; Sel_PA is about theta
    assert all(d["sel_live"] == pytest.approx(1.0, abs=0.05) for d in decided)
    assert all(d["sel_archived"] == pytest.approx(theta, abs=0.05) for d in decided)
    assert runner.counters.stat_requests >= len(decided)
    if mode == "archive":
        assert report["filter_attr"] == "key" and report["live_events_filtered"] > 0
        assert runner.counters.archive_requests < llaa.counters.archive_requests / 5
        assert runner.counters.archived_events_scanned < llaa.counters.archived_events_scanned
    else:
        assert report["switches"] == 0


def test_without_enough_events_ollaa_stays_live_driven():
    plan = compile_live_archived(QUERY.format(theta=0.05))
    events = stream(n=150)
    got, runner = run_memory(plan, "ollaa", events, decide_every_us=50 * S)
    assert runner.stats()["ollaa"]["mode"] == "live"
    assert all(d["reason"] == "too few events to estimate" for d in runner.stats()["ollaa"]["decisions"])
    assert keys_of(got) == keys_of(run_memory(plan, "llaa", events)[0])


def test_a_fixed_mode_is_kept_and_bad_modes_are_refused():
    plan = compile_live_archived(QUERY.format(theta=0.5))
    _, runner = run_memory(plan, "ollaa", stream(n=400), mode="archive", decide_every_us=50 * S)
    assert runner.stats()["ollaa"]["mode"] == "archive" and runner.counters.stat_requests == 0
    with pytest.raises(ValueError, match="mode"):
        run_memory(plan, "ollaa", [], mode="sometimes")


def test_archive_driven_ollaa_runs_its_held_live_events_when_the_streams_are_quiet():
    """In archive-driven mode live events wait for the next archive refresh (every ``T_L``), like an SLLAA
    subwindow: when the streams go quiet (``idle``, and a pause) they are run at once, with the results the end of
    input gives, and nothing comes twice after."""
    from engine.live_archived.runner import make_runner
    from engine.live_archived.source import MemoryArchive

    plan = compile_live_archived(QUERY.format(theta=0.5))
    events = stream(n=400)
    want, _ = run_memory(plan, "llaa", events)
    archive = MemoryArchive()
    runner = make_runner("ollaa", plan, archive, tolerance_us=60 * S, mode="archive", decide_every_us=50 * S)
    got = []
    for e in events:
        archive.append(e)
        got += runner.push(e)
    assert runner.batch  # held for the refresh: nothing more comes in event time
    got += runner.idle()
    assert not runner.batch and runner.idle() == []
    got += runner.flush()
    assert sorted(r.ids()["l"] for r in got) == sorted(r.ids()["l"] for r in want) and len(got) == len(want)
