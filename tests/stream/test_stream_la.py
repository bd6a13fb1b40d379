"""``lace stream`` with a live-and-archived statement (issue 26): the file's events are the live stream and the
archive (the source Delta table), or the archive's tables are (``--archive``); each micro-batch's live instances
joined with the archived side by a Spark join; OUT is byte for byte what ``lace replay --backend memory --out``
writes for the same statement and events."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.stream.test_stream import DEMO, QUERIES, kill9_when, lace, stream_output
from tests.stream.test_stream_archive import archive, head
from tests.stream.test_stream_archive import stream_output as archive_output


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


@pytest.mark.spark
@pytest.mark.slow
def test_over_the_archive_a_rerun_killed_and_restarted_gives_the_replay_output(stream_spark, tmp_path):
    """``drop_after_rebound`` over the archive's ``bar`` table, written by the service's archive writer: the live
    instances of each micro-batch joined with the archive's own table (read by Spark by date and end, keyed in the
    workers). 3,000 bars archived, a run with a checkpoint and a lateness of 30 minutes: OUT is ``lace replay``'s over
    them (the instances of the last 30 minutes come from the keys' states flushed at the end, joined as a
    micro-batch's, not committed); the other 4,798 archived, the same command again: Spark reads
    only those, and OUT is ``lace replay``'s over all 7,798 (instances of the second run look back across both).
    That second run is killed with SIGKILL right after its micro-batch's results are committed and run again: the
    same OUT, and the results table holds no result twice (the exactly-once writer, the join recomputed)."""
    from deltalake import DeltaTable

    from stream import job as stream_job
    from stream.processor import ORDER

    query, root, ck = QUERIES / "drop_after_rebound.lql", tmp_path / "archive", tmp_path / "ck"
    first = head(DEMO / "bars_1m.csv", tmp_path / "first.csv", 3_000)
    assert archive(root, first) == 3_000
    expected_first = replay_output(query, first, tmp_path)
    assert expected_first.count(b"\n") >= 20
    args = ("--checkpoint", str(ck), "--lateness", "30 minutes")
    assert archive_output(query, root, tmp_path / "s1.jsonl", *args) == expected_first
    assert stream_job.tail_keys  # results of instances the lateness held back: from the keys' states, joined

    assert archive(root, DEMO / "bars_1m.csv", skip=3_000) == 4_798
    expected = replay_output(query, DEMO / "bars_1m.csv", tmp_path)
    assert expected.count(b"\n") > expected_first.count(b"\n")
    # the second run killed (SIGKILL, Python and its JVM) as soon as its data micro-batch's results are committed
    sink_log = ck / "results" / "_delta_log"
    version = len(list(sink_log.glob("*.json")))
    out = tmp_path / "s2.jsonl"
    lace_stream = ["stream", "--query", str(query), "--archive", str(root), "--out", str(out), "--master", "local[2]",
                   *args]
    code = kill9_when(lace_stream, sink_log / f"{version:020d}.json", "the batch's results committed", poll_s=0.01)
    assert code == -signal.SIGKILL and not out.exists()
    assert archive_output(query, root, out, *args) == expected
    assert sum(p["numInputRows"] for p in stream_job.progress) <= 4_798  # only the new ones, from the checkpoint
    rows = DeltaTable(str(ck / "results")).to_pyarrow_table().to_pylist()  # no result twice in the results table
    results = [tuple(r[c] for c in (*ORDER, "r")) + (r["m"],) for r in rows]
    assert len(results) == len(set(results)) >= expected.count(b"\n") - len(stream_job.tail_keys)


@pytest.mark.spark
@pytest.mark.slow
def test_over_the_archive_grouped_results_equal_lace_replay(stream_spark, traffic_slice, tmp_path):
    """``congested_same_hour`` (a one-event archived pattern, grouped RETURN, a JOIN beyond the key) over the
    archive's ``traffic`` table: ``lace replay``'s output, no checkpoint."""
    query = QUERIES / "congested_same_hour.lql"
    assert archive(tmp_path / "archive", traffic_slice) == 12_000
    expected = replay_output(query, traffic_slice, tmp_path)
    assert expected.count(b"\n") >= 50
    assert archive_output(query, tmp_path / "archive", tmp_path / "stream.jsonl") == expected


def test_live_and_archived_statement_refused_where_it_cannot_run(tmp_path):
    result = lace("stream", "--query", str(QUERIES / "drop_after_rebound.lql"), "--out", str(tmp_path / "o.jsonl"),
                  "--events", str(DEMO / "bars_1m.csv"), "--strategy", "skip_till_any_match")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--strategy is not an option" in lines[0], lines
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
