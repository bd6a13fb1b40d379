"""Durable write-ahead log of the archive (docs/architecture.md section 7.8).

An event is acknowledged only once it is in the log and the log is fsync'd. The log
is a directory of segment files ``<first seq, 20 digits>.wal``; each starts with
:data:`MAGIC` and holds records::

    u32 length | u32 crc32(body) | body
    body = u64 seq | u16 len(type) | type (utf-8) | Arrow IPC stream of the events

``seq`` increases by one per record across segments and restarts. A record's events
all belong to one event type. The writer deletes a segment only after every record in
it is in a Delta commit (:meth:`WriteAheadLog.delete_through`).

A torn record at the end of the newest segment (a crash mid-write, so never
acknowledged) is cut off on :meth:`WriteAheadLog.replay`; a bad record anywhere else
raises :class:`WalCorruptError`. One process at a time owns the directory (``flock``).
"""
from __future__ import annotations

import fcntl
import os
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa

MAGIC = b"LACEWAL1"
_HEAD = struct.Struct("<II")
_SEQ_TYPE = struct.Struct("<QH")
DEFAULT_SEGMENT_BYTES = 64 << 20
MAX_RECORD_BYTES = 1 << 31


class WalCorruptError(RuntimeError):
    """A WAL record that is not the torn tail of the newest segment failed its length or CRC check."""


class WalLockedError(RuntimeError):
    """Another process owns the WAL directory."""


@dataclass(slots=True)
class WalRecord:
    """One replayed record: ``seq``, the event ``type`` and its events (record-shaped Arrow table)."""

    seq: int
    type: str
    table: pa.Table


@dataclass(slots=True)
class _Segment:
    path: Path
    first: int
    last: int  # last seq in it; first - 1 while empty


