"""Backfill on Spark (issue 7): results equal the live Matcher's on the same events (demo slices)."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from archive.backfill import BackfillError, read_results, run_backfill
from archive.writer import ArchiveWriter
from cli.replay import ReplayOptions, run_replay
from engine.compiler import compile_query
from engine.event_type import EventType
from engine.events import Event
from engine.io import match_line, read_events
from engine.live_archived.plan import compile_live_archived
from engine.match import Match
from engine.matcher import Matcher

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DEMO = Path(__file__).resolve().parents[2] / "cli" / "demo_data"
DAY_US = 86_400_000_000

SPEED_DROP = """NAME speed_drop
PATTERN SEQ(traffic a, traffic b)
WHERE b.avg_speed < 0.8 * a.avg_speed AND a.vehicle_count > 0
PARTITION BY key
STRATEGY partition_contiguity
WITHIN 1 hour
RETURN a.key AS segment, a.avg_speed AS before_kmh, b.avg_speed AS after_kmh
"""

DROP_AFTER_REBOUND = (DEMO / "queries" / "drop_after_rebound.lql").read_text()


def one_segment(key: int) -> str:
    """A query without PARTITION BY (the whole stream is one group)."""
    return f"""NAME one_segment_slowdown
PATTERN SEQ(traffic a, traffic+ b[], traffic c)
WHERE a.key = {key} AND b[i].key = {key} AND c.key = {key}
  AND b[i].avg_speed < a.avg_speed AND c.avg_speed >= a.avg_speed
STRATEGY skip_till_next_match
WITHIN 1 hour
RETURN count(b) AS slow_readings
"""


def infer_type(name: str, events: list[Event], key: str) -> EventType:
    kinds: dict[str, str] = {}
    for e in events:
        for a, v in e.attrs.items():
            k = "bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "float" if isinstance(
                v, float) else "string"
            old = kinds.get(a, k)
            kinds[a] = "float" if {old, k} == {"int", "float"} else old
    return EventType(name, kinds, partition_key=key)


def as_archived(etype: EventType, events: list[Event]) -> list[Event]:
    """The events as the archive holds them (ints of a float attribute become floats)."""
    out = []
    for e in events:
        attrs = {a: float(v) if etype.attributes[a] == "float" and v is not None else v for a, v in e.attrs.items()}
        out.append(Event(e.id, e.type, e.ts, attrs))
    return out


def ordered(lines: list[str]) -> list[str]:
    """Match lines in the backfill's order: (start, end, line)."""
    return sorted(lines, key=lambda s: (json.loads(s)["start"], json.loads(s)["end"], s))


def live_lines(query: str, events: list[Event], from_us: int, to_us: int) -> list[str]:
    """What live detection (``lace match``) gives on the whole stream, the matches starting in [from, to)."""
    matcher = Matcher(compile_query(query))
    found = []
    for e in sorted(events, key=lambda e: (e.ts, e.id)):
        found += matcher.push(e)
    found += matcher.flush()
    return ordered([match_line(m) for m in found if from_us <= m.start < to_us])


def replay_lines(query: str, events: list[Event], from_us: int, to_us: int) -> list[str]:
    """What ``lace replay`` (memory archive, LLAA) gives on the whole stream, the results whose live
    instance starts in [from, to)."""
    live_vars = set(compile_live_archived(query).live.variables)
    found: list[Match] = []
    run_replay(query, events, ReplayOptions(algorithm="llaa", backend="memory"), found.append)
    kept = []
    for m in found:
        live_start = min(e.ts for var, evs in m.events.items() if var in live_vars for e in evs)
        if from_us <= live_start < to_us:
            kept.append(match_line(m))
    return ordered(kept)


@pytest.fixture(scope="module")
def demo_archive(tmp_path_factory):
    """Traffic (6 segments, 3 days) and equity bars (3 days) archived with ArchiveWriter."""
    root = tmp_path_factory.mktemp("backfill") / "archive"
    traffic = list(read_events(DEMO / "traffic_slice.csv"))
    keys = sorted({e.attrs["key"] for e in traffic})[:6]
    t0 = min(e.ts for e in traffic)
    traffic = [e for e in traffic if e.attrs["key"] in keys and e.ts < t0 + 3 * DAY_US]
    bars = list(read_events(DEMO / "bars_1m.csv"))
    b0 = min(e.ts for e in bars) // DAY_US * DAY_US
    bars = [Event(e.id + 10_000_000, e.type, e.ts, e.attrs) for e in bars if e.ts < b0 + 3 * DAY_US]
    ttype, btype = infer_type("traffic", traffic, "key"), infer_type("bar", bars, "key")
    traffic, bars = as_archived(ttype, traffic), as_archived(btype, bars)
    with ArchiveWriter(root, types=[ttype, btype], fsync=False, flush_rows=2_000) as w:
        w.append(traffic)
        w.append(bars)
    return {"root": root, "traffic": traffic, "bars": bars, "keys": keys, "t0": t0, "b0": b0}


