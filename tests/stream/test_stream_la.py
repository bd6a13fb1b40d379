"""``lace stream`` with a live-and-archived statement (issue 26): the file's events are the live stream and the
archive (the source Delta table), each micro-batch's live instances joined with the archived side by a Spark join;
OUT is byte for byte what ``lace replay --backend memory --out`` writes for the same statement and file."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.stream.test_stream import DEMO, QUERIES, kill9_when, lace, stream_output


def replay_output(query: Path, events: Path, tmp: Path) -> bytes:
    out = tmp / "replay.jsonl"
    result = lace("replay", "-q", str(query), "-e", str(events), "-a", str(tmp / "unused"), "--backend", "memory",
                  "-o", str(out))
    assert result.exit_code == 0, result.output
    return out.read_bytes()


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize(
    ("statement", "events", "batch"),
    [
        ("drop_after_rebound", "bars", 4_000),  # pairwise results, Kleene on both sides; look-backs across 2 batches
        ("congested_same_hour", "traffic", 50_000),  # grouped results (count(c)), a one-event archived pattern
    ],
)
def test_demo_live_and_archived_statement_equals_lace_replay(stream_spark, traffic_slice, tmp_path, statement,
                                                             events, batch):
    query = QUERIES / f"{statement}.lql"
    data = DEMO / "bars_1m.csv" if events == "bars" else traffic_slice
    expected = replay_output(query, data, tmp_path)
    assert expected.count(b"\n") >= 50  # the slice gives results: the comparison means something
    assert stream_output(query, data, tmp_path / "stream.jsonl", batch) == expected


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        (("--archive", "."), "runs over --events only"),
        (("--events", str(DEMO / "bars_1m.csv"), "--strategy", "skip_till_any_match"), "--strategy is not an option"),
    ],
)
def test_live_and_archived_statement_refused_where_it_cannot_run(tmp_path, extra, reason):
    args = [str(tmp_path) if a == "." else a for a in extra]
    result = lace("stream", "--query", str(QUERIES / "drop_after_rebound.lql"), "--out", str(tmp_path / "o.jsonl"),
                  *args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and reason in lines[0], result.output
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.spark
@pytest.mark.slow
def test_kill9_mid_stream_then_restart_gives_the_replay_output(stream_spark, tmp_path):
    """A ``lace stream`` process of a live-and-archived statement (Python and its JVM) killed with SIGKILL after its
    first committed micro-batch; run again with the same checkpoint (in-process), it goes on from there: the join's
    results are written once per micro-batch (the exactly-once writer), and OUT is ``lace replay``'s."""
    query, data = QUERIES / "drop_after_rebound.lql", DEMO / "bars_1m.csv"
    expected = replay_output(query, data, tmp_path)
    ck, out = tmp_path / "ck", tmp_path / "stream.jsonl"
    args = ["stream", "--query", str(query), "--events", str(data), "--out", str(out), "--checkpoint", str(ck),
            "--master", "local[2]", "--batch-events", "2000"]
    kill9_when(args, ck / "stream" / "commits" / "0", "a micro-batch committed")  # 4 data micro-batches in all
    assert not out.exists()
    assert not (ck / "stream" / "commits" / "4").exists()

    result = lace(*args)
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == expected
    lines = expected.splitlines()
    assert len(lines) >= 50 and len(set(lines)) == len(lines)
