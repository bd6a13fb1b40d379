"""Issue 15: the INTERVAL statement (intervals derived from point streams) and its IntervalDeriver.

Semantics (docs/semantics.md section 9): per key in (ts, id) order, a maximal run of WHEN-true events with
gaps <= MAX GAP (default COVER) gives [first.ts, last.ts + COVER); decided by the next WHEN-false event of
the key, a longer gap, or the watermark; MIN DURATION filters; RETURN aggregates the run.
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli.main import app
from engine.detector import Detector, compile, make_detector
from engine.events import Event
from engine.intervals.derive import IntervalDeriver, IntervalStatement
from engine.lql.errors import QueryError
from engine.lql.parser import parse
from engine.matcher import LateEventError

M = 60_000_000  # 1 min in us
TEXT = """NAME congestion_episode
INTERVAL traffic t WHEN t.vehicle_count > 0 AND t.avg_speed < 0.5 * t.ndt_kmh
PARTITION BY key
COVER 5 min MAX GAP 10 min MIN DURATION 10 min   -- a reading stands for [ts, ts + 5 min)
RETURN min(t.avg_speed) AS low, count(t) AS readings, t[last].avg_speed AS final
EMIT INTO congestion_episode"""


def reading(i: int, minute: int, key: int, speed: float, count: int = 3) -> Event:
    return Event(i, "traffic", minute * M, {"key": key, "vehicle_count": count, "avg_speed": speed, "ndt_kmh": 100})


def test_the_issue_example_parses_compiles_and_runs_as_a_detector() -> None:
    rule = parse(TEXT)
    assert (rule.cover_us, rule.gap_us, rule.min_duration_us, rule.partition_by) == (5 * M, 10 * M, 10 * M, ("key",))
    assert rule.emit_into == "congestion_episode" and rule.name == "congestion_episode"
    statement = compile(TEXT)
    assert isinstance(statement, IntervalStatement) and statement.stream_types == {"traffic"}
    d = make_detector(statement)
    assert isinstance(d, IntervalDeriver) and isinstance(d, Detector)
    other = make_detector(statement)
    other.push(reading(99, 0, 1, 10))
    with pytest.raises(LateEventError):
        other.push(reading(98, 0, 1, 10))  # (ts, id) behind the last released event
    spec = [(0, 1, 10), (5, 1, 20), (10, 1, 30), (15, 1, 90), (20, 1, 10), (45, 1, 10), (50, 1, 10), (50, 2, 5)]
    out = []
    for i, (minute, key, speed) in enumerate(spec, 1):
        out += [(i, m) for m in d.push(reading(i, minute, key, speed))]
    # the run 0, 5, 10 is decided by the WHEN-false reading at 15 (id 4)
    assert [(i, m.start // M, m.end // M, m.fields) for i, m in out] == [
        (4, 0, 15, {"low": 10, "readings": 3, "final": 30})
    ]
    assert [e.id for e in out[0][1].events["t"]] == [1, 2, 3]
    assert d.next_deadline() == 60 * M  # key 1's run (45, 50) is decided when the watermark reaches 50 + MAX GAP
    late = d.advance(60 * M - 1)
    assert late == []
    tail = d.advance(60 * M)
    assert [(m.start // M, m.end // M) for m in tail] == [(45, 55)]
    assert [(m.start // M, m.end // M) for m in d.flush()] == []  # key 2: one reading, 5 min < MIN DURATION
    s = d.stats()
    assert (s["emitted"], s["too_short"], s["runs"], s["open_runs"]) == (2, 2, 4, 0)  # [20, 25) and key 2's


def test_max_gap_defaults_to_cover_and_a_longer_gap_starts_a_new_run() -> None:
    d = IntervalDeriver(parse("INTERVAL A a COVER 5 min"))
    events = [Event(i, "A", t * M) for i, t in enumerate([0, 5, 11, 16], 1)]
    out = [m for e in events for m in d.push(e)] + d.flush()
    assert [(m.start // M, m.end // M) for m in out] == [(0, 10), (11, 21)]


@pytest.mark.parametrize(
    "text,needle",
    [
        ("INTERVAL A a WHEN a.x > 1", "needs COVER"),
        ("INTERVAL A a COVER 0 s", "greater than zero"),
        ("INTERVAL A a COVER 1 min MAX GAP -1 min", "must not be negative"),
        ("INTERVAL A a COVER 1 min COVER 2 min", "duplicate COVER"),
        ("INTERVAL A a WHEN b.x > 1 COVER 1 min", "unknown variable 'b'"),
        ("INTERVAL A a COVER 1 min RETURN a.x", "needs an index"),
        ("INTERVAL A a WHEN count(a) > 1 COVER 1 min", "aggregates are not allowed in WHEN"),
    ],
)
def test_bad_interval_statements_are_query_errors(text: str, needle: str) -> None:
    with pytest.raises(QueryError) as err:
        parse(text)
    assert needle in str(err.value) and err.value.line == 1 and err.value.column > 0, str(err.value)


# ------------------------------------------------------------------ live == offline == reference


def reference(events: list[Event], cover: int, gap: int, min_dur: int, threshold: int) -> set:
    """Straight from the issue's text: per key in (ts, id) order, maximal runs of WHEN-true events."""
    out = set()
    for key in {e.attrs["k"] for e in events}:
        run: list[Event] = []
        for e in sorted((e for e in events if e.attrs["k"] == key), key=lambda e: (e.ts, e.id)):
            if e.attrs["x"] < threshold and (not run or e.ts - run[-1].ts <= gap):
                run.append(e)
                continue
            if run and run[-1].ts + cover - run[0].ts >= min_dur:
                out.add((run[0].ts, run[-1].ts + cover, tuple(x.id for x in run)))
            run = [e] if e.attrs["x"] < threshold else []
        if run and run[-1].ts + cover - run[0].ts >= min_dur:
            out.add((run[0].ts, run[-1].ts + cover, tuple(x.id for x in run)))
    return out


