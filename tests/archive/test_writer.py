"""The archive writer: WAL -> recent buffer -> Delta, flush triggers, evolution, exactly-once replay (no Spark)."""
from __future__ import annotations

import pyarrow as pa
import pytest

from archive.schema import load_catalog
from archive.wal import WalLockedError
from archive.writer import APP_ID, ArchiveWriter, committed_seq
from engine.event_type import EventType, SchemaError
from engine.events import Event
from tests.archive.archive_data import PARKING, T0_US, TRAFFIC, make_events, read_ids

pytestmark = pytest.mark.integration  # real Delta tables on disk


def ids_of(events, type_name):
    return sorted(e.id for e in events if e.type == type_name)


def test_writes_then_reads_return_exactly_the_events_written_across_flushes(archive_root):
    events = make_events(2_000, seed=1)
    with ArchiveWriter(archive_root, types=[TRAFFIC, PARKING], flush_rows=300) as w:
        for i in range(0, len(events), 170):
            assert w.append(events[i : i + 170]) == len(events[i : i + 170])
        assert w.counters["commits"] >= 6  # size-triggered flushes, one commit per type
    for name in ("traffic", "parking"):
        assert sorted(read_ids(archive_root, name)) == ids_of(events, name)
    assert not list((archive_root / "_lace" / "wal").glob("*.wal"))  # every segment committed, then deleted


def test_unflushed_events_are_queryable_in_the_recent_buffer(archive_root):
    events = make_events(50, seed=2, types=(TRAFFIC,))
    with ArchiveWriter(archive_root, types=[TRAFFIC], flush_rows=10_000, flush_age_s=3600) as w:
        w.append(events)
        assert read_ids(archive_root, "traffic") == []
        got = w.buffer.query(["traffic"], {"s1": [(T0_US, T0_US + 10**12)]})
        in_order = sorted(events, key=Event.order_key)
        assert got.column("id").to_pylist() == [e.id for e in in_order if e.attrs["key"] == "s1"]
        assert w.buffer.get(events[7].id) == events[7]
        assert w.buffer.events(["traffic"]) == sorted(events, key=Event.order_key)


def test_age_triggers_a_flush(archive_root):
    w = ArchiveWriter(archive_root, types=[TRAFFIC], flush_rows=10_000, flush_age_s=0.05)
    try:
        w.append(make_events(5, seed=3, types=(TRAFFIC,)))
        assert w.maybe_flush(now_s=0.0) == 0  # not old yet by that clock
        w.start(tick_s=0.01)
        import time

        deadline = time.monotonic() + 10
        while w.buffer.rows and time.monotonic() < deadline:
            time.sleep(0.01)
        assert w.buffer.rows == 0
        assert len(read_ids(archive_root, "traffic")) == 5
    finally:
        w.close()


def test_invalid_events_are_refused_and_nothing_is_written(archive_root):
    with ArchiveWriter(archive_root, types=[TRAFFIC], flush_rows=1) as w:
        with pytest.raises(SchemaError, match="unknown event type"):
            w.append([Event(1, "traffic", T0_US, {"key": "a"}), Event(2, "weather", T0_US, {})])
        with pytest.raises(SchemaError, match="unknown attribute"):
            w.append([Event(1, "traffic", T0_US, {"colour": "red"})])
        assert w.stats()["appended"] == 0
    assert read_ids(archive_root, "traffic") == []


def test_a_new_attribute_adds_a_column(archive_root):
    with ArchiveWriter(archive_root, types=[TRAFFIC], flush_rows=1) as w:
        w.append([Event(1, "traffic", T0_US, {"key": "a", "speed": 1})])
        w.register(EventType("traffic", {"status": "string"}))
        w.append([Event(2, "traffic", T0_US, {"key": "a", "status": "jam"})])
    from deltalake import DeltaTable

    assert "status" in DeltaTable(str(archive_root / "traffic")).schema().to_arrow().names
    assert "status" in load_catalog(archive_root)["traffic"].attributes
    assert sorted(read_ids(archive_root, "traffic")) == [1, 2]


def test_restart_replays_unflushed_wal_segments_exactly_once(archive_root):
    events = make_events(900, seed=4)
    w = ArchiveWriter(archive_root, types=[TRAFFIC, PARKING], flush_rows=400)
    for i in range(0, 900, 100):
        w.append(events[i : i + 100])
    w.close(flush=False)  # as if the process died: the buffer is lost, the WAL is not
    assert len(read_ids(archive_root, "traffic")) + len(read_ids(archive_root, "parking")) == 800
    with ArchiveWriter(archive_root) as again:
        assert again.counters["replayed"] == 100
    for name in ("traffic", "parking"):
        assert sorted(read_ids(archive_root, name)) == ids_of(events, name)


