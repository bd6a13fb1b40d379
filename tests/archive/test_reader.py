"""The Spark read path: exactly the snapshot's rows across flushes, compaction, vacuum and version pins."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from archive.extractor import Extractor
from archive.maintenance import compact, vacuum
from archive.reader import ArchiveReader, FileIndex, UnreadableTableError, check_filelist_readable
from archive.writer import ArchiveWriter
from engine.event_type import EventType
from engine.events import Event
from tests.archive.archive_data import DAY_US, PARKING, T0_US, TRAFFIC, make_events, python_filter

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]  # one Spark start: 10-30 s
EVERYTHING = [(T0_US - DAY_US, T0_US + 10 * DAY_US)]


def spark_ids(reader: ArchiveReader, name: str, version: int) -> list[int]:
    return sorted(r.id for r in reader.scan(name, version=version).select("id").collect())


def test_reads_return_exactly_the_rows_written_across_flushes_compaction_and_vacuum(
    spark, archive_root, reader_backend
):
    events = make_events(1_500, seed=11)
    with ArchiveWriter(archive_root, types=[TRAFFIC, PARKING], flush_rows=200) as w:
        for i in range(0, len(events), 100):
            w.append(events[i : i + 100])
    reader = ArchiveReader(archive_root, spark=spark, backend=reader_backend)
    assert reader.backend == reader_backend
    expected = sorted(e.id for e in events if e.type == "traffic")
    before = reader.snapshot(["traffic"])["traffic"]
    assert spark_ids(reader, "traffic", before) == expected

    assert compact(archive_root, types=["traffic"], before="2100-01-01")  # every day is closed
    after = reader.snapshot(["traffic"])["traffic"]
    assert after > before
    # The removed files are still on disk: a plain directory read would see every event twice or more.
    naive = spark.read.parquet(str(archive_root / "traffic")).count()
    assert naive > len(expected)
    assert spark_ids(reader, "traffic", after) == expected
    assert spark_ids(reader, "traffic", before) == expected  # time travel: the old files are still there

    removed = vacuum(archive_root, types=["traffic"], retention_hours=0, longest_query_s=0)["traffic"]
    assert removed
    assert spark.read.parquet(str(archive_root / "traffic")).count() == len(expected)
    assert spark_ids(reader, "traffic", reader.snapshot(["traffic"])["traffic"]) == expected


def test_a_pinned_version_gives_repeatable_reads(spark, archive_root, reader_backend):
    first, second = make_events(300, seed=12), make_events(300, seed=13, first_id=1_000)
    with ArchiveWriter(archive_root, types=[TRAFFIC, PARKING]) as w:
        w.append(first)
        w.flush()
        reader = ArchiveReader(archive_root, spark=spark, backend=reader_backend)
        pin = reader.snapshot()
        w.append(second)
    ex = Extractor(reader)
    pinned = ex.extract(["traffic", "parking"], None, EVERYTHING, version=pin)
    assert [(i, t) for i, t in zip(pinned["id"].to_pylist(), pinned["type"].to_pylist())] == python_filter(
        first, {"traffic", "parking"}, None, EVERYTHING
    )
    assert ex.extract(["traffic", "parking"], None, EVERYTHING).num_rows == 600


def test_pruning_never_drops_a_file_holding_a_matching_row(spark, archive_root):
    # ts statistics are truncated to milliseconds: a range starting within the last millisecond of a file must keep it.
    events = make_events(10, seed=14, types=(TRAFFIC,), span_us=1)
    last = max(e.ts for e in events) + 999  # after the file's max ts but within the same millisecond
    events.append(events[0].__class__(99, "traffic", last, {"key": "s1"}))
    with ArchiveWriter(archive_root, types=[TRAFFIC]) as w:
        w.append(events)
    reader = ArchiveReader(archive_root, spark=spark, backend="filelist")  # delta-rs's file list
    v = reader.snapshot()["traffic"]
    assert len(reader.files("traffic", version=v, request={None: [(last, last + 1)]})) == 1
    assert len(reader.files("traffic", version=v, request={"s1": [(last, last + 1)]})) == 1
    assert reader.files("traffic", version=v, request={None: [(last + 1_000_000, last + 2_000_000)]}) == []
    assert reader.files("traffic", version=v, request={"zz": [(last, last + 1)]}) == []  # key statistics prune too


def _index(days, end_min, end_max, key_min, key_max, *, interval=False) -> FileIndex:
    import numpy as np

    n = len(days)
    return FileIndex(
        paths=[f"f{i}" for i in range(n)],
        sizes=np.ones(n, dtype=np.int64),
        rows=np.ones(n, dtype=np.int64),
        day=np.array(days, dtype=np.int64),
        end_min=np.array(end_min, dtype=np.int64),
        end_max=np.array(end_max, dtype=np.int64) + 1_000,  # as built: widened by a millisecond
        key_min=np.array(key_min, dtype=object),
        key_max=np.array(key_max, dtype=object),
        interval=interval,
    )


def test_file_selection_by_date_time_statistics_and_keys():
    index = _index(
        days=[1, 1, 2, 2],
        end_min=[DAY_US, DAY_US + 1_000_000, 2 * DAY_US, 2 * DAY_US],
        end_max=[DAY_US + 999_000, DAY_US + 5_000_000, 2 * DAY_US + 10, 2 * DAY_US + 10],
        key_min=["a", "a", "a", None],
        key_max=["c", "c", "b", None],
    )
    assert index.select(None).all() and not index.select({}).any()
    # the max statistic is truncated to the millisecond: an event at +999.5 ms may be in file 0
    assert index.select({None: [(DAY_US + 999_500, DAY_US + 999_600)]}).tolist() == [True, False, False, False]
    assert index.select({"b": [(DAY_US, 3 * DAY_US)]}).tolist() == [True, True, True, True]
    assert index.select({"c": [(DAY_US, 3 * DAY_US)]}).tolist() == [True, True, False, True]  # no key stats: kept
    assert index.select({"zz": [(DAY_US, 3 * DAY_US)], "0": [(0, 1)]}).tolist() == [False, False, False, True]
    assert index.select({"a": [(2 * DAY_US + 11 + 1_000, 5 * DAY_US)]}).tolist() == [False] * 4
    assert index.select({None: [(-(1 << 62), 1 << 62)]}).all()
    # pair by pair: key a on day 2 and key c on day 1 meet no file holding that key on that day (but file 3,
    # which has no key statistics); the key set and the time union apart would keep every file
    crossed = {"a": [(2 * DAY_US, 3 * DAY_US)], "c": [(DAY_US + 2_000_000, DAY_US + 3_000_000)]}
    assert index.select(crossed).tolist() == [False, True, True, True]
    crossed["c"] = [(DAY_US + 5_000_000 + 1_001, 2 * DAY_US)]  # after file 1 (max widened by 1 ms)
    assert index.select(crossed).tolist() == [False, False, True, True]


def test_interval_types_select_files_by_their_end_and_any_earlier_day():
    # file 0 holds an interval starting on day 1 and ending on day 3: a request on day 3 must keep it
    index = _index(
        days=[1, 3], end_min=[3 * DAY_US + 5, 3 * DAY_US], end_max=[3 * DAY_US + 5, 3 * DAY_US + 9],
        key_min=["a", "a"], key_max=["a", "a"], interval=True,
    )
    assert index.select({"a": [(3 * DAY_US, 3 * DAY_US + 6)]}).tolist() == [True, True]
    assert index.select({"a": [(DAY_US, 2 * DAY_US)]}).tolist() == [False, False]  # ends after the range
    assert index.select({"a": [(4 * DAY_US, 5 * DAY_US)]}).tolist() == [False, False]


def test_an_interval_event_that_starts_before_the_range_is_read_by_every_path(spark, archive_root, reader_backend):
    episode = EventType("episode", {"key": "string"}, partition_key="key", interval=True)
    second = 1_000_000
    with ArchiveWriter(archive_root, types=[episode], flush_rows=1) as w:  # one file each, two days apart
        w.append([Event(1, "episode", T0_US, {"key": "a"}, T0_US + 10 * second)])
        w.append([Event(2, "episode", T0_US + 2 * DAY_US, {"key": "a"}, T0_US + 2 * DAY_US + 5)])
    reader = ArchiveReader(archive_root, spark=spark, backend=reader_backend)
    for local in (0, 1 << 30):
        ex = Extractor(reader, local_read_bytes=local)
        for keys in (["a"], None):
            got = ex.extract("episode", keys, [(T0_US + 5 * second, T0_US + 20 * second)])
            assert got.column("id").to_pylist() == [1], (local, keys)


@pytest.mark.parametrize(
    ("features", "config", "message"),
    [
        (["deletionVectors"], {}, "deletionVectors"),
        (["columnMapping"], {}, "columnMapping"),
        (None, {"delta.columnMapping.mode": "name"}, "column mapping"),
        (["someFutureFeature"], {}, "someFutureFeature"),
    ],
)
def test_tables_the_file_list_cannot_read_are_refused(features, config, message):
    table = SimpleNamespace(
        protocol=lambda: SimpleNamespace(min_reader_version=3 if features else 2, reader_features=features),
        metadata=lambda: SimpleNamespace(configuration=config),
    )
    with pytest.raises(UnreadableTableError, match=message):
        check_filelist_readable(table, "t")


def test_a_real_deletion_vector_table_is_refused(spark, tmp_path):
    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "dv"), pa.table({"id": [1]}), configuration={"delta.enableDeletionVectors": "true"})
    from deltalake import DeltaTable

    dt = DeltaTable(str(tmp_path / "dv"))
    if "deletionVectors" not in (dt.protocol().reader_features or []):
        pytest.skip("this delta-rs does not enable deletion vectors on create")
    with pytest.raises(UnreadableTableError):
        check_filelist_readable(dt, "dv")


def test_native_and_filelist_give_the_same_rows(spark, archive_root):
    from archive.spark import native_delta_available

    if not native_delta_available(spark):
        pytest.skip("the Delta Spark connector is not on the classpath (run `make delta-jars`, which needs Maven)")
    events = make_events(500, seed=15)
    with ArchiveWriter(archive_root, types=[TRAFFIC, PARKING], flush_rows=100) as w:
        w.append(events)
    compact(archive_root, before="2100-01-01")
    ranges = [(T0_US, T0_US + DAY_US), (T0_US + 2 * DAY_US, T0_US + 2 * DAY_US + 3_600_000_000)]
    native = Extractor(ArchiveReader(archive_root, spark=spark, backend="native"))
    filelist = Extractor(ArchiveReader(archive_root, spark=spark, backend="filelist"))
    for keys in (None, ["s1", "s3"]):
        assert native.extract(["traffic", "parking"], keys, ranges).equals(
            filelist.extract(["traffic", "parking"], keys, ranges)
        )
