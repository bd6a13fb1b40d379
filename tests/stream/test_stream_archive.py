"""``lace stream --archive`` (issue 26): the archive's Delta events tables, written by the service's archive writer,
as the source; the matches equal ``lace match``'s over the same events, and a rerun with the checkpoint reads only
what was archived since."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.stream.test_stream import kill9_when

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "cli" / "demo_data"
QUERIES = DEMO / "queries"
runner = CliRunner()

TWO_TYPES = """NAME dip
PATTERN SEQ(bar a, tick b, !bar c)
WHERE b.close <= a.close * 0.999 AND c.close > a.close
PARTITION BY key
WITHIN 10 min
RETURN a.key AS symbol, a.close AS high, b.close AS low
"""
"""Over two event types (``bar``, ``tick``: the demo's bars, by minute), with a trailing negation."""


def lace(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def head(src: Path, dst: Path, n: int, retype=None) -> Path:
    """The header and the first ``n`` events of a CSV event file (``retype(fields)``: rewrite each row)."""
    lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
    rows = lines[1:n + 1]
    if retype is not None:
        rows = [",".join(retype(r.split(","))) for r in rows]
    dst.write_text(lines[0] + "".join(rows), encoding="utf-8")
    return dst


def archive(root: Path, csv: Path, skip: int = 0) -> int:
    """Append the events of ``csv`` after the first ``skip`` to the archive at ``root`` with the service's writer
    (100 per append, a Delta commit per 300): returns how many."""
    from archive.writer import ArchiveWriter
    from cli.replay import infer_event_types
    from engine.io import open_event_file

    events = list(open_event_file(csv).events())[skip:]
    with ArchiveWriter(root, types=infer_event_types(events, "key"), flush_rows=300, flush_age_s=3_600,
                       fsync=False) as writer:
        for i in range(0, len(events), 100):
            writer.append(events[i:i + 100])
    assert writer.counters["commits"] >= 2
    return len(events)


def match_output(query: Path, events: Path, out: Path) -> bytes:
    result = lace("match", "--query", str(query), "--events", str(events), "--out", str(out))
    assert result.exit_code == 0, result.output
    return out.read_bytes()


def stream_output(query: Path, root: Path, out: Path, *extra: str) -> bytes:
    result = lace("stream", "--query", str(query), "--archive", str(root), "--out", str(out), "--master", "local[2]",
                  *extra)
    assert result.exit_code == 0, result.output
    assert "warning:" not in result.output  # nothing left out as late
    return out.read_bytes()


@pytest.mark.spark
@pytest.mark.slow
def test_two_archived_types_equal_lace_match(stream_spark, tmp_path):
    """Two Delta tables (``bar``, ``tick``) read by two ``readStream``s, unioned, keyed by PARTITION BY; a trailing
    negation's matches come from the watermark's timers and from the keys' states at the end (the tail)."""
    data = head(DEMO / "bars_1m.csv", tmp_path / "two.csv", 1_200,
                lambda f: [f[0], "bar" if (int(f[2]) // 60_000) % 2 else "tick", *f[2:]])
    query = tmp_path / "dip.lql"
    query.write_text(TWO_TYPES)
    archive(tmp_path / "archive", data)
    assert sorted(p.name for p in (tmp_path / "archive").iterdir() if not p.name.startswith("_")) == ["bar", "tick"]
    expected = match_output(query, data, tmp_path / "match.jsonl")
    assert expected.count(b"\n") >= 100
    assert stream_output(query, tmp_path / "archive", tmp_path / "stream.jsonl") == expected


@pytest.mark.spark
@pytest.mark.slow
def test_rerun_reads_only_the_new_events_and_writes_the_matches_so_far(stream_spark, traffic_slice, tmp_path):
    """1,500 traffic readings archived, ``lace stream --archive --checkpoint``: ``lace match``'s output over them
    (the pending trailing negations of the end flushed from the keys' states, not committed). 1,500 more archived,
    the same command again: Spark reads only those (its checkpoint), the keys' states go on (not flushed), and OUT
    is ``lace match``'s output over all 3,000: some of the first OUT's tail matches (jams not cleared by the end of
    the first 1,500) are not in it, cleared by readings of the next 1,500. Then two late events archived: a third
    run writes the same OUT and says which were left out (Spark's watermark, the key's matcher)."""
    from stream import job as stream_job

    query = QUERIES / "jam_not_cleared.lql"
    root, ck = tmp_path / "archive", tmp_path / "ck"
    first = head(traffic_slice, tmp_path / "first.csv", 1_500)
    both = head(traffic_slice, tmp_path / "both.csv", 3_000)
    assert archive(root, first) == 1_500
    expected_first = match_output(query, first, tmp_path / "m1.jsonl")
    assert stream_output(query, root, tmp_path / "s1.jsonl", "--checkpoint", str(ck)) == expected_first
    assert sum(p["numInputRows"] for p in stream_job.progress) == 1_500

    assert archive(root, both, skip=1_500) == 1_500
    expected_both = match_output(query, both, tmp_path / "m2.jsonl")
    first_lines, both_lines = set(expected_first.splitlines()), set(expected_both.splitlines())
    assert len(first_lines) >= 10
    assert both_lines - first_lines  # new matches came with the new events
    assert first_lines - both_lines  # and cancelled some of the first run's tail (jams cleared after all)
    assert stream_output(query, root, tmp_path / "s2.jsonl", "--checkpoint", str(ck)) == expected_both
    assert sum(p["numInputRows"] for p in stream_job.progress) == 1_500  # only the new ones

    # two late events archived (lace match would reject both): a copy of the newest reading with a smaller id (its
    # key's matcher rejects it: equal times in id order) and one hours behind (Spark's watermark drops it)
    from archive.writer import ArchiveWriter
    from engine.events import Event
    from engine.io import open_event_file

    events = list(open_event_file(both).events())
    newest, oldest = events[-1], events[0]
    with ArchiveWriter(root, fsync=False) as writer:
        writer.append([Event(0, newest.type, newest.ts, dict(newest.attrs)),
                       Event(10**9, oldest.type, oldest.ts, dict(oldest.attrs))])
    result = lace("stream", "--query", str(query), "--archive", str(root), "--out", str(tmp_path / "s3.jsonl"),
                  "--checkpoint", str(ck), "--master", "local[2]")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "s3.jsonl").read_bytes() == expected_both
    warnings = [ln for ln in result.output.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 2, result.output
    assert warnings[0].startswith("warning: 1 events behind the watermark")
    assert warnings[1].startswith("warning: 1 events rejected as late by their key's matcher")
    assert "(the first: id 0," in warnings[1]


def test_a_type_without_table_is_one_error_line(tmp_path):
    """The statement reads ``bar``; the archive holds only ``traffic``: exit 2, one line naming the path, before
    Spark starts."""
    root = tmp_path / "archive"
    archive(root, head(DEMO / "traffic_slice.csv", tmp_path / "t.csv", 600))
    query = QUERIES / "drop_then_rebound.lql"
    result = lace("stream", "--query", str(query), "--archive", str(root), "--out", str(tmp_path / "o.jsonl"))
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith(f"error: {root / 'bar'}: no Delta table of event type 'bar'")
    assert not (tmp_path / "o.jsonl").exists()

    both = lace("stream", "--query", str(query), "--archive", str(root), "--events", str(tmp_path / "t.csv"),
                "--out", str(tmp_path / "o.jsonl"))
    assert both.exit_code == 2 and both.output.strip() == "error: give either --events FILE or --archive ROOT"


@pytest.mark.spark
@pytest.mark.slow
def test_events_archived_out_of_order_within_the_lateness(stream_spark, tmp_path):
    """Two days of bars archived up to ~10 minutes out of order (each day's blocks of 40 reversed), in two parts (the
    cut inside a reversed block) with a run after each, ``--lateness '20 minutes'``: the keys' matchers hold events
    back across the two runs (the ones held back at the first run's end are in its tail, not committed); each OUT
    is ``lace match --lateness``'s over the events so far in the same (ingest) order, nothing left out."""
    import itertools

    lines = (DEMO / "bars_1m.csv").read_text().splitlines(keepends=True)
    body = []
    for _, day in itertools.groupby(lines[1:2_401], key=lambda ln: int(ln.split(",")[2]) // 86_400_000):
        rows = list(day)
        body += [x for i in range(0, len(rows), 40) for x in reversed(rows[i:i + 40])]
    both = tmp_path / "shuffled.csv"
    both.write_text(lines[0] + "".join(body))
    first = head(both, tmp_path / "first.csv", 1_900)
    query = QUERIES / "drop_then_rebound.lql"
    late = ("--lateness", "20 minutes")
    root, ck = tmp_path / "archive", tmp_path / "ck"

    archive(root, first)
    result = lace("match", "-q", str(query), "-e", str(first), "-o", str(tmp_path / "m1.jsonl"), *late)
    assert result.exit_code == 0 and "warning:" not in result.output
    out1 = stream_output(query, root, tmp_path / "s1.jsonl", "--checkpoint", str(ck), *late)
    assert out1 == (tmp_path / "m1.jsonl").read_bytes()

    archive(root, both, skip=1_900)
    result = lace("match", "-q", str(query), "-e", str(both), "-o", str(tmp_path / "m2.jsonl"), *late)
    assert result.exit_code == 0 and "warning:" not in result.output
    out2 = stream_output(query, root, tmp_path / "s2.jsonl", "--checkpoint", str(ck), *late)
    assert out2 == (tmp_path / "m2.jsonl").read_bytes()
    assert out2.count(b"\n") > out1.count(b"\n") >= 10


@pytest.mark.spark
@pytest.mark.slow
def test_an_archived_interval_type_equals_lace_match(stream_spark, tmp_path):
    """An interval type (issue 15: the table has ``ts_end``): its events' event time is ``ts_end``, the order the
    engine wants; 300 stays of 5 keys, in (ts_end, id) order."""
    import random

    from archive.writer import ArchiveWriter
    from engine.event_type import EventType
    from engine.io import open_event_file

    rng = random.Random(3)
    t0 = 1_700_000_000_000  # ms
    rows = []
    for i in range(300):
        ts = t0 + i * 60_000
        rows.append((i + 1, ts, ts + rng.randrange(1, 10) * 60_000, f"k{rng.randrange(5)}", rng.randrange(100)))
    rows.sort(key=lambda r: (r[2], r[0]))
    data = tmp_path / "stays.csv"
    data.write_text("id,type,ts,ts_end,key,level\n" + "".join(f"{i},stay,{s},{e},{k},{v}\n" for i, s, e, k, v in rows))
    query = tmp_path / "rise.lql"
    query.write_text("NAME rise PATTERN SEQ(stay a, stay b) WHERE b.level > a.level + 50 PARTITION BY key "
                     "WITHIN 30 min RETURN a.key AS key, a.level AS lo, b.level AS hi\n")
    stay = EventType("stay", {"key": "string", "level": "int"}, partition_key="key", interval=True)
    with ArchiveWriter(tmp_path / "archive", types=[stay], flush_rows=100, fsync=False) as writer:
        writer.append(list(open_event_file(data).events()))
    expected = match_output(query, data, tmp_path / "match.jsonl")
    assert expected.count(b"\n") >= 100
    assert stream_output(query, tmp_path / "archive", tmp_path / "stream.jsonl") == expected


@pytest.mark.spark
@pytest.mark.slow
def test_kill9_mid_stream_with_archive_then_restart_gives_the_same_output(stream_spark, traffic_slice, tmp_path):
    """A checkpoint's stream over the archive in four micro-batches: a first run over 1,500 archived traffic readings
    (batch 0, and the no-data batch 1 of its timers), then 1,500 more archived and a second run (batch 2 reads them,
    batch 3 its timers) in a ``lace stream`` process that is killed with SIGKILL (the process group: Python and its
    JVM) as soon as batch 2's matches are committed to the results table (Spark has most likely not committed the
    batch to its checkpoint yet: the window in which a replay could deliver them again; the archive mode's
    micro-batch is all that was archived since the last one, ``--batch-events`` does not apply). Run again with the
    same checkpoint (in-process), it goes on from the last committed batch and writes ``lace match``'s output over
    the 3,000 readings, as a run never killed does; the results table holds every micro-batch once and no match
    twice, and the checkpoint's watermark is the unkilled run's."""
    import json

    from deltalake import DeltaTable

    from stream import job as stream_job
    from stream.processor import LATE, ORDER

    query = QUERIES / "jam_not_cleared.lql"
    root, ck, out = tmp_path / "archive", tmp_path / "ck", tmp_path / "stream.jsonl"
    both = head(traffic_slice, tmp_path / "both.csv", 3_000)
    expected = match_output(query, both, tmp_path / "match.jsonl")
    archive(root, head(traffic_slice, tmp_path / "first.csv", 1_500))
    lace_stream = ["stream", "--query", str(query), "--archive", str(root), "--out", str(out), "--checkpoint", str(ck),
                   "--master", "local[2]"]
    result = lace(*lace_stream)
    assert result.exit_code == 0, result.output
    commits, sink_log = ck / "stream" / "commits", ck / "results" / "_delta_log"
    assert sorted(p.name for p in commits.glob("[0-9]*")) == ["0", "1"]  # batch 0 and its timers' no-data batch
    out.unlink()

    assert archive(root, both, skip=1_500) == 1_500
    code = kill9_when(lace_stream, sink_log / f"{2:020d}.json", "batch 2 written to the results table", poll_s=0.01)
    assert code == -signal.SIGKILL
    assert not out.exists()  # killed before the end: no OUT
    assert not (commits / "3").exists()  # nor batch 3 committed

    def txns(log: Path) -> list[int]:
        """The micro-batches a results table's Delta log commits hold (their txn of the query)."""
        return [a["txn"]["version"] for f in sorted(log.glob("*.json"))
                for a in map(json.loads, f.read_text().splitlines()) if "txn" in a]

    assert txns(sink_log) == [0, 1, 2]  # batch 2's matches delivered before the kill

    result = lace(*lace_stream)
    assert result.exit_code == 0, result.output
    assert "warning:" not in result.output
    assert sum(p["numInputRows"] for p in stream_job.progress) <= 1_500  # went on from the checkpoint
    assert out.read_bytes() == expected
    assert expected.count(b"\n") >= 10
    rows = DeltaTable(str(ck / "results")).to_pyarrow_table().to_pylist()  # no match twice in the results table
    keys = [tuple(r[c] for c in ORDER) + (r["m"],) for r in rows if r["kind"] != LATE]
    assert len(keys) == len(set(keys)) >= 5

    unkilled = tmp_path / "unkilled.jsonl"
    assert stream_output(query, root, unkilled, "--checkpoint", str(tmp_path / "ck2")) == out.read_bytes()

    # the checkpoint goes on as if never killed: the results table has each micro-batch once (Delta's txn of the
    # query), the timers' no-data batch after batch 2 ran, and the watermark is the unkilled run's (the newest event
    # time read, minus the lateness), so a later run drops the same events as late
    assert txns(sink_log) == [0, 1, 2, 3]

    def watermark(checkpoint: Path) -> int:
        last = max((checkpoint / "stream" / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
        return json.loads(last.read_text().splitlines()[1])["nextBatchWatermarkMs"]

    assert watermark(ck) == watermark(tmp_path / "ck2")
