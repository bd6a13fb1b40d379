"""The ``lace`` command line: exit codes, one-line errors without tracebacks, ``lace match`` output."""
from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import ClassVar

import pytest
from typer.testing import CliRunner

from engine.events import Event
from engine.lql.errors import QueryError
from engine.match import Match
from service.cli import app, parse_duration_us

runner = CliRunner()

EVENTS_CSV = "id,type,ts,sym\n1,A,1000,x\n2,B,2000,x\n3,A,3000,y\n4,B,4000,y\n"


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def assert_user_error(result, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [message]
    assert "Traceback" not in result.output


# ------------------------------------------------------------ a fake engine for the CLI plumbing


class FakeLateEventError(ValueError):
    pass


class FakeMatcher:
    """Pairs every B with the latest A; rejects events older than max ts - lateness; flush emits a trailing match."""

    instances: ClassVar[list[FakeMatcher]] = []

    def __init__(self, query: object, storage: str = "chain", allowed_lateness_us: int = 0) -> None:
        self.query, self.storage, self.lateness_us = query, storage, allowed_lateness_us
        self.last_a: Event | None = None
        self.max_ts = -(2**63)
        self.pushed: list[int] = []
        FakeMatcher.instances.append(self)

    def push(self, event: Event) -> list[Match]:
        if event.ts < self.max_ts - self.lateness_us:
            raise FakeLateEventError(f"ts {event.ts} is behind the watermark")
        self.max_ts = max(self.max_ts, event.ts)
        self.pushed.append(event.id)
        if event.type == "A":
            self.last_a = event
            return []
        if self.last_a is None:
            return []
        return [Match("fake", {"a": (self.last_a,), "b": (event,)}, self.last_a.ts, event.ts)]

    def flush(self) -> list[Match]:
        if self.last_a is None:
            return []
        return [Match("fake", {"a": (self.last_a,)}, self.last_a.ts, self.last_a.ts, {"trailing": True})]

    def stats(self) -> dict[str, int | float]:
        return {"pushed": len(self.pushed)}


@pytest.fixture
def fake_engine(monkeypatch):
    """Install fake ``engine.compiler`` / ``engine.matcher`` modules; returns the compile calls."""
    calls: list[dict] = []

    def compile_query(text: str, schemas=None, strategy=None):
        calls.append({"text": text, "strategy": strategy})
        if "bad" in text:
            raise QueryError("unknown variable 'x'", 3, 7)
        return types.SimpleNamespace(name="fake")

    compiler = types.ModuleType("engine.compiler")
    compiler.compile_query = compile_query  # type: ignore[attr-defined]
    matcher = types.ModuleType("engine.matcher")
    matcher.Matcher = FakeMatcher  # type: ignore[attr-defined]
    matcher.LateEventError = FakeLateEventError  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "engine.compiler", compiler)
    monkeypatch.setitem(sys.modules, "engine.matcher", matcher)
    FakeMatcher.instances.clear()
    return calls


# ------------------------------------------------------------ commands and stubs


def test_no_arguments_prints_help_with_the_commands():
    result = runner.invoke(app, [])
    for command in ("match", "demo", "serve", "replay", "backfill"):
        assert command in result.output


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.startswith("lace ")


def test_demo_placeholder_exits_zero():
    result = invoke("demo")
    assert result.exit_code == 0
    assert "not available yet" in result.stdout


@pytest.mark.parametrize("command", ["serve", "replay", "backfill"])
def test_unimplemented_commands_exit_2_with_one_line(command):
    assert_user_error(invoke(command, "--anything", "x"), f"error: lace {command} is not implemented yet")


@pytest.mark.parametrize(
    ("text", "us"),
    [("0", 0), ("500ms", 500_000), ("5 s", 5_000_000), ("1.5 seconds", 1_500_000), ("10 min", 600_000_000),
     ("2 hours", 7_200_000_000), ("7 days", 604_800_000_000), ("3us", 3)],
)
def test_parse_duration_us(text, us):
    assert parse_duration_us(text) == us


@pytest.mark.parametrize("text", ["5", "soon", "5 fortnights", "-1s"])
def test_parse_duration_us_rejects_unclear_text(text):
    with pytest.raises(ValueError):
        parse_duration_us(text)


