"""The archive writer: WAL -> recent buffer -> Delta, exactly once (docs/architecture.md section 7.8).

``append`` validates the events, writes them to the WAL (fsync) and to the
:class:`~archive.buffer.RecentBuffer`, and only then returns: an acknowledged event is
durable. The buffer is flushed by size (``flush_rows``) or age (``flush_age_s``) as one
delta-rs append per event type (``partition_by=["date"]``) to ``<root>/<type>``.

Exactly once: every Delta commit carries a Delta *app transaction* ``(APP_ID, seq)``,
the highest WAL seq whose events of that type it contains, atomically with the data.
On start the WAL is replayed and a record of type T is re-committed only when its seq
is above T's committed transaction version. A WAL segment is deleted only after the
commits that cover it.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa

from archive.buffer import RecentBuffer
from archive.schema import (
    CATALOG_FILE,
    conform,
    events_to_record,
    load_catalog,
    merge_types,
    normalize_record,
    record_schema,
    save_catalog,
    with_date,
)
from archive.wal import DEFAULT_SEGMENT_BYTES, WriteAheadLog
from engine.event_type import EventType, SchemaError
from engine.events import Event

__all__ = ["APP_ID", "ArchiveWriter", "RecentBuffer", "committed_seq", "table_names"]

APP_ID = "lace-archive-wal"
log = logging.getLogger(__name__)


def table_names(root: str | Path) -> list[str]:
    """Event types that have a Delta table under ``root``."""
    base = Path(root)
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if (p / "_delta_log").is_dir())


def committed_seq(root: str | Path, type_name: str) -> int:
    """The highest WAL seq committed to ``type_name``'s table (0 when none)."""
    from deltalake import DeltaTable

    uri = str(Path(root) / type_name)
    if not DeltaTable.is_deltatable(uri):
        return 0
    return DeltaTable(uri).transaction_version(APP_ID) or 0


QUARANTINE_DIR = "_quarantine"
"""Where WAL records that cannot be committed go at start (see ``ArchiveWriter._commit_or_quarantine``)."""


