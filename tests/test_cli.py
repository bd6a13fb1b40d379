"""The ``lace`` command line: exit codes, one-line errors without tracebacks, ``lace match`` output."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from engine.durations import parse_duration_us

runner = CliRunner()

EVENTS_CSV = "id,type,ts,sym\n1,A,1000,x\n2,B,2000,x\n3,A,3000,y\n4,B,4000,y\n"


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def assert_user_error(result, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [message]
    assert "Traceback" not in result.output


# ------------------------------------------------------------ commands and stubs


def test_no_arguments_prints_help_with_the_commands():
    result = runner.invoke(app, [])
    for command in ("match", "demo", "serve", "replay", "backfill"):
        assert command in result.output


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.startswith("lace ")


def test_demo_rejects_a_negative_speed():
    assert_user_error(invoke("demo", "--speed", "-1"), "error: --speed must be >= 0")


def test_backfill_rejects_a_bad_time_with_one_line(tmp_path):
    q = tmp_path / "q.lql"
    q.write_text("PATTERN SEQ(a x, b y) WITHIN 1 min")
    result = invoke("backfill", "--query", str(q), "--archive", str(tmp_path), "--from", "soon", "--to", "1")
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error: --from: ")


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


def test_match_bad_query_reports_file_line_column(write_file):
    query, events = write_file("q.lql", "PATTERN SEQ(A a, B b)\nWHERE x.p > 1\n"), write_file("ev.csv", EVENTS_CSV)
    assert_user_error(invoke("match", "-q", str(query), "-e", str(events)), f"error: {query}:2:7: unknown variable 'x'")


def test_match_bad_event_row_reports_file_and_line(write_file):
    query = write_file("q.lql", "PATTERN SEQ(A a, B b)\n")
    events = write_file("ev.csv", "type,ts\nA,1\nB,soon\n")
    result = invoke("match", "-q", str(query), "-e", str(events))
    assert_user_error(
        result, f"error: {events} line 3, column 2 'ts': ts 'soon' is neither a number nor an ISO-8601 timestamp"
    )


def test_match_bad_pm_store_url_is_a_one_line_error(write_file):
    query, events = write_file("q.lql", "PATTERN SEQ(A a, B b)\n"), write_file("ev.csv", EVENTS_CSV)
    result = invoke("match", "-q", str(query), "-e", str(events), "--pm-capacity", "5", "--pm-store", "nosuchdb://x")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --pm-store nosuchdb://x: ")
    assert len(result.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------ lace match: output and options


def test_match_writes_one_json_object_per_match_to_stdout(write_file):
    query = write_file("q.lql", "NAME pair\nPATTERN SEQ(A a, B b)\nRETURN a.sym AS sym\n")
    events = write_file("ev.csv", EVENTS_CSV)
    result = invoke("match", "-q", str(query), "-e", str(events))
    assert result.exit_code == 0, result.output
    assert [json.loads(line) for line in result.stdout.splitlines()] == [
        {"query": "pair", "events": {"a": [1], "b": [2]}, "start": 1_000_000, "end": 2_000_000, "fields": {"sym": "x"}},
        {"query": "pair", "events": {"a": [1], "b": [4]}, "start": 1_000_000, "end": 4_000_000, "fields": {"sym": "x"}},
        {"query": "pair", "events": {"a": [3], "b": [4]}, "start": 3_000_000, "end": 4_000_000, "fields": {"sym": "y"}},
    ]
    assert result.stderr == ""


def test_match_strategy_and_storage_options_reach_the_engine(write_file):
    query, events = write_file("q.lql", "PATTERN SEQ(A a, B b)\n"), write_file("ev.csv", EVENTS_CSV)

    def run(*args):
        result = invoke("match", "-q", str(query), "-e", str(events), "--stats", *args)
        assert result.exit_code == 0, result.output
        return len(result.stdout.splitlines()), json.loads(result.stderr)

    n_any, chain = run()
    n_next, _ = run("--strategy", "skip_till_next_match")
    n_runs, runs = run("--storage", "runs")
    assert (n_any, n_next, n_runs) == (3, 2, 3)
    assert chain["copied"] == 0 and runs["copied"] > 0


def test_match_out_file_and_stats_from_jsonl(write_file, tmp_path):
    query, events = write_file("q.lql", "PATTERN SEQ(A a, B b)\n"), write_file("ev.jsonl", "")
    events.write_text("".join(json.dumps({"type": t, "ts": ts}) + "\n" for t, ts in [("A", 1), ("B", 2), ("B", 3)]))
    out = tmp_path / "out.jsonl"
    result = invoke("match", "-q", str(query), "-e", str(events), "--out", str(out), "--stats")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert len(out.read_text().splitlines()) == 2
    stats = json.loads(result.stderr)
    assert (stats["events"], stats["late"], stats["matches"]) == (3, 0, 2)
    assert stats["elapsed_s"] >= 0 and stats["events_per_s"] >= 0


def test_match_stats_print_each_counter_once_under_the_rest_names(write_file):
    from service.schemas.resources import QueryStats

    query = write_file("q.lql", "PATTERN SEQ(A a, B b)\nPARTITION BY sym\nWITHIN 10 seconds\n")
    events = write_file("ev.csv", "type,ts,sym\nA,1000,x\nA,2000,y\nB,3000,x\n")
    result = invoke("match", "-q", str(query), "-e", str(events), "--stats")
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stderr)
    assert not {"events_read", "late_events", "emitted", "live", "live_partial_matches", "peak_live"} & set(stats)
    assert {"events", "late", "matches", "partial_matches", "keys"} <= set(stats) <= (
        set(QueryStats.model_fields) | {"ignored", "created", "copied", "merged", "peak_partial_matches",
                                        "pending", "buffered", "conjunct_reorders", "elapsed_s", "events_per_s"}
    )
    # two keys held state at the end of the file (the end of the stream then drops them: keys read 0 before)
    assert (stats["events"], stats["matches"], stats["keys"], stats["partial_matches"]) == (3, 1, 2, 2)


def test_match_pm_capacity_spills_and_gives_the_same_matches(write_file):
    query = write_file("q.lql", "PATTERN SEQ(A a, B b)\nPARTITION BY sym\n")
    rows = "".join(f"{i},{'AB'[i % 2]},{i * 1000},{'xyz'[i % 3]}\n" for i in range(1, 61))
    events = write_file("ev.csv", "id,type,ts,sym\n" + rows)
    plain = invoke("match", "-q", str(query), "-e", str(events))
    spill = ["--pm-capacity", "2", "--pm-policy", "tpm", "--stats"]
    spilled = invoke("match", "-q", str(query), "-e", str(events), *spill)
    assert spilled.exit_code == 0, spilled.output
    assert sorted(spilled.stdout.splitlines()) == sorted(plain.stdout.splitlines())
    stats = json.loads(spilled.stderr)
    assert stats["pm_policy"] == "tpm" and stats["spills"] > 0 and stats["misses"] > 0


def test_match_sort_orders_the_file_by_ts_then_id(write_file):
    query = write_file("q.lql", "PATTERN SEQ(A a, B b)\n")
    events = write_file("ev.csv", "id,type,ts\n1,B,3000\n2,A,1000\n3,A,2000\n")
    unsorted = invoke("match", "-q", str(query), "-e", str(events))
    assert unsorted.stdout == "" and "late event" in unsorted.stderr
    result = invoke("match", "-q", str(query), "-e", str(events), "--sort")
    assert result.exit_code == 0 and result.stderr == ""
    assert sorted(json.loads(line)["events"]["a"][0] for line in result.stdout.splitlines()) == [2, 3]


# ------------------------------------------------------------ real processes and the real engine


def test_module_entry_point_prints_errors_without_traceback(tmp_path, repo_root):
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "match", "-q", str(tmp_path / "q.lql"), "-e", str(tmp_path / "e.csv")],
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
    assert (stats["events"], stats["matches"], stats["late"]) == (4, 2, 0)


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
    assert json.loads(stats_line)["late"] == 1
    assert [json.loads(line)["events"] for line in result.stdout.splitlines()] == [{"a": [1], "b": [3]}]
    lenient = invoke("match", "-q", str(query), "-e", str(events), "--lateness", "5 s")
    assert lenient.stderr == ""
    assert len(lenient.stdout.splitlines()) == 2



def test_match_late_events_across_batches_are_reported_by_line(real_engine, write_file, monkeypatch):
    """The compiled driver loop (engine.matcher.push_events) stops at each late event: every one is counted, the
    first ten are reported with their file line (in any batch), the events after each are still matched."""
    import engine.io

    monkeypatch.setattr(engine.io.EventFile.batches, "__defaults__", (4,))  # batches of 4 events
    query = write_file("q.lql", "PATTERN SEQ(A a, B b)\nWITHIN 100 seconds\n")
    rows = ["A,50000"] + [f"A,{1000 + i}" for i in range(12)] + ["B,60000", "A,1", "B,61000"]
    events = write_file("ev.csv", "type,ts\n" + "\n".join(rows) + "\n")
    result = invoke("match", "-q", str(query), "-e", str(events), "--stats")
    assert result.exit_code == 0, result.output
    *warnings, more, stats_line = result.stderr.splitlines()
    assert [w.split(": ")[1] for w in warnings] == [f"{events} line {n}" for n in range(3, 13)]
    assert more == "warning: 3 more late events rejected (13 in all)"
    assert json.loads(stats_line)["late"] == 13
    assert [json.loads(line)["events"] for line in result.stdout.splitlines()] == [
        {"a": [1], "b": [14]}, {"a": [1], "b": [16]}
    ]


# ------------------------------------------------------------ lace explain (issue 16)


def test_explain_prints_nodes_conjuncts_and_measured_counts(write_file):
    q = write_file("q.lql", "PATTERN SEQ(A a, B b) WHERE b.sym = a.sym AND a.sym != 'z' WITHIN 10 s\n")
    e = write_file("e.csv", EVENTS_CSV)
    result = invoke("explain", str(q), "--events", str(e))
    assert result.exit_code == 0, result.output
    out = result.output
    assert "plan 0: a -> b" in out
    assert "node 1 b (B)" in out and "entry_edge    b.sym = a.sym" in out
    assert "measured: in 3, out 2" in out  # (a1, b1), (a1, b2), (a2, b2): two with equal sym
    assert "[est. over the events: in " in out and "est. p " in out  # the model's estimates say so (issue 47)
    assert invoke("explain", "--query", str(q), "--events", str(e)).output == out  # --query as lace match takes it
    assert invoke("explain", "--events", str(e)).exit_code != 0
    assert "measured matches: 2" in out
    doc = json.loads(invoke("explain", str(q), "--events", str(e), "--json").output)
    assert doc["plans"][0]["nodes"][1]["measured"] == {"input": 3, "output": 2, "pass_probability": 2 / 3}


def test_explain_bad_input_is_one_line(write_file):
    q = write_file("q.lql", "PATTERN SEQ(A a, B b) WHERE b.x = a.x WITHIN 10 s\n")
    bad = write_file("est.json", '{"b.x = a.x": "often"}')
    assert_user_error(
        invoke("explain", str(q), "--estimates", str(bad)),
        f'error: {bad}: --estimates must be a JSON object of numbers, e.g. {{"t.size >= 10000": 0.01}}',
    )
    oob = write_file("est2.json", '{"b.x = a.x": 2}')
    assert_user_error(
        invoke("explain", str(q), "--estimates", str(oob)),
        "error: estimate for 'b.x = a.x' must be a probability in [0, 1], got 2.0",
    )
    wrong = write_file("w.lql", "PATTERN SEQ(A a, B b) WHERE\n")
    result = invoke("explain", str(wrong))
    assert_user_error(result, f"error: {wrong}:1:28: unexpected end of query, expected an expression")


def test_the_process_entry_exits_with_the_commands_code_after_writing_its_output(write_file, tmp_path, repo_root):
    """``cli.main.main`` leaves with ``os._exit`` after the exit handlers (pyarrow's thread pools can abort the
    interpreter's teardown): the output is complete, stdout flushed, and the code is the command's (0, then 2)."""
    query = write_file("q.lql", "NAME pair\nPATTERN SEQ(A a, B b)\nPARTITION BY sym\nWITHIN 10 seconds\n")
    events = write_file("ev.csv", EVENTS_CSV)
    ok = subprocess.run([sys.executable, "-m", "cli.main", "match", "-q", str(query), "-e", str(events)],
                        cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert sorted(json.loads(line)["events"]["a"][0] for line in ok.stdout.splitlines()) == [1, 3]
    bad = subprocess.run([sys.executable, "-m", "cli.main", "nosuch"], cwd=repo_root, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "No such command 'nosuch'" in bad.stderr


def test_match_warns_about_a_column_kept_a_string_by_one_value(write_file):
    query = write_file("q.lql", "PATTERN SEQ(A a, B b)\nWHERE b.alt > 200\n")
    events = write_file("ev.csv", "type,ts,alt\nA,1000,100\nA,2000,high\nB,3000,300\n")
    result = invoke("match", "-q", str(query), "-e", str(events))
    assert result.exit_code == 0 and result.stdout == ""  # a string column: the numeric WHERE matches nothing
    assert result.stderr == (
        f"warning: {events} line 3, column 3 'alt': 'high' is not an int like most of its values, so the whole "
        "column is read as strings (a numeric or boolean comparison on it matches nothing); declare its type with "
        '--schema (e.g. {"alt": "int"}) or a typed header (alt:int), or fix the value\n'
    )
    schema = write_file("types.json", '{"alt": "int"}')
    fixed = invoke("match", "-q", str(query), "-e", str(events), "--schema", str(schema))
    assert fixed.exit_code == 2 and "Traceback" not in fixed.output
    assert fixed.stderr == f"error: {events} line 3, column 3 'alt': 'high' is not an int\n"


def test_explain_warns_about_a_column_kept_a_string_and_takes_schema(write_file):
    query = write_file("q.lql", "PATTERN SEQ(A a, B b)\nWHERE b.alt > 200\n")
    events = write_file("ev.csv", "type,ts,alt\nA,1000,100\nA,2000,high\nB,3000,300\n")
    result = invoke("explain", "-q", str(query), "-e", str(events))
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(f"warning: {events} line 3, column 3 'alt': 'high' is not an int like most")
    schema = write_file("types.json", '{"alt": "int"}')
    fixed = invoke("explain", "-q", str(query), "-e", str(events), "--schema", str(schema))
    assert fixed.exit_code == 2 and fixed.stderr == f"error: {events} line 3, column 3 'alt': 'high' is not an int\n"


@pytest.mark.parametrize("name", ["LACE_ARCHIVE_CACHE_MB", "LACE_ARCHIVE_LOCAL_READ_MB"])
def test_serve_refuses_a_bad_archive_read_setting_before_it_starts(monkeypatch, name):
    """Issue 43: the archive reads these when the first live-and-archived request comes; ``lace serve`` checks them
    first, so a typo is one line at start, not a failed request an hour later."""
    monkeypatch.setenv(name, "lots")
    result = runner.invoke(app, ["serve"])
    assert_user_error(result, f"error: bad settings: {name} must be a number of MiB, not 'lots'")