def check(spark, demo, query, events, from_us, to_us, reference=live_lines, reader="auto"):
    seen = []
    result = run_backfill(demo["root"], query, from_us, to_us, spark=spark, progress=seen.append, backend=reader)
    expected = reference(query, events, from_us, to_us)
    assert expected, "the case must have matches"
    assert result.lines == expected
    assert result.events_scanned > 0
    assert seen and seen[-1].percent == 100.0
    stored = read_results(demo["root"], result.backfill_id)
    assert sorted(stored.column("match").to_pylist()) == sorted(expected)
    return result


def test_partitioned_query_whole_range_spans_day_boundaries(spark, demo_archive, reader_backend):
    d = demo_archive
    result = check(spark, d, SPEED_DROP, d["traffic"], d["t0"], d["t0"] + 3 * DAY_US, reader=reader_backend)
    assert any(m["start"] // DAY_US != m["end"] // DAY_US for m in result.matches)


def test_matches_that_end_after_to_are_found_and_adjacent_ranges_add_up(spark, demo_archive):
    d = demo_archive
    whole = live_lines(SPEED_DROP, d["traffic"], d["t0"], d["t0"] + 3 * DAY_US)
    spans = [(m["start"], m["end"]) for m in map(json.loads, whole) if m["start"] < m["end"]]
    mid = spans[len(spans) // 2][1]  # `to` of the left range: a match starts before it and ends at it
    left = check(spark, d, SPEED_DROP, d["traffic"], d["t0"], mid)
    right = check(spark, d, SPEED_DROP, d["traffic"], mid, d["t0"] + 3 * DAY_US)
    assert any(m["end"] >= mid for m in left.matches)
    assert ordered(left.lines + right.lines) == whole


def test_unpartitioned_query_mid_range_spans_day_boundaries(spark, demo_archive):
    d = demo_archive
    query = one_segment(d["keys"][0])
    assert compile_query(query).partition_by == ()
    lo, hi = d["t0"] + DAY_US // 2, d["t0"] + 2 * DAY_US + DAY_US // 3
    result = check(spark, d, query, d["traffic"], lo, hi)
    assert any(m["start"] // DAY_US != m["end"] // DAY_US for m in result.matches)


def test_equity_demo_query(spark, demo_archive):
    d = demo_archive
    query = (DEMO / "queries" / "drop_then_rebound.lql").read_text()
    check(spark, d, query, d["bars"], d["b0"] + DAY_US, d["b0"] + 3 * DAY_US)


def test_cancel_stops_the_spark_job_and_writes_nothing(spark, demo_archive):
    d = demo_archive
    stop = threading.Event()
    group = "backfill-cancel-test"
    with pytest.raises(BackfillError, match="cancelled"):
        run_backfill(d["root"], SPEED_DROP, d["t0"], d["t0"] + 3 * DAY_US, spark=spark, job_group=group,
                     backfill_id="cancelled-one", progress=lambda p: stop.set(), cancel=stop, poll_s=0.05)
    tracker = spark.sparkContext.statusTracker()
    statuses = [tracker.getJobInfo(j).status for j in tracker.getJobIdsForGroup(group)]
    assert "RUNNING" not in statuses and statuses.count("SUCCEEDED") < len(statuses) or not statuses
    assert read_results(d["root"], "cancelled-one").num_rows == 0
    # the session is still good for the next backfill
    assert run_backfill(d["root"], SPEED_DROP, d["t0"], d["t0"] + DAY_US, spark=spark, write_results=False).lines


def test_bad_query_and_unknown_type_give_clean_errors(spark, demo_archive):
    root = demo_archive["root"]
    with pytest.raises(BackfillError, match=r"bad query: line \d+, column \d+"):
        run_backfill(root, "PATTERN SEQ(traffic a,", 0, DAY_US, spark=spark)
    with pytest.raises(BackfillError, match="unknown event type"):
        run_backfill(root, "PATTERN SEQ(nosuch a, nosuch b) WITHIN 1 min", 0, DAY_US, spark=spark)
    with pytest.raises(BackfillError, match="empty range"):
        run_backfill(root, SPEED_DROP, DAY_US, 0, spark=spark)
    with pytest.raises(BackfillError, match="PARTITION BY attribute"):
        run_backfill(root, SPEED_DROP.replace("PARTITION BY key", "PARTITION BY lane"), 0, 10 * 365 * DAY_US,
                     spark=spark)


def test_a_failing_job_says_why(spark, demo_archive):
    """A job that cannot run (here: a snapshot version the table does not have) fails with a one-line reason."""
    d = demo_archive
    query = (DEMO / "queries" / "drop_then_rebound.lql").read_text()
    with pytest.raises(BackfillError) as info:
        run_backfill(d["root"], query, d["b0"], d["b0"] + DAY_US, spark=spark, version={"bar": 999})
    message = str(info.value)
    assert "failed" in message and "999" in message and "\n" not in message


def test_cli_backfill_writes_jsonl(spark, demo_archive, tmp_path):
    from cli.main import app

    d = demo_archive
    qfile = tmp_path / "q.lql"
    qfile.write_text(SPEED_DROP)
    out = tmp_path / "out.jsonl"
    lo, hi = d["t0"] + DAY_US, d["t0"] + 2 * DAY_US
    args = ["backfill", "--query", str(qfile), "--archive", str(d["root"]), "--from", str(lo // 1000),
            "--to", str(hi // 1000), "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert out.read_text().splitlines() == live_lines(SPEED_DROP, d["traffic"], lo, hi)

    la = tmp_path / "la.lql"
    la.write_text(DROP_AFTER_REBOUND)
    lo, hi = d["b0"] + 2 * DAY_US, d["b0"] + 3 * DAY_US
    args = ["backfill", "-q", str(la), "-a", str(d["root"]), "--from", str(lo // 1000), "--to", str(hi // 1000),
            "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == replay_lines(DROP_AFTER_REBOUND, d["bars"], lo, hi) != []

    bad = CliRunner().invoke(app, ["backfill", "--query", str(qfile), "--archive", str(d["root"]),
                                   "--from", "yesterday", "--to", "1"])
    assert bad.exit_code == 2
    assert bad.stderr.strip().startswith("error: --from")


def test_live_and_archived_query_with_archive_key(spark, demo_archive, reader_backend):
    """The demo's drop-after-rebound query: JOIN a.key = x.key is an equi-join on the archive key in Spark."""
    d = demo_archive
    assert compile_live_archived(DROP_AFTER_REBOUND).key is not None
    lo, hi = d["b0"] + DAY_US, d["b0"] + 3 * DAY_US
    result = check(spark, d, DROP_AFTER_REBOUND, d["bars"], lo, hi, replay_lines, reader=reader_backend)
    assert {"a", "x", "y"} <= set(result.matches[0]["events"])


def test_live_and_archived_query_without_archive_key(spark, demo_archive):
    """No JOIN equality on a PARTITION BY attribute: every archived instance in the access range is a candidate."""
    d = demo_archive
    query = DROP_AFTER_REBOUND.replace("JOIN     a.key = x.key", "JOIN     x.close > a.close * 0.5")
    assert compile_live_archived(query).key is None
    result = check(spark, d, query, d["bars"], d["b0"] + DAY_US, d["b0"] + 3 * DAY_US, replay_lines)
    assert any(m["events"]["a"] and m["fields"]["symbol"] for m in result.matches)


GROUPED_DROP = DROP_AFTER_REBOUND[: DROP_AFTER_REBOUND.index("RETURN")] + (
    "RETURN   a.key AS symbol, a.close AS from_price, b[last].close AS low, count(x) AS rebounds,\n"
    "         min(x.ts) AS first_rebound_at, max(y.close) AS best_rebound_to\n"
)


def test_grouped_live_and_archived_query_with_archive_key(spark, demo_archive):
    """RETURN aggregates archived variables: one result per live instance, grouped in Spark, equal to replay."""
    d = demo_archive
    plan = compile_live_archived(GROUPED_DROP)
    assert plan.grouped and plan.key is not None
    result = check(spark, d, GROUPED_DROP, d["bars"], d["b0"] + DAY_US, d["b0"] + 3 * DAY_US, replay_lines)
    lives = [tuple(tuple(m["events"][v]) for v in plan.live.variables) for m in result.matches]
    assert len(lives) == len(set(lives))  # one result per live instance
    assert any(m["fields"]["rebounds"] > 1 for m in result.matches)  # some live instance joins several


def test_grouped_live_and_archived_query_without_archive_key(spark, demo_archive):
    d = demo_archive
    query = GROUPED_DROP.replace("JOIN     a.key = x.key", "JOIN     (a.key = x.key OR x.close < 0)")
    assert compile_live_archived(query).grouped and compile_live_archived(query).key is None
    check(spark, d, query, d["bars"], d["b0"] + DAY_US, d["b0"] + 3 * DAY_US, replay_lines)


ANY_DROP = """NAME any_drop
PATTERN SEQ(traffic a, traffic b)
WHERE b.avg_speed < 0.5 * a.avg_speed AND a.vehicle_count > 3
PARTITION BY key
WITHIN 30 min
"""


def test_cli_explain_using_archive_measures_the_candidate_plans_on_spark(spark, demo_archive, tmp_path):
    """``lace explain Q --archive R --from --to`` (EXPLAIN ... USING ARCHIVE, issue 16): every candidate plan
    finds the matches of the slice, the chosen one is the cheapest measured, and bad options are one-line errors."""
    import json

    from cli.main import app

    d = demo_archive
    qfile = tmp_path / "any_drop.lql"
    qfile.write_text(ANY_DROP)
    lo, hi = d["t0"], d["t0"] + DAY_US
    args = ["explain", str(qfile), "--archive", str(d["root"]), "--from", str(lo // 1000), "--to", str(hi // 1000)]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    trial = json.loads(result.stdout)["trial"]
    sliced = [e for e in d["traffic"] if lo <= e.ts < hi]
    m = Matcher(compile_query(ANY_DROP))
    want = sum(len(m.push(e)) for e in sliced) + len(m.flush())
    assert trial["events"] == len(sliced) and trial["keys"] == 6
    assert [c["name"] for c in trial["candidates"]] == ["nfa/declared", "nfa/cost", "tree"]
    assert want > 0 and {c["matches"] for c in trial["candidates"]} == {want}
    assert trial["chosen"] == min(trial["candidates"], key=lambda c: c["cpu_s"])["name"]
    text = CliRunner().invoke(app, args)
    assert text.exit_code == 0 and "plan trial over the archive" in text.stdout and "chosen: " in text.stdout
    for bad, message in [
        (["explain", str(qfile), "--from", "1"], "error: --from and --to need --archive"),
        ([*args[:4], "--from", "1", "--to", "1"], "error: --to must be after --from"),
        ([*args[:2], "--archive", str(tmp_path / "nope"), "--from", "1", "--to", "2"], "no such archive directory"),
    ]:
        out = CliRunner().invoke(app, bad)
        assert out.exit_code == 2 and message in out.stderr, out.output


EPISODE = """NAME slow_episode
INTERVAL traffic t WHEN t.vehicle_count > 0 AND t.avg_speed < 0.8 * t.ndt_kmh
PARTITION BY key
COVER 5 min MAX GAP 10 min MIN DURATION 10 min
RETURN min(t.avg_speed) AS low, count(t) AS readings
"""


def derived_lines(query: str, events: list[Event], from_us: int, to_us: int) -> list[str]:
    """What live derivation (the INTERVAL statement's deriver over the whole stream) gives, the intervals
    starting in [from, to)."""
    from engine.detector import compile_statement

    deriver = compile_statement(query).make_detector(0)  # type: ignore[union-attr]
    found = []
    for e in sorted(events, key=lambda e: (e.ts, e.id)):
        found += deriver.push(e)
    found += deriver.flush()
    return ordered([match_line(m) for m in found if from_us <= m.start < to_us])


def test_interval_statement_backfill_derives_the_live_intervals(spark, demo_archive):
    """Issue 15: a backfill of an INTERVAL statement derives the same intervals as live derivation, also for a
    range that cuts through episodes (a run that started before ``from`` is not cut into a new one)."""
    d = demo_archive
    check(spark, d, EPISODE, d["traffic"], d["t0"], d["t0"] + 3 * DAY_US, reference=derived_lines)
    lo, hi = d["t0"] + DAY_US // 2 + 3_600_000_000, d["t0"] + 2 * DAY_US
    result = check(spark, d, EPISODE, d["traffic"], lo, hi, reference=derived_lines)
    assert all(m["end"] > m["start"] for m in result.matches)