class ArchiveWriter:
    """Append events durably and archive them to one Delta table per event type.

    Parameters
    ----------
    root : str | Path
        Archive root: ``<root>/<type>`` Delta tables, ``<root>/_lace/types.json`` catalog.
    types : Iterable[EventType]
        Types to register (or evolve) now; the catalog keeps earlier ones.
    wal_dir : str | Path, optional
        WAL directory (default ``<root>/_lace/wal``); owned by this writer while open.
    flush_rows : int
        Flush once this many events are buffered (all types together).
    flush_age_s : float
        Flush once the oldest buffered event has waited this many seconds (checked on
        every append, and by the thread of :meth:`start`).
    segment_bytes : int
        WAL segment size, bytes.
    fsync : bool
        See :class:`archive.wal.WriteAheadLog`; never off outside tests.
    crash_point : callable, optional
        Called with the name of each crash point a flush passes (before a Delta commit:
        ``archive.flush.before_commit``; after the commits, before the WAL deletion:
        ``archive.flush.before_wal_delete``); the service passes :func:`service.core.faults.crash_point`.

    Opening replays the WAL: unflushed events are re-committed exactly once, then
    the replayed segments are deleted.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        types: Iterable[EventType] = (),
        wal_dir: str | Path | None = None,
        flush_rows: int = 50_000,
        flush_age_s: float = 5.0,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        fsync: bool = True,
        crash_point: Callable[[str], None] | None = None,
    ) -> None:
        if flush_rows < 1 or flush_age_s <= 0:
            raise ValueError("flush_rows must be >= 1 and flush_age_s > 0")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.flush_rows = flush_rows
        self.flush_age_s = flush_age_s
        self._crash_point = crash_point or (lambda name: None)
        self.buffer = RecentBuffer()
        self.counters = {
            "appended": 0, "flushed": 0, "commits": 0, "replayed": 0, "replay_skipped": 0, "quarantined": 0
        }
        self.last_error: BaseException | None = None
        self._lock = threading.RLock()
        self._flush_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        known = load_catalog(self.root)
        self.types = merge_types(known, types)
        if self.types != known or not (self.root / CATALOG_FILE).exists():
            save_catalog(self.root, self.types)
        self.wal = WriteAheadLog(wal_dir or self.root / "_lace" / "wal", segment_bytes=segment_bytes, fsync=fsync)
        try:
            self._recover()
        except BaseException:
            self.wal.close()
            raise

    # ------------------------------------------------------------------ registration

    def register(self, etype: EventType) -> EventType:
        """Register a new type, or add ``etype``'s new attributes to a known one; return the result.

        Raises
        ------
        SchemaError
            When an attribute would change type, or the key would change.
        """
        with self._lock:
            merged = self.types[etype.name].evolve(etype) if etype.name in self.types else etype
            if merged != self.types.get(etype.name):
                self.types[etype.name] = merged
                save_catalog(self.root, self.types)
                self.buffer.set_type(merged)
            return merged

    def _type(self, name: str) -> EventType:
        try:
            return self.types[name]
        except KeyError:
            raise SchemaError(f"unknown event type {name!r}: register it first") from None

    # ------------------------------------------------------------------ appending

    def append(
        self, events: Iterable[Event], *, ingested_at_us: int | None = None, ingest_seqs: Iterable[int] | None = None
    ) -> int:
        """Make ``events`` durable and buffered; return how many were acknowledged.

        ``ingested_at_us`` stamps them (default: now, int us UTC); ``ingest_seqs``, parallel to ``events``, is
        each one's position in the service's durable ingest order (stored as ``ingest_seq``; None: null).
        Nothing is written when any event is invalid (:class:`SchemaError`).
        """
        groups: dict[str, list[Event]] = {}
        seqs: dict[str, list[int]] = {}
        if ingest_seqs is None:
            for e in events:
                groups.setdefault(e.type, []).append(e)
        else:
            for e, q in zip(events, ingest_seqs, strict=True):
                groups.setdefault(e.type, []).append(e)
                seqs.setdefault(e.type, []).append(q)
        now_us = time.time_ns() // 1_000 if ingested_at_us is None else ingested_at_us
        return self._append(
            [
                (self._type(n), events_to_record(self._type(n), evs, ingested_at_us=now_us, ingest_seqs=seqs.get(n)))
                for n, evs in groups.items()
            ]
        )

    def append_table(self, type_name: str, table: pa.Table) -> int:
        """Like :meth:`append` for an Arrow table of one type (``id``, ``ts`` int64 us or timestamp, attributes)."""
        etype = self._type(type_name)
        return self._append([(etype, normalize_record(etype, table, ingested_at_us=time.time_ns() // 1_000))])

    def _append(self, batches: list[tuple[EventType, pa.Table]]) -> int:
        batches = [(t, r) for t, r in batches if r.num_rows]
        if not batches:
            return 0
        with self._lock:
            if self._closed:
                raise RuntimeError("the archive writer is closed")
            seqs = self.wal.append([(t.name, r) for t, r in batches])
            for (etype, rec), seq in zip(batches, seqs):
                self.buffer.add(etype, seq, rec)
            n = sum(r.num_rows for _, r in batches)
            self.counters["appended"] += n
        if self.buffer.rows >= self.flush_rows:
            self.flush()
        else:
            self.maybe_flush()
        return n

    # ------------------------------------------------------------------ flushing

    def maybe_flush(self, *, now_s: float | None = None) -> int:
        """Flush when the oldest buffered event is older than ``flush_age_s``; return events flushed."""
        oldest = self.buffer.oldest_s()
        now = time.monotonic() if now_s is None else now_s
        if oldest is not None and now - oldest >= self.flush_age_s:
            return self.flush()
        return 0

    def flush(self) -> int:
        """Commit every buffered event (one delta-rs append per type); return how many."""
        with self._flush_lock:
            with self._lock:
                top, chunks = self.buffer.take()
                if not chunks:
                    return 0
                self.wal.rotate()  # the segments holding these records become closed, hence deletable
                types = dict(self.types)
            n = 0
            for name, tables in chunks.items():
                etype = types[name]
                schema = record_schema(etype)
                table = with_date(pa.concat_tables([conform(t, schema) for t in tables]))
                self._crash_point("archive.flush.before_commit")
                self._commit(etype, table, top)
                self.buffer.drop_through(top, types=[name])
                n += table.num_rows
            self._crash_point("archive.flush.before_wal_delete")
            with self._lock:
                self.wal.delete_through(top)
            self.counters["flushed"] += n
            return n

    def _commit(self, etype: EventType, table: pa.Table, seq: int) -> None:
        from deltalake import CommitProperties, Transaction, write_deltalake

        write_deltalake(
            str(self.root / etype.name),
            table,
            mode="append",
            partition_by=["date"],
            schema_mode="merge",  # a registered new attribute adds a column
            commit_properties=CommitProperties(app_transactions=[Transaction(app_id=APP_ID, version=seq)]),
        )
        self.counters["commits"] += 1

    def _recover(self) -> None:
        committed = {name: committed_seq(self.root, name) for name in table_names(self.root)}
        for rec in self.wal.replay():
            if rec.seq <= committed.get(rec.type, 0):
                self.counters["replay_skipped"] += rec.table.num_rows
                continue
            etype = self._type(rec.type)
            self.buffer.add(etype, rec.seq, rec.table)
            self.counters["replayed"] += rec.table.num_rows
        # seqs keep increasing even when every segment is gone: they are compared with committed versions
        self.wal.next_seq = max(self.wal.next_seq, max(committed.values(), default=0) + 1)
        if self.buffer.rows:
            try:
                self.flush()
            except Exception:
                log.exception("the write-ahead log does not commit as a whole; committing it record by record")
                self._commit_or_quarantine()
        else:
            self.wal.delete_through(self.wal.next_seq - 1)

    def _commit_or_quarantine(self) -> None:
        """Commit every buffered WAL record on its own; move one that cannot be committed to
        ``<root>/_quarantine/<type>-<seq>.arrow`` (Arrow IPC) and report it, so the archive always opens."""
        import pyarrow.ipc as ipc

        for name in list(self.buffer.types()):
            etype = self.types[name]
            schema = record_schema(etype)
            for seq, table in self.buffer.chunks(name):
                try:
                    self._commit(etype, with_date(conform(table, schema)), seq)
                    self.counters["flushed"] += table.num_rows
                except Exception as e:
                    qdir = self.root / QUARANTINE_DIR
                    qdir.mkdir(parents=True, exist_ok=True)
                    path = qdir / f"{name}-{seq}.arrow"
                    with ipc.new_file(str(path), table.schema) as f:
                        f.write_table(table)
                    self.counters["quarantined"] += table.num_rows
                    log.error(
                        "WAL record %d (%d %s events) cannot be archived (%s: %s): quarantined in %s",
                        seq, table.num_rows, name, type(e).__name__, e, path,
                    )
                self.buffer.drop_through(seq, types=[name])
        with self._lock:
            self.wal.rotate()
            self.wal.delete_through(self.wal.next_seq - 1)

    # ------------------------------------------------------------------ lifecycle

    def start(self, *, tick_s: float | None = None) -> None:
        """Start a daemon thread that flushes by age every ``tick_s`` seconds (default flush_age_s / 4)."""
        if self._thread is not None:
            return
        tick = tick_s if tick_s is not None else max(self.flush_age_s / 4, 0.05)

        def run() -> None:
            while not self._stop.wait(tick):
                try:
                    self.maybe_flush()
                except Exception as exc:  # the events stay in the WAL and the buffer: retried next tick
                    self.last_error = exc
                    log.exception("archive flush failed; will retry")

        self._thread = threading.Thread(target=run, name="lace-archive-flush", daemon=True)
        self._thread.start()

    def close(self, *, flush: bool = True) -> None:
        """Stop the flush thread, flush (unless ``flush=False``: the WAL keeps the events) and release the WAL."""
        if self._closed:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            if flush:
                self.flush()
        finally:
            with self._lock:
                self._closed = True
                self.wal.close()

    def __enter__(self) -> ArchiveWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(flush=exc_type is None)

    def stats(self) -> dict[str, Any]:
        """Counters, buffered events and WAL bytes."""
        return {**self.counters, "buffered": self.buffer.rows, "wal_bytes": self.wal.size_bytes()}
