"""`lace demo` on the bundled real data: the archive is loaded, every query alerts, and the counts are stable."""
from __future__ import annotations

import io
import shutil

import pytest
from rich.console import Console

from cli.demo import SPLITS, load_queries, load_stream, run_demo, split_stream
from engine.compiler import CompiledQuery
from engine.live_archived.plan import LiveArchivedPlan


def test_bundled_streams_merge_in_time_order_with_unique_ids_and_an_hour():
    events = load_stream()
    assert len(events) == 7_798 + 134_770
    assert all(a.ts <= b.ts for a, b in zip(events, events[1:]))
    assert len({e.id for e in events}) == len(events)
    assert all(e.attrs["hour"] == (e.ts // 3_600_000_000) % 24 for e in events[:1000])


def test_the_first_part_of_each_stream_goes_to_the_archive():
    archived, live = split_stream(load_stream())
    assert len(archived) == 106_238 and len(live) == 36_330
    assert {e.type for e in archived} == {e.type for e in live} == {"bar", "traffic"}
    assert all(e.ts < SPLITS[e.type] for e in archived) and all(e.ts >= SPLITS[e.type] for e in live)


def test_every_demo_query_compiles_and_has_a_name():
    queries = load_queries()
    kinds = {str(q.name): type(q) for q in queries}
    assert kinds == {
        "congested_same_hour": LiveArchivedPlan,
        "congestion_episode": CompiledQuery,
        "drop_after_rebound": LiveArchivedPlan,
        "drop_then_rebound": CompiledQuery,
        "jam_not_cleared": CompiledQuery,
    }


@pytest.fixture(scope="module")
def spark():
    """The process's Spark session (local[2]); shared with the archive tests' session fixture, not stopped here."""
    if shutil.which("java") is None:
        pytest.skip("lace demo needs Java 17 on PATH")
    from archive.spark import SparkSettings, get_spark

    return get_spark(SparkSettings(master="local[2]", app_name="lace-tests"))


@pytest.mark.slow
@pytest.mark.spark
def test_demo_archives_replays_and_prints_alerts_and_a_summary(spark, tmp_path):
    from archive.writer import table_names

    buf = io.StringIO()
    result = run_demo(console=Console(file=buf, width=120), show=2, workdir=tmp_path, spark=spark)
    out = buf.getvalue()
    assert result["archived"] == result["loaded"] == 106_238 and result["live"] == 36_330
    assert sorted(table_names(tmp_path / "archive")) == ["bar", "traffic"]
    assert result["archive"]["appended"] == result["events"] == 142_568
    # live-only queries over the live part; live-and-archived ones with SLLAA over the Delta archive
    assert result["alerts"] == {
        "congested_same_hour": 685,  # grouped RETURN: one alert per live instance (12,004 joined pairs)
        "congestion_episode": 205,
        "drop_after_rebound": 100,
        "drop_then_rebound": 91,
        "jam_not_cleared": 254,
    }
    assert all(n > 0 for n in result["archive_requests"].values())
    assert set(result["archive_requests"]) == {"congested_same_hour", "drop_after_rebound"}
    assert "congested_same_hour segment=" in out and "congested_before=" in out
    assert "drop_after_rebound symbol=" in out and "rebound_at=" in out
    assert out.count("drop_then_rebound symbol=") == 2  # show=2 per query
    assert "summary" in out and "archive requests" in out and "Spark start" in out