# ------------------------------------------------------------ lace match: user errors


def test_match_missing_query_file(tmp_path, write_file):
    events = write_file("ev.csv", EVENTS_CSV)
    missing = tmp_path / "nope.lql"
    result = invoke("match", "--query", str(missing), "--events", str(events))
    assert_user_error(result, f"error: {missing}: no such file")


def test_match_missing_events_file(tmp_path, write_file):
    query = write_file("q.lql", "PATTERN SEQ(A a, B b)\n")
    missing = tmp_path / "nope.csv"
    assert_user_error(invoke("match", "-q", str(query), "-e", str(missing)), f"error: {missing}: no such file")


def test_match_bad_lateness(write_file):
    query, events = write_file("q.lql", "PATTERN SEQ(A a, B b)\n"), write_file("ev.csv", EVENTS_CSV)
    result = invoke("match", "-q", str(query), "-e", str(events), "--lateness", "soon")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --lateness: cannot read duration 'soon'")


def test_match_bad_query_reports_file_line_column(fake_engine, write_file):
    query, events = write_file("q.lql", "a bad query\n"), write_file("ev.csv", EVENTS_CSV)
    assert_user_error(invoke("match", "-q", str(query), "-e", str(events)), f"error: {query}:3:7: unknown variable 'x'")


def test_match_bad_event_row_reports_file_and_line(fake_engine, write_file):
    query = write_file("q.lql", "PATTERN SEQ(A a, B b)\n")
    events = write_file("ev.csv", "type,ts\nA,1\nB,soon\n")
    result = invoke("match", "-q", str(query), "-e", str(events))
    assert_user_error(result, f"error: {events} line 3: ts 'soon' is neither a number nor an ISO-8601 timestamp")


# ------------------------------------------------------------ lace match: plumbing (fake engine)


def test_match_writes_one_json_object_per_match_to_stdout(fake_engine, write_file):
    query, events = write_file("q.lql", "PATTERN SEQ(A a, B b)\n"), write_file("ev.csv", EVENTS_CSV)
    result = invoke("match", "-q", str(query), "-e", str(events))
    assert result.exit_code == 0, result.output
    assert [json.loads(line) for line in result.stdout.splitlines()] == [
        {"query": "fake", "events": {"a": [1], "b": [2]}, "start": 1_000_000, "end": 2_000_000, "fields": {}},
        {"query": "fake", "events": {"a": [3], "b": [4]}, "start": 3_000_000, "end": 4_000_000, "fields": {}},
        {"query": "fake", "events": {"a": [3]}, "start": 3_000_000, "end": 3_000_000, "fields": {"trailing": True}},
    ]
    assert result.stderr == ""


def test_match_passes_strategy_storage_and_lateness_to_the_engine(fake_engine, write_file):
    query, events = write_file("q.lql", "PATTERN SEQ(A a, B b)\n"), write_file("ev.csv", EVENTS_CSV)
    args = ["--strategy", "skip_till_next_match", "--storage", "runs", "--lateness", "2 s"]
    assert invoke("match", "-q", str(query), "-e", str(events), *args).exit_code == 0
    assert fake_engine == [{"text": "PATTERN SEQ(A a, B b)\n", "strategy": "skip_till_next_match"}]
    (m,) = FakeMatcher.instances
    assert (m.storage, m.lateness_us) == ("runs", 2_000_000)


def test_match_out_file_and_stats(fake_engine, write_file, tmp_path):
    query, events = write_file("q.lql", "PATTERN SEQ(A a, B b)\n"), write_file("ev.jsonl", "")
    events.write_text("".join(json.dumps({"type": t, "ts": ts}) + "\n" for t, ts in [("A", 1), ("B", 2)]))
    out = tmp_path / "out.jsonl"
    result = invoke("match", "-q", str(query), "-e", str(events), "--out", str(out), "--stats")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert len(out.read_text().splitlines()) == 2
    stats = json.loads(result.stderr)
    assert stats["pushed"] == 2
    assert (stats["events_read"], stats["late_events"], stats["matches"]) == (2, 0, 2)
    assert stats["elapsed_s"] >= 0 and stats["events_per_s"] >= 0


