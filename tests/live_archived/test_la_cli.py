"""``lace replay`` (docs/architecture.md section 7.12) with the memory archive: results, counters, one-line errors."""
from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()

QUERY = """NAME back_again
LIVE     PATTERN SEQ(Pass p) WHERE p.at = 'B'
ARCHIVED PATTERN SEQ(Pass q) WHERE q.at = 'A' PARTITION BY car
LOOKBACK 30 min
JOIN     p.car = q.car AND p.ts - q.ts < 20 min
RETURN   p.car AS car, q.ts AS entered
"""
EVENTS = (
    "id,type,ts,car,at\n"
    "1,Pass,2024-01-01T00:00:00Z,x,A\n"
    "2,Pass,2024-01-01T00:01:00Z,y,A\n"
    "3,Pass,2024-01-01T00:10:00Z,x,B\n"
    "4,Pass,2024-01-01T00:25:00Z,y,B\n"
    "5,Pass,2024-01-01T00:26:00Z,y,A\n"
    "6,Pass,2024-01-01T00:30:00Z,y,B\n"
)
T0 = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


@pytest.fixture
def files(write_file, tmp_path):
    return write_file("q.lql", QUERY), write_file("ev.csv", EVENTS), tmp_path / "archive"


def test_replay_writes_joined_results_and_the_counters(files, tmp_path):
    query, events, archive = files
    out, stats = tmp_path / "out.jsonl", tmp_path / "stats.json"
    result = invoke("replay", "-q", str(query), "-e", str(events), "--archive", str(archive), "--backend", "memory",
                    "--algorithm", "llaa", "--out", str(out), "--stats", str(stats))
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines == [
        {"query": "back_again", "events": {"p": [3], "q": [1]}, "start": T0, "end": T0 + 600_000_000,
         "fields": {"car": "x", "entered": T0}},
        {"query": "back_again", "events": {"p": [6], "q": [5]}, "start": T0 + 1_560_000_000, "end": T0 + 1_800_000_000,
         "fields": {"car": "y", "entered": T0 + 1_560_000_000}},
    ]
    counters = json.loads(stats.read_text())
    for name in ("archive_requests", "archived_events_scanned", "archived_instances", "join_pairs_tried", "results",
                 "wall_s", "delay_event_us", "delay_wall_s", "live_matcher"):
        assert name in counters
    assert counters["results"] == 2 and counters["archive_requests"] == 3 and counters["algorithm"] == "llaa"
    assert counters["backend"] == "memory" and counters["events_read"] == 6
    assert not archive.exists()  # the memory backend writes nothing


@pytest.mark.parametrize("algorithm", ["alaa", "ollaa", "sllaa"])
def test_every_algorithm_gives_the_same_results(files, algorithm):
    query, events, archive = files

    def run(alg):
        result = invoke("replay", "-q", str(query), "-e", str(events), "--archive", str(archive),
                        "--backend", "memory", "--algorithm", alg, "--tolerance", "5 min")
        assert result.exit_code == 0, result.output
        return sorted(result.stdout.splitlines())

    assert run(algorithm) == run("llaa")


def test_a_live_only_query_replays_like_lace_match(write_file, tmp_path):
    query = write_file("live.lql", "NAME pair\nPATTERN SEQ(Pass a, Pass b) WHERE a.car = b.car\n")
    events = write_file("ev.csv", EVENTS)
    replayed = invoke("replay", "-q", str(query), "-e", str(events), "--archive", str(tmp_path / "a"),
                      "--backend", "memory")
    matched = invoke("match", "-q", str(query), "-e", str(events))
    assert replayed.exit_code == 0 and replayed.stdout == matched.stdout and len(matched.stdout.splitlines()) == 7