def _rule(cover: int, gap: int, min_dur: int, threshold: int) -> str:
    return (f"INTERVAL T t WHEN t.x < {threshold} PARTITION BY k COVER {cover} s MAX GAP {gap} s "
            f"MIN DURATION {min_dur} s RETURN count(t) AS n")


def _keys(matches: list) -> set:
    return {(m.start, m.end, tuple(e.id for e in m.events["t"])) for m in matches}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(0, 60),
    cover=st.integers(1, 4),
    gap=st.integers(0, 6),
    min_dur=st.integers(0, 8),
    threshold=st.integers(1, 4),
    seed=st.integers(0, 10_000),
)
def test_live_out_of_order_equals_offline_and_the_reference(n, cover, gap, min_dur, threshold, seed) -> None:
    rng = random.Random(seed)
    s = 1_000_000
    ts = sorted(rng.randrange(0, 40) for _ in range(n))
    events = [Event(i + 1, "T", t * s, {"x": rng.randrange(5), "k": rng.randrange(3)}) for i, t in enumerate(ts)]
    text = _rule(cover, gap, min_dur, threshold)
    offline = IntervalDeriver(parse(text))
    sorted_out = [m for e in events for m in offline.push(e)] + offline.flush()
    lateness = 5 * s
    # arrival order: each event delayed by up to the lateness (a stable sort on ts + a random delay)
    arrival = sorted(events, key=lambda e: (e.ts + rng.randrange(0, lateness + 1), e.id))
    assert arrival == events or n > 1
    live = IntervalDeriver(parse(text), allowed_lateness_us=lateness)
    live_out = []
    for e in arrival:
        live_out += live.push(e)  # never late: every delay is within the allowed lateness
        if rng.random() < 0.2 and live.max_seen is not None:
            live_out += live.advance(live.max_seen - lateness - 1)
    live_out += live.flush()
    assert _keys(live_out) == _keys(sorted_out) == reference(events, cover * s, gap * s, min_dur * s, threshold)
    assert len(live_out) == len(sorted_out)
    assert all(m.fields["n"] == len(m.events["t"]) for m in live_out)


# ------------------------------------------------------------------ a rule graph: EMIT INTO, then BY OVERLAPS


def test_lace_match_derives_episodes_and_relates_them(tmp_path: Path) -> None:
    rows = ["id,type,ts,key,speed"]
    spec = []
    for key, (lo, hi) in ((1, (0, 30)), (2, (10, 50))):
        spec += [(minute, key, 30 if lo <= minute < hi else 80) for minute in range(0, 90, 5)]
    spec.sort()
    rows += [f"{i},traffic,{minute * 60},{key},{speed}" for i, (minute, key, speed) in enumerate(spec, 1)]
    (tmp_path / "traffic.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "rules.lql").write_text(
        "NAME episode INTERVAL traffic t WHEN t.speed < 50 PARTITION BY key COVER 5 min MAX GAP 10 min\n"
        "RETURN min(t.speed) AS low, count(t) AS readings, t[1].key AS key EMIT INTO episode;\n"
        "NAME spreads PATTERN SEQ(episode u, episode d) BY OVERLAPS(0 s, 30 min)\n"
        "WHERE u.key = 1 AND d.key = 2 WITHIN 3 hours RETURN u.readings AS un, d.readings AS dn\n"
    )
    result = CliRunner().invoke(
        app, ["match", "-q", str(tmp_path / "rules.lql"), "-e", str(tmp_path / "traffic.csv"), "--ts-unit", "s"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    import json

    out = [json.loads(line) for line in result.output.splitlines()]
    episodes = [(o["start"] // M, o["end"] // M, o["fields"]["key"]) for o in out if o["query"] == "episode"]
    assert sorted(episodes) == [(0, 30, 1), (10, 50, 2)]
    spreads = [o for o in out if o["query"] == "spreads"]
    # [0, 30) overlaps [10, 50) by 20 min <= 30 min; the hull is [0, 50)
    assert [(o["start"] // M, o["end"] // M, o["fields"]) for o in spreads] == [(0, 50, {"un": 6, "dn": 8})]