def test_match_counts_and_reports_late_events_and_keeps_going(fake_engine, write_file):
    query = write_file("q.lql", "PATTERN SEQ(A a, B b)\n")
    events = write_file("ev.csv", "type,ts\nA,5000\nA,1000\nB,6000\n")
    result = invoke("match", "-q", str(query), "-e", str(events), "--stats")
    assert result.exit_code == 0, result.output
    warning, stats_line = result.stderr.splitlines()
    assert warning == f"warning: {events} line 3: ts 1000000 is behind the watermark"
    stats = json.loads(stats_line)
    assert (stats["events_read"], stats["late_events"], stats["pushed"]) == (3, 1, 2)


def test_match_sort_orders_the_file_by_ts_then_id(fake_engine, write_file):
    query = write_file("q.lql", "PATTERN SEQ(A a, B b)\n")
    events = write_file("ev.csv", "id,type,ts\n1,B,3000\n2,A,1000\n3,A,2000\n")
    assert invoke("match", "-q", str(query), "-e", str(events), "--sort").exit_code == 0
    assert FakeMatcher.instances[0].pushed == [2, 3, 1]


# ------------------------------------------------------------ real processes and the real engine


def test_module_entry_point_prints_errors_without_traceback(tmp_path, repo_root):
    proc = subprocess.run(
        [sys.executable, "-m", "service.cli", "match", "-q", str(tmp_path / "q.lql"), "-e", str(tmp_path / "e.csv")],
        cwd=repo_root, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr == f"error: {tmp_path / 'q.lql'}: no such file\n"


def test_installed_console_script_runs():
    lace = Path(sys.executable).parent / "lace"
    if not lace.exists():
        pytest.skip("the lace console script is not installed in this environment (make venv)")
    proc = subprocess.run([str(lace), "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert proc.stdout.startswith("lace ")


@pytest.fixture
def real_engine():
    pytest.importorskip("engine.compiler")
    pytest.importorskip("engine.matcher")


def test_match_end_to_end_with_the_real_engine(real_engine, write_file, tmp_path):
    query = write_file("q.lql", "NAME pair\nPATTERN SEQ(A a, B b)\nPARTITION BY sym\nWITHIN 10 seconds\n")
    events = write_file("ev.csv", EVENTS_CSV)
    out = tmp_path / "out.jsonl"
    result = invoke("match", "-q", str(query), "-e", str(events), "-o", str(out), "--stats")
    assert result.exit_code == 0, result.output
    found = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((m["events"]["a"], m["events"]["b"]) for m in found) == [([1], [2]), ([3], [4])]
    assert {m["query"] for m in found} == {"pair"}
    stats = json.loads(result.stderr.splitlines()[-1])
    assert (stats["events_read"], stats["matches"], stats["late_events"]) == (4, 2, 0)


def test_match_bad_query_with_the_real_parser(real_engine, write_file):
    query = write_file("q.lql", "NAME broken\nPATTERN SEQ(A a,, B b)\n")
    events = write_file("ev.csv", EVENTS_CSV)
    result = invoke("match", "-q", str(query), "-e", str(events))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {query}:2:")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_match_late_events_with_the_real_engine(real_engine, write_file):
    query = write_file("q.lql", "PATTERN SEQ(A a, B b)\nWITHIN 10 seconds\n")
    events = write_file("ev.csv", "type,ts\nA,5000\nA,1000\nB,6000\n")
    result = invoke("match", "-q", str(query), "-e", str(events), "--stats")
    assert result.exit_code == 0, result.output
    warning, stats_line = result.stderr.splitlines()
    assert warning.startswith(f"warning: {events} line 3: ")
    assert json.loads(stats_line)["late_events"] == 1
    assert [json.loads(line)["events"] for line in result.stdout.splitlines()] == [{"a": [1], "b": [3]}]
    lenient = invoke("match", "-q", str(query), "-e", str(events), "--lateness", "5 s")
    assert lenient.stderr == ""
    assert len(lenient.stdout.splitlines()) == 2