@pytest.mark.parametrize("query_text", [
    "NAME pair\nPATTERN SEQ(Pass a, Pass b) PARTITION BY car WITHIN 1 h\n",
    QUERY.replace("LIVE     PATTERN SEQ(Pass p) WHERE p.at = 'B'",
                  "LIVE     PATTERN SEQ(Pass o, Pass p) WHERE p.at = 'B' PARTITION BY car WITHIN 1 h")
         .replace("20 min", "60 min").replace("LOOKBACK 30 min", "LOOKBACK 60 min"),
], ids=["live-only", "live-and-archived"])
def test_replay_stats_report_the_partial_match_buffer(write_file, tmp_path, query_text):
    query, events = write_file("q.lql", query_text), write_file("ev.csv", EVENTS)

    def run(*pm: str) -> tuple[str, dict]:
        stats = tmp_path / "stats.json"
        result = invoke("replay", "-q", str(query), "-e", str(events), "--archive", str(tmp_path / "a"),
                        "--backend", "memory", "--algorithm", "llaa", "--stats", str(stats), *pm)
        assert result.exit_code == 0, result.output
        return result.stdout, json.loads(stats.read_text())["live_matcher"]

    plain, _ = run()
    store = f"sqlite:///{tmp_path / 'pms.sqlite'}"
    spilled, counters = run("--pm-capacity", "1", "--pm-policy", "tpm", "--pm-store", store)
    assert spilled == plain and plain
    assert counters["pm_policy"] == "tpm" and counters["pm_capacity"] == 1
    assert counters["spilled"] > 0 and counters["misses"] > 0 and counters["reloaded"] > 0
    for name in ("created", "hits", "expired", "pms_bytes"):
        assert name in counters


def assert_user_error(result, start: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), result.stderr
    assert "Traceback" not in result.output


def test_replay_user_errors_are_one_line(files, write_file):
    query, events, archive = files
    bad = write_file("bad.lql", "LIVE PATTERN A a\nARCHIVED PATTERN B b\nLOOKBACK 1 h\nJOIN a.x = 1\n")
    base = ["replay", "-e", str(events), "--archive", str(archive), "--backend", "memory"]
    assert_user_error(invoke(*base, "-q", str(bad)), f"error: {bad}:4:6: JOIN must relate the live and the archived")
    assert_user_error(invoke(*base, "-q", str(query), "--tolerance", "soon"), "error: --tolerance: cannot read")
    assert_user_error(
        invoke("replay", "-q", str(query), "-e", str(archive / "none.csv"), "--archive", str(archive)),
        f"error: {archive / 'none.csv'}: no such file",
    )
    # (a column mixing 'x' and 7 is one string column since event files are typed per column: no error)
    if shutil.which("java") is not None:  # the archive directory is checked before Spark starts
        archive.mkdir()
        (archive / "old").write_text("x")
        assert_user_error(
            invoke("replay", "-q", str(query), "-e", str(events), "--archive", str(archive)),
            f"error: {archive}: the archive directory must be new or empty",
        )


def test_replay_warns_about_a_column_kept_a_string_by_one_value(write_file, tmp_path):
    query = write_file("q.lql", QUERY)
    lines = EVENTS.splitlines()  # a column n of ints, but for one 'one' (line 4)
    events = write_file("ev.csv", "".join(f"{line},{'n' if i == 0 else 'one' if i == 3 else i}\n"
                                          for i, line in enumerate(lines)))
    result = invoke("replay", "-q", str(query), "-e", str(events), "--archive", str(tmp_path / "archive"),
                    "--backend", "memory", "--algorithm", "llaa")
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(f"warning: {events} line 4, column 6 'n': 'one' is not an int like most of its "
                                    "values, so the whole column is read as strings")
    schema = write_file("types.json", '{"n": "int"}')
    fixed = invoke("replay", "-q", str(query), "-e", str(events), "--archive", str(tmp_path / "archive2"),
                   "--backend", "memory", "--algorithm", "llaa", "--schema", str(schema))
    assert fixed.exit_code == 2 and fixed.stderr == f"error: {events} line 4, column 6 'n': 'one' is not an int\n"
