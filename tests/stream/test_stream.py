"""``lace stream`` (issue 26): the demo's live-only statements on Spark Structured Streaming give byte for byte what
``lace match`` gives; statements that cannot run there are refused with one error line."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

DEMO = Path(__file__).resolve().parents[2] / "cli" / "demo_data"
QUERIES = DEMO / "queries"
REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def lace(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def match_output(query: Path, events: Path, out: Path) -> bytes:
    result = lace("match", "--query", str(query), "--events", str(events), "--out", str(out))
    assert result.exit_code == 0, result.output
    return out.read_bytes()


def stream_output(query: Path, events: Path, out: Path, batch: int) -> bytes:
    """OUT of ``lace stream`` over ``events`` on ``local[2]``, ``batch`` events per micro-batch (it must succeed)."""
    result = lace(
        "stream", "--query", str(query), "--events", str(events), "--out", str(out),
        "--master", "local[2]", "--batch-events", str(batch),
    )
    assert result.exit_code == 0, result.output
    return out.read_bytes()


def live_only_statements() -> list[str]:
    """The demo statements that do not read the archive (the ``LIVE ... ARCHIVED`` ones: test_stream_la.py)."""
    return sorted(p.stem for p in QUERIES.glob("*.lql") if "ARCHIVED" not in p.read_text())


def test_demo_has_three_live_only_statements():
    assert live_only_statements() == ["congestion_episode", "drop_then_rebound", "jam_not_cleared"]


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize(
    ("statement", "events", "batch"),
    [
        ("drop_then_rebound", "bars", 50_000),  # skip_till_next_match, Kleene, RETURN aggregates; one micro-batch
        ("jam_not_cleared", "traffic", 6_000),  # a trailing negation: matches released by event-time timers
        ("congestion_episode", "traffic", 6_000),  # partition_contiguity, state across micro-batches
    ],
)
def test_demo_statement_equals_lace_match(stream_spark, traffic_slice, tmp_path, statement, events, batch):
    query = QUERIES / f"{statement}.lql"
    data = DEMO / "bars_1m.csv" if events == "bars" else traffic_slice
    expected = match_output(query, data, tmp_path / "match.jsonl")
    assert expected.count(b"\n") >= 10  # the slice holds matches: the comparison means something
    assert stream_output(query, data, tmp_path / "stream.jsonl", batch) == expected


@pytest.mark.spark
@pytest.mark.slow
def test_out_of_order_events_within_the_lateness(stream_spark, tmp_path):
    """Events up to ~10 minutes out of order, ``--lateness '20 minutes'``: the watermark delay; held-back events
    are released by timers; the same output (and the same late-event warnings) as ``lace match --lateness``."""
    lines = (DEMO / "bars_1m.csv").read_text().splitlines(keepends=True)
    body = lines[1:4_001]
    data = tmp_path / "bars_shuffled.csv"
    data.write_text(lines[0] + "".join(x for i in range(0, len(body), 40) for x in reversed(body[i:i + 40])))
    query = QUERIES / "drop_then_rebound.lql"
    late = ["--lateness", "20 minutes"]
    expected = lace("match", "-q", str(query), "-e", str(data), "-o", str(tmp_path / "m.jsonl"), *late)
    assert expected.exit_code == 0
    result = lace("stream", "-q", str(query), "-e", str(data), "-o", str(tmp_path / "s.jsonl"), *late,
                  "--master", "local[2]", "--batch-events", "2000")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "s.jsonl").read_bytes() == (tmp_path / "m.jsonl").read_bytes()
    assert (tmp_path / "m.jsonl").read_bytes().count(b"\n") >= 3
    warnings = [ln for ln in expected.output.splitlines() if ln.startswith("warning:")]
    assert [ln for ln in result.output.splitlines() if ln.startswith("warning:")] == warnings


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ((QUERIES / "drop_after_rebound.lql").read_text().replace("partition_contiguity", "strict_contiguity", 1),
         "strict contiguity"),
        ("NAME s PATTERN SEQ(bar a, bar b) PARTITION BY key STRATEGY strict_contiguity WITHIN 5 min",
         "strict contiguity"),
        ("NAME f FILTER bar t DROP WHEN t.close < 0; NAME p PATTERN SEQ(bar a, bar b) WITHIN 5 min", "rule graph"),
        ("NAME e PATTERN SEQ(bar a, bar b) PARTITION BY key WITHIN 5 min RETURN a.key AS key EMIT INTO pair",
         "EMIT INTO"),
    ],
)
def test_refused_statement_is_one_error_line(tmp_path, text, reason):
    query = tmp_path / "q.lql"
    query.write_text(text)
    result = lace(
        "stream", "--query", str(query), "--events", str(DEMO / "bars_1m.csv"), "--out", str(tmp_path / "o.jsonl")
    )
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"error: {query}:") and "cannot run on Spark" in lines[0] and reason in lines[0]
    assert not (tmp_path / "o.jsonl").exists()


def kill9_when(args: list[str], marker: Path, what: str, poll_s: float = 0.1, timeout_s: float = 240.0) -> int:
    """Run ``lace *args`` as a process of its own session (Python and its JVM), SIGKILL the whole group as soon as
    ``marker`` exists (``what`` it means, for the failure message); returns the process's exit code. Fails when the
    process ends first or ``marker`` does not appear within ``timeout_s``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", *args], cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout_s
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, f"not {what} in {timeout_s:.0f} s"
            time.sleep(poll_s)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc.returncode


@pytest.mark.spark
@pytest.mark.slow
def test_kill9_mid_stream_then_restart_gives_the_same_output(stream_spark, traffic_slice, tmp_path):
    """A ``lace stream`` process (Python and its JVM) killed with SIGKILL after its first committed micro-batch;
    run again with the same checkpoint (here in-process, on the tests' session), it goes on from there and writes
    exactly ``lace match``'s output: nothing lost, nothing repeated."""
    query = QUERIES / "jam_not_cleared.lql"
    expected = match_output(query, traffic_slice, tmp_path / "match.jsonl")
    ck, out = tmp_path / "ck", tmp_path / "stream.jsonl"
    args = [
        "stream", "--query", str(query), "--events", str(traffic_slice), "--out", str(out), "--checkpoint", str(ck),
        "--master", "local[2]", "--batch-events", "4000",
    ]
    kill9_when(args, ck / "stream" / "commits" / "0", "a micro-batch committed")  # more to come
    assert not out.exists()  # stopped before the end
    assert not (ck / "stream" / "commits" / "3").exists()

    result = lace(*args)
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == expected
    lines = expected.splitlines()
    assert len(lines) >= 10 and len(set(lines)) == len(lines)