def test_segments_kept_after_a_commit_are_not_committed_twice(archive_root, monkeypatch):
    events = make_events(600, seed=5)
    w = ArchiveWriter(archive_root, types=[TRAFFIC, PARKING], flush_rows=10**6)
    w.append(events[:300])
    w.append(events[300:])
    monkeypatch.setattr(w.wal, "delete_through", lambda seq: 0)  # die after the commits, before the deletion
    w.flush()
    w.close(flush=False)
    assert list((archive_root / "_lace" / "wal").glob("*.wal"))
    with ArchiveWriter(archive_root) as again:
        assert again.counters["replayed"] == 0
        assert again.counters["replay_skipped"] == 600
    for name in ("traffic", "parking"):
        assert sorted(read_ids(archive_root, name)) == ids_of(events, name)
    assert not list((archive_root / "_lace" / "wal").glob("*.wal"))


def test_a_commit_failing_for_one_type_is_retried_without_duplicating_the_other(archive_root, monkeypatch):
    events = make_events(200, seed=6)
    w = ArchiveWriter(archive_root, types=[TRAFFIC, PARKING], flush_rows=10**6)
    w.append(events)
    real = w._commit

    def flaky(etype, table, seq):
        if etype.name == "parking":
            raise OSError("disk full")
        real(etype, table, seq)

    monkeypatch.setattr(w, "_commit", flaky)
    with pytest.raises(OSError):
        w.flush()
    monkeypatch.setattr(w, "_commit", real)
    w.close(flush=False)
    with ArchiveWriter(archive_root):
        pass
    for name in ("traffic", "parking"):
        assert sorted(read_ids(archive_root, name)) == ids_of(events, name)


def test_seqs_stay_above_committed_versions_when_the_wal_is_empty(archive_root):
    with ArchiveWriter(archive_root, types=[TRAFFIC], flush_rows=1) as w:
        w.append(make_events(3, seed=7, types=(TRAFFIC,)))
    top = committed_seq(archive_root, "traffic")
    assert top >= 1
    with ArchiveWriter(archive_root, flush_rows=10**6) as w:
        assert w.wal.next_seq == top + 1
        w.append(make_events(3, seed=8, first_id=100, types=(TRAFFIC,)))
        w.close(flush=False)
    with ArchiveWriter(archive_root):
        pass
    assert len(read_ids(archive_root, "traffic")) == 6


def test_append_table_takes_arrow_batches(archive_root):
    table = pa.table({"id": [1, 2, 3], "ts": [T0_US, T0_US + 1, T0_US + 2], "key": ["a", "b", "a"], "speed": [1, 2, 3]})
    with ArchiveWriter(archive_root, types=[TRAFFIC]) as w:
        assert w.append_table("traffic", table) == 3
    assert sorted(read_ids(archive_root, "traffic")) == [1, 2, 3]
    from deltalake import DeltaTable

    assert DeltaTable(str(archive_root / "traffic")).transaction_version(APP_ID) == 1


def test_one_writer_per_archive(archive_root):
    with ArchiveWriter(archive_root, types=[TRAFFIC]):
        with pytest.raises(WalLockedError):
            ArchiveWriter(archive_root)


def test_a_wal_record_that_cannot_be_archived_is_quarantined_and_the_archive_opens(archive_root):
    """Issue 13.1: a WAL record the archive could not commit made every start fail until the WAL was
    deleted by hand. Now it is moved aside (and counted); the other records are archived."""
    import pyarrow.ipc as ipc

    from archive.wal import WriteAheadLog

    good = make_events(20, seed=7, types=(TRAFFIC,))
    with ArchiveWriter(archive_root, types=[TRAFFIC], flush_rows=10_000, flush_age_s=3600) as w:
        w.append(good[:10])
        w.flush()
        w.append(good[10:])
        w.close(flush=False)  # acknowledged, in the WAL only
    wal = WriteAheadLog(archive_root / "_lace" / "wal")
    list(wal.replay())
    bad = pa.table({"id": pa.array([999], pa.int64()), "ts": pa.array(["not a time"])})  # cannot be conformed
    wal.append([("traffic", bad)])
    wal.close()
    with ArchiveWriter(archive_root, types=[TRAFFIC]) as w:  # opens: replays, commits, quarantines
        assert w.counters["quarantined"] == 1
    assert sorted(read_ids(archive_root, "traffic")) == ids_of(good, "traffic")
    [q] = list((archive_root / "_quarantine").glob("traffic-*.arrow"))
    assert ipc.open_file(str(q)).read_all().column("id").to_pylist() == [999]
