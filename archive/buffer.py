"""The recent buffer: R_Buffer of 001 section 3.3.

Ingested events are appended here (after the WAL) and stay until their Delta commit.
The buffer feeds the live matcher, answers the unflushed part of archive requests
(by type, keys and time ranges, and by event id), and is flushed to the archive in
batches. Appends and reads are serialized by one lock (001: "concurrent reads and
writes of the archived stream are controlled by a semaphore").

Events are kept as the record-shaped Arrow chunks the WAL wrote, tagged with their WAL
seq, so a flush takes a consistent prefix and drops exactly what it committed.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from archive.ranges import Request, request_mask
from archive.schema import conform, output_schema, output_to_events, record_schema, record_to_output
from engine.event_type import EventType
from engine.events import Event


@dataclass(slots=True)
class _Chunk:
    seq: int
    table: pa.Table
    added_s: float


class RecentBuffer:
    """In-memory unflushed events of every type, queryable by type, keys and ranges."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._chunks: dict[str, list[_Chunk]] = {}
        self._types: dict[str, EventType] = {}
        self._rows = 0
        self._merged: dict[str, tuple[pa.Schema, list[_Chunk], pa.Table]] = {}
        """Per type: the chunks last read, conformed to the record schema and concatenated (:meth:`_record`): a read
        conforms only the chunks added since (every archive request reads the buffer: issue 43)."""

    # ------------------------------------------------------------------ writing

    def add(self, etype: EventType, seq: int, table: pa.Table, *, now_s: float | None = None) -> None:
        """Append one WAL record's events (record-shaped) of ``etype``."""
        added = time.monotonic() if now_s is None else now_s
        with self._lock:
            self._types[etype.name] = etype
            self._chunks.setdefault(etype.name, []).append(_Chunk(seq, table, added))
            self._rows += table.num_rows

    def set_type(self, etype: EventType) -> None:
        """Record an evolved schema: older chunks are read with its new columns as nulls."""
        with self._lock:
            self._types[etype.name] = etype

    def take(self) -> tuple[int, dict[str, list[pa.Table]]]:
        """A consistent prefix to flush: the highest seq in the buffer and every chunk, per type."""
        with self._lock:
            top = max((c.seq for cs in self._chunks.values() for c in cs), default=0)
            return top, {t: [c.table for c in cs] for t, cs in self._chunks.items() if cs}

    def chunks(self, name: str) -> list[tuple[int, pa.Table]]:
        """``(WAL seq, record table)`` of every buffered chunk of type ``name``, oldest first."""
        with self._lock:
            return sorted(((c.seq, c.table) for c in self._chunks.get(name, [])), key=lambda c: c[0])

    def drop_through(self, seq: int, *, types: Iterable[str] | None = None) -> int:
        """Forget the chunks with WAL seq <= ``seq`` (of ``types``, default all): they are committed."""
        dropped = 0
        with self._lock:
            for name in list(self._chunks) if types is None else types:
                kept = [c for c in self._chunks.get(name, []) if c.seq > seq]
                dropped += sum(c.table.num_rows for c in self._chunks.get(name, []) if c.seq <= seq)
                self._chunks[name] = kept
                self._merged.pop(name, None)
            self._rows -= dropped
        return dropped

    # ------------------------------------------------------------------ reading

    @property
    def rows(self) -> int:
        """Events in the buffer."""
        return self._rows

    def oldest_s(self) -> float | None:
        """``time.monotonic()`` when the oldest buffered chunk arrived (None when empty)."""
        with self._lock:
            return min((cs[0].added_s for cs in self._chunks.values() if cs), default=None)

    def types(self) -> dict[str, EventType]:
        with self._lock:
            return dict(self._types)

    def _record(self, name: str) -> tuple[EventType, pa.Table] | None:
        """The type's buffered events as one record-shaped table (its current schema), oldest chunk first; the
        chunks conformed by an earlier read are taken from :attr:`_merged` when they are still the first ones."""
        with self._lock:
            etype = self._types.get(name)
            chunks = list(self._chunks.get(name, ()))
            cached = self._merged.get(name)
        if etype is None or not chunks:
            return None
        schema = record_schema(etype)
        done, parts = 0, []
        if cached is not None:
            c_schema, c_chunks, c_table = cached
            if (
                len(c_chunks) <= len(chunks) and c_schema.equals(schema)
                and all(a is b for a, b in zip(c_chunks, chunks))
            ):
                done, parts = len(c_chunks), [c_table]
        parts += [conform(c.table, schema) for c in chunks[done:]]
        table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
        if done < len(chunks):
            with self._lock:
                self._merged[name] = (schema, chunks, table)
        return etype, table

    def query(self, types: Iterable[str], request: Request | None = None) -> pa.Table:
        """Buffered events of ``types`` matching ``request`` (see :mod:`archive.ranges`; None: all).

        Returns
        -------
        pyarrow.Table
            Output-shaped (:func:`archive.schema.output_schema`) over the types found, in
            (ts, id) order.
        """
        parts = []
        for name in dict.fromkeys(types):
            got = self._record(name)
            if got is None:
                continue
            etype, table = got
            if request is not None:
                table = table.filter(pa.array(request_mask(etype, table, request)))
            parts.append(record_to_output(etype, table))
        if not parts:
            return output_schema([]).empty_table()
        known = self.types()
        schema = output_schema([known[n] for n in dict.fromkeys(types) if n in known])
        table = pa.concat_tables([conform(p, schema) for p in parts])
        return table.sort_by([("ts", "ascending"), ("id", "ascending")])

    def events(self, types: Iterable[str] | None = None, request: Request | None = None) -> list[Event]:
        """Buffered events as :class:`engine.events.Event`, in (ts, id) order (for the live matcher)."""
        return output_to_events(self.query(self.types() if types is None else types, request))

    def get(self, event_id: int, *, types: Iterable[str] | None = None) -> Event | None:
        """The buffered event with id ``event_id`` (None when not buffered)."""
        for name in self.types() if types is None else types:
            got = self._record(name)
            if got is None:
                continue
            etype, table = got
            hit = table.filter(pc.equal(table.column("id"), event_id))
            if hit.num_rows:
                return output_to_events(record_to_output(etype, hit.slice(0, 1)))[0]
        return None

