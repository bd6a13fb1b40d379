"""One host's live-and-archived queries behind one index by event type (docs/architecture.md section 3, issue 43).

A host is a worker process of the pool (:mod:`service.live.la_process`) or, with ``LACE_LA_PROCESS=false``, the
service itself (:class:`ThreadWorkers`). Ingest hands a host each batch once, with every query's watermark and
idleness (``marks``); :meth:`Feeds.offer` groups the batch by event type once and gives each query the events of
the types it reads (the same list when it reads every type of the batch), in batch order, with their ingest
positions, as Esper's shared filter index and Siddhi's one decode per stream do. A query that gets no event is
offered a watermark only when it moved, and its types' idleness once per quiet spell.

What a query is given goes to its :class:`~service.live.live_archived.LiveArchivedWorker` (``offer``: a queue
append, never a wait). Timestamps are int microseconds UTC.
"""
from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from engine.events import Event

Marks = dict[int, tuple[int | None, bool]]
"""Per query id: (its watermark, int us or None; whether every type it reads is idle or ended)."""


class WorkersBusy(RuntimeError):
    """The events queued for live-and-archived workers reached their bound (``LACE_WORKER_BACKLOG``): ingest
    refuses the request before anything is durable (503 with Retry-After)."""


class QueryWorker(Protocol):
    """What a host feeds: :class:`~service.live.live_archived.LiveArchivedWorker`'s ``offer``."""

    def offer(
        self, events: list[Event], watermark_us: int | None, *, seqs: Sequence[int | None] | None = None,
        upto: int | None = None, offered_at: float | None = None, idle: bool = False,
    ) -> None: ...


def by_type(events: Sequence[Event]) -> dict[str, list[int]]:
    """Event type -> the indices of ``events`` of that type, in order (the batch's index)."""
    out: dict[str, list[int]] = {}
    for i, e in enumerate(events):
        idx = out.get(e.type)
        if idx is None:
            out[e.type] = [i]
        else:
            idx.append(i)
    return out


class Feed:
    """One query of a host: the types it reads, its worker, and what it was last told (watermark, idleness)."""

    __slots__ = ("types", "worker", "offered_wm", "offered_idle")

    def __init__(self, types: frozenset[str], worker: QueryWorker) -> None:
        self.types = types
        self.worker = worker
        self.offered_wm: int | None = None
        self.offered_idle = False

    def offer(
        self, events: list[Event], seqs: Sequence[int | None], index: dict[str, list[int]], upto: int | None,
        watermark_us: int | None, idle: bool, at: float | None,
    ) -> None:
        """Give the worker the events of its types (``index``: :func:`by_type` of ``events``), or the watermark
        when it moved, or the idleness once per quiet spell."""
        present = [t for t in index if t in self.types]
        if len(present) == len(index):  # every type of the batch: the batch as it is
            mine, mine_seqs = events, seqs
        else:
            picked = index[present[0]] if len(present) == 1 else list(heapq.merge(*(index[t] for t in present)))
            mine, mine_seqs = [events[i] for i in picked], [seqs[i] for i in picked]
        idle = idle and not mine
        wm = watermark_us
        if mine or (wm is not None and (self.offered_wm is None or wm > self.offered_wm)) or (
            idle and not self.offered_idle
        ):
            self.offered_wm = wm
            self.worker.offer(mine, wm, seqs=mine_seqs, upto=upto, offered_at=at, idle=idle)
        self.offered_idle = idle


class Feeds:
    """A host's queries by id, fed through one index by event type (module docstring)."""

    def __init__(self) -> None:
        self.feeds: dict[int, Feed] = {}

    def add(self, query_id: int, types: frozenset[str], worker: QueryWorker) -> None:
        """Feed ``worker`` the events of ``types`` under ``query_id`` from the next batch on."""
        self.feeds[query_id] = Feed(frozenset(types), worker)

    def remove(self, query_id: int) -> Feed | None:
        """Feed the query nothing more; its feed, or None."""
        return self.feeds.pop(query_id, None)

    def offer(
        self, events: list[Event], seqs: Sequence[int | None], upto: int | None, marks: Marks,
        at: float | None = None, index: dict[str, list[int]] | None = None,
    ) -> None:
        """One batch (``seqs``: the events' ingest positions; ``upto``: the service's last position then) for the
        queries named in ``marks`` (each with its watermark and idleness); ``at``: when ingest offered it, wall s."""
        idx = by_type(events) if index is None else index
        for qid, (wm, idle) in marks.items():
            feed = self.feeds.get(qid)
            if feed is not None:
                feed.offer(events, seqs, idx, upto, wm, idle, at)


class ThreadWorkers:
    """The in-thread host (``LACE_LA_PROCESS=false``): every live-and-archived query on a thread of the service,
    fed by :class:`Feeds`. Offers the runtime what :class:`~service.live.la_process.WorkerPool` offers
    (``offer``, ``start``, ``remove``, ``busy``, ``close``, ``stats``)."""

    def __init__(self) -> None:
        self.feeds = Feeds()
        self.workers: dict[int, Any] = {}
        self.lock = threading.Lock()

    def start(self, query_id: int, types: frozenset[str], make: Callable[[], Any]) -> Any:
        """Start ``make()`` (a :class:`~service.live.live_archived.LiveArchivedWorker`) as query ``query_id``."""
        worker = make()
        with self.lock:
            self.workers[query_id] = worker
            self.feeds.add(query_id, types, worker)
        return worker

    def remove(self, query_id: int) -> None:
        """Stop query ``query_id``'s worker (its deferred requests are abandoned)."""
        with self.lock:
            worker = self.workers.pop(query_id, None)
            self.feeds.remove(query_id)
        if worker is not None:
            worker.stop()

    def offer(self, events: list[Event], seqs: Sequence[int | None], upto: int | None, marks: Marks) -> None:
        """See :meth:`Feeds.offer` (never waits)."""
        with self.lock:
            self.feeds.offer(events, seqs, upto, marks)

    def check_room(self) -> None:
        """Nothing is bounded here: a thread's queue takes every batch."""

    def close(self) -> None:
        """Stop every worker."""
        for qid in list(self.workers):
            self.remove(qid)

    def stats(self) -> dict[str, Any]:
        """The host's counters: no worker processes."""
        return {"mode": "in-thread", "workers": [], "restarts": 0}


__all__ = ["Feed", "Feeds", "Marks", "QueryWorker", "ThreadWorkers", "WorkersBusy", "by_type"]
