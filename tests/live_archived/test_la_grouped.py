"""The grouped RETURN form (an aggregate over an archived variable): one result per live instance.

It must equal the pairwise form grouped by live instance (tests/live_archived/grouping.py), for every
algorithm, on random small streams and on the demo data, and through ``lace replay``.
"""
from __future__ import annotations

import dataclasses
import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.demo import load_queries, load_stream, split_stream
from engine.events import Event
from engine.live_archived import ALGORITHMS, LiveArchivedPlan, compile_live_archived, make_runner, replay, run_memory
from engine.live_archived.source import MemoryArchive
from engine.lql.errors import QueryError
from engine.lql.parser import parse
from tests.live_archived.cases import la_cases
from tests.live_archived.grouping import as_groups, group_pairs, return_clause

SECOND = 1_000_000
HOUR = 3_600 * SECOND


def grouped_items(var: str) -> list[tuple[str, str, str | None, str]]:
    return [
        ("count", var, None, "n"),
        ("min", var, "ts", "lo"),
        ("max", var, "x", "hi"),
        ("first", var, "x", "fx"),
        ("last", var, "ts", "lt"),
        ("avg", var, "x", "ax"),
        ("sum", var, "x", "sx"),
    ]


def runs(algorithm: str, tolerance_s: int, max_batch: int, window_s: int) -> list[dict]:
    """Options of ``algorithm`` as the oracle test runs it (OLLAA in both fixed modes)."""
    if algorithm == "sllaa":
        return [{"tolerance_us": tolerance_s * SECOND, "max_batch": max_batch}]
    if algorithm == "alaa":
        return [{"window_us": window_s * SECOND}]
    if algorithm == "ollaa":  # both fixed modes, and a switch at every decision
        flip = itertools.cycle(["archive", "live"])
        switching = {"tolerance_us": tolerance_s * SECOND, "decide_every_us": window_s * SECOND, "min_sample": 0,
                     "sample_rate": 0.0, "chooser": lambda sel_live, sel_archived: next(flip)}
        return [{"mode": "archive", "tolerance_us": tolerance_s * SECOND // 2, "sample_rate": 0.0}, {"mode": "live"},
                switching]
    return [{}]


@settings(max_examples=80, suppress_health_check=list(HealthCheck), deadline=None)
@given(la_cases(), st.data(), st.integers(0, 4), st.integers(1, 5), st.integers(1, 4))
def test_grouped_form_equals_the_pairwise_form_grouped_by_live_instance(case, data, tolerance_s, max_batch, window_s):
    pairwise = compile_live_archived(parse(case.text))
    var = data.draw(st.sampled_from(pairwise.archived.variables))
    items = grouped_items(var)
    grouped = compile_live_archived(case.text + "\n" + return_clause(items))
    assert grouped.grouped and not pairwise.grouped
    live_vars = pairwise.live.variables
    for algorithm in ALGORITHMS:
        args = (algorithm, tolerance_s, max_batch, window_s)
        for options, same in zip(runs(*args), runs(*args)):  # fresh options (OLLAA's chooser) for each run
            pairs, _ = run_memory(pairwise, algorithm, case.events, **options)
            results, runner = run_memory(grouped, algorithm, case.events, **same)
            want = group_pairs(pairs, live_vars, items)
            assert as_groups(results, live_vars) == want, (algorithm, options)
            assert runner.counters.results == len(results) == len(want)
            assert len(runner.counters.delay_event_us) == len(results)


def test_a_single_archived_variable_counts_its_joined_instances():
    q = """NAME back LIVE PATTERN Pass p WHERE p.at = 'B'
           ARCHIVED PATTERN Pass q WHERE q.at = 'A' PARTITION BY car LOOKBACK 30 min
           JOIN p.car = q.car
           RETURN p.car AS car, count(q) AS visits, min(q.ts) AS first_seen, last(q.ts) AS last_seen"""

    m = 60 * SECOND
    events = [
        Event(1, "Pass", 0, {"car": "x", "at": "A"}),
        Event(2, "Pass", 1 * m, {"car": "y", "at": "A"}),
        Event(3, "Pass", 5 * m, {"car": "x", "at": "A"}),
        Event(4, "Pass", 10 * m, {"car": "x", "at": "B"}),
        Event(5, "Pass", 12 * m, {"car": "z", "at": "B"}),  # joins nothing: no result
    ]
    for algorithm in ALGORITHMS:
        results, runner = run_memory(compile_live_archived(q), algorithm, events)
        assert [r.to_json() for r in results] == [
            {"query": "back", "events": {"p": [4], "q": [1, 3]}, "start": 0, "end": 10 * m,
             "fields": {"car": "x", "visits": 2, "first_seen": 0, "last_seen": 5 * m}}
        ], algorithm
        assert runner.counters.results == 1 and runner.counters.live_instances == 2


@pytest.mark.parametrize(
    "ret, column, reason",
    [
        ("count(q) AS n, q.ts AS t", 23, "q.ts must be aggregated, e.g. min(q.ts) or last(q.ts): RETURN aggregates"),
        ("p.ts - q.ts AS gap, max(q.ts) AS m", 15, "q.ts must be aggregated"),
        ("count(n) AS c", 8, "negated variable 'n' cannot be used in RETURN"),
        ("count(p) AS c", 8, "count() needs a Kleene variable; 'p' is not one"),  # live: as for a live-only query
    ],
)
def test_grouped_return_refuses_plain_archived_references(ret, column, reason):
    text = f"LIVE PATTERN Pass p\nARCHIVED PATTERN SEQ(Pass q, !Pass n) WITHIN 1 min\nLOOKBACK 1 h\nRETURN {ret}"
    with pytest.raises(QueryError) as info:
        parse(text)
    assert (info.value.line, info.value.column) == (4, column) and reason in info.value.reason, info.value


# ---------------------------------------------------------------------------------------------- demo data

DEMO_OPTIONS = {"alaa": {}, "llaa": {}, "ollaa": {"tolerance_us": HOUR}, "sllaa": {"tolerance_us": 4 * HOUR}}
DEMO_ITEMS = [
    ("count", "c", None, "congested_before"),
    ("min", "c", "ts", "first_seen"),
    ("max", "c", "ts", "last_seen"),
]


def demo_replay(plan: LiveArchivedPlan, algorithm: str, archived, live) -> list:
    """As ``lace demo`` runs a live-and-archived query: the archive part first, then the live part."""
    archive = MemoryArchive()
    for e in archived:
        archive.append(e)
    runner = make_runner(algorithm, plan, archive, **DEMO_OPTIONS[algorithm])
    return list(replay(live, runner, archive.append))


@pytest.fixture(scope="module")
def demo():
    archived, live = split_stream(load_stream())
    plan = next(q for q in load_queries() if q.name == "congested_same_hour")
    assert isinstance(plan, LiveArchivedPlan) and plan.grouped
    live_only = tuple(r for r in plan.ast.returns if r.alias in ("segment", "hour", "speed_kmh"))
    pairwise = compile_live_archived(dataclasses.replace(plan.ast, returns=live_only))
    assert not pairwise.grouped
    archived = [e for e in archived if e.type == "traffic"]
    live = [e for e in live if e.type == "traffic"]
    return plan, archived, live, demo_replay(pairwise, "sllaa", archived, live)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_demo_congested_same_hour_grouped_equals_pairwise_grouped(demo, algorithm):
    plan, archived, live, pairs = demo
    results = demo_replay(plan, algorithm, archived, live)
    want = group_pairs(pairs, plan.live.variables, DEMO_ITEMS, ("segment", "hour", "speed_kmh"))
    assert as_groups(results, plan.live.variables) == want
    assert len(pairs) == 12_004 and len(results) == 685  # one alert per congestion now, not per earlier reading
    assert sum(r.fields["congested_before"] for r in results) == len(pairs)


def test_lace_replay_gives_the_grouped_form(write_file, tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    q = """NAME back LIVE PATTERN Pass p WHERE p.at = 'B'
ARCHIVED PATTERN Pass q WHERE q.at = 'A' PARTITION BY car LOOKBACK 30 min
JOIN p.car = q.car RETURN p.car AS car, count(q) AS visits, max(q.ts) AS last_seen"""
    events = (
        "id,type,ts,car,at\n"
        "1,Pass,2024-01-01T00:00:00Z,x,A\n"
        "2,Pass,2024-01-01T00:01:00Z,y,A\n"
        "3,Pass,2024-01-01T00:05:00Z,x,A\n"
        "4,Pass,2024-01-01T00:10:00Z,x,B\n"
        "5,Pass,2024-01-01T00:12:00Z,y,B\n"
    )
    t0 = 1_704_067_200_000_000
    qf, ef = write_file("q.lql", q), write_file("ev.csv", events)
    for algorithm in sorted(ALGORITHMS):
        result = CliRunner().invoke(app, ["replay", "-q", str(qf), "-e", str(ef), "--archive", str(tmp_path / "a"),
                                          "--backend", "memory", "--algorithm", algorithm, "--tolerance", "5 min"],
                                    catch_exceptions=False)
        assert result.exit_code == 0, result.output
        lines = sorted((json.loads(s) for s in result.stdout.splitlines()), key=lambda d: d["start"])
        assert lines == [
            {"query": "back", "events": {"p": [4], "q": [1, 3]}, "start": t0, "end": t0 + 600 * SECOND,
             "fields": {"car": "x", "visits": 2, "last_seen": t0 + 300 * SECOND}},
            {"query": "back", "events": {"p": [5], "q": [2]}, "start": t0 + 60 * SECOND, "end": t0 + 720 * SECOND,
             "fields": {"car": "y", "visits": 1, "last_seen": t0 + 60 * SECOND}},
        ], algorithm
