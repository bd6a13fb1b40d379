"""The write-ahead log: framing, CRC, torn tails, rotation, deletion, the directory lock."""
from __future__ import annotations

import pyarrow as pa
import pytest

from archive.wal import MAGIC, WalCorruptError, WalLockedError, WriteAheadLog


def batch(lo: int, hi: int) -> pa.Table:
    return pa.table({"id": pa.array(range(lo, hi), pa.int64())})


def replayed(directory, **kw) -> list[tuple[int, str, list[int]]]:
    wal = WriteAheadLog(directory, **kw)
    try:
        return [(r.seq, r.type, r.table.column("id").to_pylist()) for r in wal.replay()]
    finally:
        wal.close()


def test_records_replay_in_seq_order_across_segments_and_restarts(tmp_path):
    wal = WriteAheadLog(tmp_path, segment_bytes=600)
    assert list(wal.replay()) == []
    assert wal.append([("a", batch(0, 3)), ("b", batch(3, 4))]) == [1, 2]
    assert wal.append([("a", batch(4, 40))]) == [3]
    assert wal.append([("a", batch(40, 41))]) == [4]
    assert len(wal.segments) >= 2  # rotated by size
    wal.close()
    assert replayed(tmp_path) == [(1, "a", [0, 1, 2]), (2, "b", [3]), (3, "a", list(range(4, 40))), (4, "a", [40])]
    wal = WriteAheadLog(tmp_path)
    list(wal.replay())
    assert wal.append([("a", batch(41, 42))]) == [5]  # seqs go on after a restart
    wal.close()


def test_a_torn_tail_of_the_newest_segment_is_cut_off(tmp_path):
    wal = WriteAheadLog(tmp_path)
    list(wal.replay())
    wal.append([("a", batch(0, 2))])
    wal.append([("a", batch(2, 4))])
    path = wal.segments[-1].path
    wal.close()
    data = path.read_bytes()
    path.write_bytes(data[:-7])  # a crash in the middle of the second record: it was never acknowledged
    assert replayed(tmp_path) == [(1, "a", [0, 1])]
    assert replayed(tmp_path) == [(1, "a", [0, 1])]  # the cut is durable


def test_a_corrupt_record_before_the_tail_is_an_error(tmp_path):
    wal = WriteAheadLog(tmp_path, segment_bytes=1)  # one record per segment
    list(wal.replay())
    wal.append([("a", batch(0, 2))])
    wal.append([("a", batch(2, 4))])
    first = wal.segments[0].path
    wal.close()
    data = bytearray(first.read_bytes())
    data[len(MAGIC) + 12] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(WalCorruptError, match="CRC mismatch"):
        replayed(tmp_path)


def test_segments_are_deleted_only_when_closed_and_fully_covered(tmp_path):
    wal = WriteAheadLog(tmp_path, segment_bytes=1)
    list(wal.replay())
    for i in range(3):
        wal.append([("a", batch(i, i + 1))])
    assert wal.delete_through(1) == 1
    assert [s.first for s in wal.segments] == [2, 3]
    wal.append([("a", batch(9, 10))])
    wal.rotate()
    assert wal.delete_through(10) == 3
    wal.close()
    assert replayed(tmp_path) == []


def test_the_open_segment_is_not_deleted(tmp_path):
    wal = WriteAheadLog(tmp_path)
    list(wal.replay())
    wal.append([("a", batch(0, 1))])
    assert wal.delete_through(100) == 0
    wal.close()
    assert replayed(tmp_path) == [(1, "a", [0])]


def test_one_writer_per_directory(tmp_path):
    wal = WriteAheadLog(tmp_path)
    with pytest.raises(WalLockedError):
        WriteAheadLog(tmp_path)
    wal.close()
    WriteAheadLog(tmp_path).close()


def test_append_before_replay_is_refused(tmp_path):
    wal = WriteAheadLog(tmp_path)
    with pytest.raises(RuntimeError, match="replay"):
        wal.append([("a", batch(0, 1))])
    wal.close()
