"""The four algorithms agree on the bundled real data (Aarhus traffic, equity bars), in memory and on Spark."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

from engine.events import Event
from engine.io import read_events
from engine.live_archived import ALGORITHMS, compile_live_archived, make_runner, replay, run_memory

DATA = Path(__file__).resolve().parents[2] / "cli" / "demo_data"
HOUR = 3_600_000_000

BARS = """
NAME drop_after_rise
LIVE     PATTERN SEQ(bar a, bar b) WHERE b.close < a.close * 0.998
         PARTITION BY key STRATEGY partition_contiguity WITHIN 2 min
ARCHIVED PATTERN SEQ(bar c, bar d) WHERE d.close > c.close * 1.002
         PARTITION BY key STRATEGY partition_contiguity WITHIN 2 min
         LOOKBACK 1 day
JOIN     a.key = c.key
RETURN   a.key AS symbol, a.ts AS drop_at, c.ts AS rise_at
"""
# a segment congested now (two readings) and congested about a day before (23 to 25 hours back)
TRAFFIC = """
NAME congested_again
LIVE     PATTERN SEQ(traffic a, traffic b)
         WHERE a.vehicle_count > 0 AND a.avg_speed < 0.5 * a.ndt_kmh
           AND b.vehicle_count > 0 AND b.avg_speed < 0.5 * b.ndt_kmh
         PARTITION BY key STRATEGY partition_contiguity WITHIN 10 min
ARCHIVED PATTERN SEQ(traffic c) WHERE c.vehicle_count > 0 AND c.avg_speed < 0.5 * c.ndt_kmh
         PARTITION BY key
         LOOKBACK 25 hours
JOIN     a.key = c.key AND a.ts - c.ts >= 23 hours
RETURN   a.key AS segment, a.ts AS now, c.ts AS before
"""
OPTIONS = {"alaa": {}, "llaa": {}, "ollaa": {"tolerance_us": HOUR}, "sllaa": {"tolerance_us": HOUR}}


@lru_cache(maxsize=2)
def load(name: str, n: int) -> tuple[Event, ...]:
    return tuple(sorted(read_events(DATA / name), key=Event.order_key)[:n])


def keys(results) -> list:
    return sorted(tuple(sorted(r.key())) for r in results)


@pytest.mark.parametrize(
    "name, query, n, expected",
    [("bars_1m.csv", BARS, 10_000, 42), ("traffic_slice.csv", TRAFFIC, 23_000, 264)],
)
def test_the_four_algorithms_agree_on_the_demo_data(name, query, n, expected):
    events = load(name, n)
    plan = compile_live_archived(query)
    found = {}
    for algorithm in ALGORITHMS:
        results, runner = run_memory(plan, algorithm, events, **OPTIONS[algorithm])
        found[algorithm] = keys(results)
        assert runner.counters.results == len(results)
    assert len(found["llaa"]) == expected
    assert all(f == found["llaa"] for f in found.values())


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.integration
def test_the_four_algorithms_agree_on_the_spark_archive(spark, tmp_path, reader_backend):
    from archive.archived_source import GrowingDeltaArchive
    from archive.writer import ArchiveWriter
    from cli.replay import infer_event_types

    events = load("bars_1m.csv", 3_120)  # two trading days
    plan = compile_live_archived(BARS)
    want = keys(run_memory(plan, "llaa", events)[0])
    assert len(want) == 6
    for algorithm in ALGORITHMS:
        types = infer_event_types(events, "key")
        writer = ArchiveWriter(tmp_path / algorithm, types=types, flush_rows=1_000, flush_age_s=3_600, fsync=False)
        archive = GrowingDeltaArchive(writer, batch=500)
        source = archive.source(spark=spark, backend=reader_backend)
        runner = make_runner(algorithm, plan, source, **OPTIONS[algorithm])
        try:
            got = keys(replay(events, runner, archive.append))
        finally:
            writer.close()
        assert got == want, algorithm
        assert writer.counters["commits"] >= 3  # requests read Delta files and the recent buffer


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("local_read_mb", ["0", "64"])  # every request a Spark job; every one read with Arrow
def test_a_one_event_archived_side_is_filtered_in_the_archive_before_matching(spark, tmp_path, monkeypatch,
                                                                               local_read_mb):
    """Issue 25: the Delta archive drops the rows failing a one-event ``P_A``'s WHERE (archive.pushdown), the
    results are those of the memory archive, which returns every event of the requests."""
    import random

    from archive.archived_source import GrowingDeltaArchive
    from archive.writer import ArchiveWriter
    from cli.replay import infer_event_types

    monkeypatch.setenv("LACE_ARCHIVE_LOCAL_READ_MB", local_read_mb)
    query = """
    NAME back_fast
    LIVE     PATTERN SEQ(pass p) WHERE p.at = 'B'
    ARCHIVED PATTERN SEQ(pass q) WHERE q.at = 'A' AND q.speed > 0.5 * q.limit PARTITION BY car
             LOOKBACK 1 hour
    JOIN     p.car = q.car
    RETURN   p.car AS car, q.ts AS entered
    """
    rng = random.Random(25)
    t0 = 1_704_067_200_000_000
    events = [
        Event(i, "pass", t0 + i * 20_000_000,
              {"car": rng.randrange(6), "at": rng.choice("AABC"), "speed": rng.uniform(0, 100),
               "limit": rng.choice([50, 80])})
        for i in range(1, 241)
    ]
    plan = compile_live_archived(query)
    options = {"tolerance_us": 600_000_000}
    results, memory = run_memory(plan, "sllaa", events, **options)
    want = keys(results)
    assert len(want) > 10
    writer = ArchiveWriter(tmp_path / "archive", types=infer_event_types(events, "car"), flush_rows=60,
                           flush_age_s=3_600, fsync=False)
    archive = GrowingDeltaArchive(writer, batch=30)
    source = archive.source(spark=spark)
    runner = make_runner("sllaa", plan, source, **options)
    try:
        got = keys(replay(events, runner, archive.append))
    finally:
        writer.close()
    assert got == want
    assert runner.counters.archive_requests == memory.counters.archive_requests
    # the memory archive returns every `pass` of the requests; the Delta archive only those that can match
    assert 0 < runner.counters.archived_events_scanned < memory.counters.archived_events_scanned / 2
    assert (source.extractor.local_reads > 0) == (local_read_mb != "0")
