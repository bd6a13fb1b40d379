"""The service's durable ingest order: where each accepted event stands, and where a statement resumes
(docs/architecture.md section 4).

Every event the live runtime accepts gets ``ingest_seq``, its position in the ingest order (one more than
the previous event's, across requests and restarts), and its request's ``ingested_at`` stamp (strictly
larger than the previous request's, across restarts, close to the wall clock, int microseconds UTC). Both
are archived with the event (the WAL makes them durable before the request is answered), and the next
values after a restart come from the archive (:meth:`IngestOrder.resume_after`).

A statement's checkpoint is a position in this order: replaying every event from its ``resume_seq`` on,
in this order, rebuilds its state. The position is found from an event-time horizon (the earliest event
time its state may still need) with a coarse index of the order (:meth:`IngestOrder.position_of`):
buckets of consecutive positions, each with the largest event time in it. The index is exact in the safe
direction (a position never lies after an event the horizon needs) and bounded (old buckets merge).
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from engine.events import Event

MAX_BUCKETS = 4_096
"""Index buckets kept; beyond it the two oldest merge (positions grow coarser, never wrong)."""
BUCKET_S = 1.0
"""Wall seconds one bucket covers before the next one starts, by default (``LACE_INGEST_ORDER_BUCKET_S``)."""
BUCKET_EVENTS = 10_000
"""Positions one bucket covers at most (the restart replay notes many in a second)."""


@dataclass(slots=True)
class _Bucket:
    first_seq: int
    max_ts_end: int
    started_s: float
    events: int = 0


class IngestOrder:
    """Assigns ingest positions and stamps, and maps event-time horizons to positions.

    Not thread-safe: the runtime calls it under its ingest lock.
    """

    def __init__(self, bucket_s: float = BUCKET_S) -> None:
        """``bucket_s``: wall seconds one bucket of the index covers before the next one starts (> 0)."""
        if not bucket_s > 0:
            raise ValueError(f"bucket_s must be > 0, not {bucket_s}")
        self.bucket_s = bucket_s
        self.next_seq = 1
        """The position the next accepted event gets."""
        self.last_stamp = 0
        """The last request's ``ingested_at``, int us."""
        self.floor = 1
        """The first position the index knows (events before it are in no bucket)."""
        self.last_noted: int | None = None
        """The last position noted (:meth:`note`): the event being processed; a derived event, which has no position
        of its own, is offered to live-and-archived workers at it (its inputs lie at or before it)."""
        self._buckets: list[_Bucket] = []

    def resume_after(self, last_seq: int | None, last_stamp: int | None) -> None:
        """Continue after the archive's newest ``ingest_seq`` and ``ingested_at`` (a restart); the index starts
        empty at the next position (the restart replay lowers :attr:`floor` to the first position it reads)."""
        if last_seq is not None:
            self.next_seq = max(self.next_seq, last_seq + 1)
        if last_stamp is not None:
            self.last_stamp = max(self.last_stamp, last_stamp)
        self.floor = self.next_seq
        self._buckets.clear()

    def stamp(self, now_us: int) -> int:
        """The next request's ``ingested_at``: ``now_us``, or one more than the last stamp when the clock
        has not moved on (or went back)."""
        self.last_stamp = max(now_us, self.last_stamp + 1)
        return self.last_stamp

    def take(self, events: list[Event]) -> list[int]:
        """Positions for ``events`` (accepted, in arrival order), and note them in the index."""
        first = self.next_seq
        self.next_seq += len(events)
        self.note(first, events)
        return list(range(first, first + len(events)))

    def note(self, first_seq: int, events: Iterable[Event]) -> None:
        """Index ``events`` at positions from ``first_seq`` (the restart replay notes what it reads)."""
        ends = [e.ts_end for e in events]
        if not ends:
            return
        self.last_noted = first_seq + len(ends) - 1
        top = max(ends)
        now = time.monotonic()
        last = self._buckets[-1] if self._buckets else None
        if (
            last is not None
            and now - last.started_s < self.bucket_s
            and last.events < BUCKET_EVENTS
            and first_seq >= last.first_seq
        ):
            last.max_ts_end = max(last.max_ts_end, top)
            last.events += len(ends)
            return
        self._buckets.append(_Bucket(first_seq, top, now, len(ends)))
        if len(self._buckets) > MAX_BUCKETS:
            a, b = self._buckets[0], self._buckets[1]
            merged = _Bucket(a.first_seq, max(a.max_ts_end, b.max_ts_end), a.started_s, a.events + b.events)
            self._buckets[:2] = [merged]

    def position_of(self, horizon_us: int, known_from: int) -> int:
        """The position from which replaying rebuilds a statement's state that reaches back to ``horizon_us``
        (int us): every event before it has an event time (``ts_end``) below the horizon, or lies before
        ``known_from`` (the statement's previous position: nothing before it matters to it any more).

        Positions only move forward. When ``known_from`` lies before what the index knows (:attr:`floor`),
        ``known_from`` is kept.
        """
        if known_from < self.floor:
            return known_from
        pos = self.next_seq
        for b in self._buckets:
            if b.max_ts_end >= horizon_us:
                pos = b.first_seq
                break
        return max(pos, known_from)

    def forget_before(self, seq: int) -> None:
        """Drop buckets wholly before ``seq`` (no statement resumes there any more)."""
        keep = 0
        while keep + 1 < len(self._buckets) and self._buckets[keep + 1].first_seq <= seq:
            keep += 1
        if keep:
            del self._buckets[:keep]
            self.floor = self._buckets[0].first_seq