def encode_record(seq: int, type_name: str, table: pa.Table) -> bytes:
    """The bytes of one record (header included)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    name = type_name.encode()
    body = _SEQ_TYPE.pack(seq, len(name)) + name + sink.getvalue().to_pybytes()
    return _HEAD.pack(len(body), zlib.crc32(body)) + body


def _decode_body(body: bytes) -> WalRecord:
    seq, n = _SEQ_TYPE.unpack_from(body)
    start = _SEQ_TYPE.size
    name = body[start : start + n].decode()
    table = pa.ipc.open_stream(pa.py_buffer(body[start + n :])).read_all()
    return WalRecord(seq, name, table)


class WriteAheadLog:
    """The segment files of one writer.

    Parameters
    ----------
    directory : str | Path
        Created when missing; locked for the lifetime of this object.
    segment_bytes : int
        A segment is closed and a new one started once it reaches this size, in bytes.
    fsync : bool
        fsync every :meth:`append` (and directory changes). Only tests of other
        things may turn it off: without it an acknowledged event can be lost.

    Call :meth:`replay` once, before the first :meth:`append`.
    """

    def __init__(
        self, directory: str | Path, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES, fsync: bool = True
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self._lock_fd = os.open(self.directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise WalLockedError(f"another process is writing the WAL in {self.directory}") from None
        self.segments: list[_Segment] = []
        self.next_seq = 1
        self._file: BinaryIO | None = None
        self._replayed = False
        self._broken = False

    # ------------------------------------------------------------------ reading

    def replay(self) -> Iterator[WalRecord]:
        """Yield every record of every segment in seq order, cutting off a torn tail.

        Raises
        ------
        WalCorruptError
            For a bad record that is not at the end of the newest segment.
        """
        paths = sorted(self.directory.glob("*.wal"))
        self.segments = []
        for i, path in enumerate(paths):
            newest = i == len(paths) - 1
            seg = _Segment(path, int(path.stem), int(path.stem) - 1)
            for rec in self._read_segment(path, newest=newest):
                if rec.seq <= seg.last or (self.segments and rec.seq <= self.segments[-1].last):
                    raise WalCorruptError(f"{path}: seq {rec.seq} is out of order")
                seg.last = rec.seq
                yield rec
            if seg.last < seg.first:  # no record: drop it, so its name cannot be reused under a new segment
                seg.path.unlink(missing_ok=True)
                self._sync_dir()
            else:
                self.segments.append(seg)
            self.next_seq = max(self.next_seq, seg.last + 1)
        self._replayed = True

    def _read_segment(self, path: Path, *, newest: bool) -> Iterator[WalRecord]:
        data = path.read_bytes()
        if data[: len(MAGIC)] != MAGIC:
            if newest and MAGIC.startswith(data[: len(MAGIC)]):
                return  # created, crashed before its header was complete: nothing acknowledged in it
            raise WalCorruptError(f"{path}: not a LACE WAL segment")
        pos = len(MAGIC)
        while pos < len(data):
            bad = None
            if pos + _HEAD.size > len(data):
                bad = "truncated header"
            else:
                length, crc = _HEAD.unpack_from(data, pos)
                end = pos + _HEAD.size + length
                if end > len(data):
                    bad = "truncated record"
                elif zlib.crc32(data[pos + _HEAD.size : end]) != crc:
                    bad = "CRC mismatch"
            if bad is not None:
                if not newest:
                    raise WalCorruptError(f"{path}: {bad} at byte {pos}")
                with open(path, "r+b") as f:  # the torn tail was never acknowledged
                    f.truncate(pos)
                    os.fsync(f.fileno())
                return
            yield _decode_body(data[pos + _HEAD.size : end])
            pos = end

    # ------------------------------------------------------------------ writing

    def append(self, batches: Sequence[tuple[str, pa.Table]]) -> list[int]:
        """Write one record per ``(type, table)`` and make them durable; return their seqs.

        The events are acknowledged when this returns.
        """
        if not self._replayed:
            raise RuntimeError("replay() the WAL before appending to it")
        if self._broken:
            raise RuntimeError("an earlier WAL write failed: reopen the writer (replay cuts the torn record)")
        f = self._current()  # named after the first seq it will hold
        blobs = []
        seqs = list(range(self.next_seq, self.next_seq + len(batches)))
        for seq, (type_name, table) in zip(seqs, batches):
            blob = encode_record(seq, type_name, table)
            if len(blob) >= MAX_RECORD_BYTES:
                raise ValueError(f"a WAL record of {len(blob)} bytes is too large: append fewer events at a time")
            blobs.append(blob)
        try:
            f.write(b"".join(blobs))
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        except BaseException:
            self._broken = True  # a partial record may be on disk: never write after it
            raise
        self.next_seq += len(seqs)
        if seqs:
            self.segments[-1].last = seqs[-1]
        if f.tell() >= self.segment_bytes:
            self.rotate()
        return seqs

    def _current(self) -> BinaryIO:
        if self._file is None:
            path = self.directory / f"{self.next_seq:020d}.wal"
            self._file = open(path, "ab")
            self._file.write(MAGIC)
            self._file.flush()
            if self.fsync:
                os.fsync(self._file.fileno())
            self._sync_dir()
            self.segments.append(_Segment(path, self.next_seq, self.next_seq - 1))
        return self._file

    def rotate(self) -> None:
        """Close the open segment; the next append starts a new one."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def delete_through(self, seq: int) -> int:
        """Delete the closed segments whose records all have seq <= ``seq``; return how many."""
        keep, gone = [], 0
        for i, seg in enumerate(self.segments):
            is_open = self._file is not None and i == len(self.segments) - 1
            if not is_open and seg.last <= seq:
                seg.path.unlink(missing_ok=True)
                gone += 1
            else:
                keep.append(seg)
        self.segments = keep
        if gone:
            self._sync_dir()
        return gone

    def size_bytes(self) -> int:
        """Bytes on disk in the segment files."""
        return sum(s.path.stat().st_size for s in self.segments if s.path.exists())

    def _sync_dir(self) -> None:
        if self.fsync:
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def close(self) -> None:
        """Close the open segment and release the directory lock."""
        self.rotate()
        if self._lock_fd >= 0:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = -1
