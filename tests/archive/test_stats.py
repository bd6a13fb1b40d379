"""Archive statistics: counts per type and key, sampled selectivity, caching per snapshot version."""
from __future__ import annotations

from collections import Counter

import pytest

from archive.extractor import Extractor
from archive.reader import ArchiveReader
from archive.stats import ArchiveStats
from archive.writer import ArchiveWriter
from engine.compiler import compile_query
from engine.events import Event
from engine.matcher import Matcher
from tests.archive.archive_data import DAY_US, PARKING, T0_US, TRAFFIC, make_events

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]  # one Spark start: 10-30 s

QUERY = """
PATTERN SEQ(traffic a, traffic b)
WHERE a.speed > 100 AND b.speed < 10
PARTITION BY key
WITHIN 6 HOURS
"""


@pytest.fixture
def stats_env(spark, archive_root):
    events = make_events(800, seed=31)
    with ArchiveWriter(archive_root, types=[TRAFFIC, PARKING], flush_rows=300) as w:
        w.append(events)
    return ArchiveStats(Extractor(ArchiveReader(archive_root, spark=spark))), events, archive_root


def test_counts_per_type_and_key_equal_python_counts(stats_env):
    stats, events, _ = stats_env
    ranges = [(T0_US, T0_US + DAY_US)]
    got = stats.counts(["traffic", "parking"], ranges=ranges)
    expected = Counter((e.type, e.attrs["key"]) for e in events if T0_US <= e.ts < T0_US + DAY_US)
    rows = zip(got["type"].to_pylist(), got["key"].to_pylist(), got["events"].to_pylist())
    assert {(t, k): n for t, k, n in rows} == dict(expected)


def test_selectivity_over_every_key_is_exact_and_cached_per_version(stats_env):
    stats, events, root = stats_env
    matcher = Matcher(compile_query(QUERY))
    traffic = sorted((e for e in events if e.type == "traffic"), key=Event.order_key)
    exact = sum(len(matcher.push(e)) for e in traffic) + len(matcher.flush())
    sel = stats.selectivity(QUERY, sample_keys=1_000)
    assert (sel.matches, sel.events) == (exact, len(traffic))
    assert sel.keys_sampled == sel.keys_total == 12
    assert sel.value == pytest.approx(exact / len(traffic))
    assert stats.selectivity(QUERY, sample_keys=1_000) is sel  # same snapshot: cached
    with ArchiveWriter(root) as w:  # a new version invalidates by construction
        w.append(make_events(10, seed=32, first_id=10_000, types=(TRAFFIC,)))
    again = stats.selectivity(QUERY, sample_keys=1_000)
    assert again is not sel and again.events == len(traffic) + 10


def test_a_key_sample_matches_only_the_sampled_keys(stats_env):
    stats, events, _ = stats_env
    sel = stats.selectivity(QUERY, sample_keys=4, seed=3)
    assert sel.keys_sampled == 4
    assert 0 < sel.events < sum(e.type == "traffic" for e in events)


def test_pass_estimates_are_the_conjuncts_rates_over_the_archive(stats_env):
    stats, events, _ = stats_env
    est = stats.pass_estimates(QUERY)
    traffic = [e for e in events if e.type == "traffic"]
    assert set(est) == {"a.speed > 100", "b.speed < 10"}
    # a.speed > 100 is tested on every traffic event (the first component's own condition)
    assert est["a.speed > 100"] == pytest.approx(sum(e.attrs["speed"] > 100 for e in traffic) / len(traffic))
    assert 0.0 <= est["b.speed < 10"] <= 1.0
    assert stats.pass_estimates(QUERY) is est  # cached per snapshot
    ordered = compile_query(QUERY, estimates=est)
    assert ordered.plans[0].slots[0].meta["entry_local"][0].estimate == est["a.speed > 100"]


def test_an_empty_range_counts_nothing_without_asking_spark(stats_env):
    """OLLAA's first early decision asks for the archived events of ``[wm, wm)`` (issue 43's bench: the period had
    not moved yet). An empty range holds no event: no ``key IN ()`` statement Spark refuses (it raised in the
    pool's worker, which then started the query failed after three restarts)."""
    from archive.archived_source import SparkArchiveSource

    stats, _, _ = stats_env
    got = stats.counts(["traffic", "parking"], ranges=[(T0_US + DAY_US, T0_US + DAY_US)])
    assert got.num_rows == 0
    source = SparkArchiveSource(stats.extractor, stats=stats)
    assert source.count(["traffic"], None, (T0_US + DAY_US, T0_US + DAY_US)) == 0
    assert source.count(["traffic"], ["k1"], (T0_US, T0_US), key_attr="key") == 0
