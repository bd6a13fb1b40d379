"""One scheduler for every live-and-archived query's archive requests (issue 25).

Each algorithm keeps its own logical archive requests (an SLLAA subwindow, an LLAA live instance, ...: what 001
section 6 compares, counted per query as before). The requests waiting at one moment, from every query, are
answered together: a pool thread takes the oldest waiting request and every other waiting request of the same
event types, key attribute and keyedness, and one read answers them all
(:meth:`archive.archived_source.SparkArchiveSource.extract_tables`: the union of their keys and access ranges,
their archived patterns' single-event conditions joined by OR; at most one Spark job, none for a small read).
Each request gets exactly the rows it would get alone.

Bounded: at most ``workers`` reads at once (``LACE_LA_LOOKUP_WORKERS``). Fair: requests are taken oldest first,
and a read takes every waiting request of its set, so no query waits behind another query's later requests.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from archive.archived_source import Answer, Extract

log = logging.getLogger(__name__)

MAX_BATCH = 256
"""The most requests one read answers (a bound on the union's size; the rest wait for the next read)."""


class BatchSource(Protocol):
    """What the scheduler reads from (:class:`archive.archived_source.SparkArchiveSource`)."""

    def extract_tables(self, requests: list[Extract]) -> list[Answer]: ...


class ArchiveScheduler:
    """Answers archive requests from every live-and-archived query, batched (see the module docstring).

    Parameters
    ----------
    source : BatchSource
        The service's archive source (``extract_tables``).
    workers : int
        Reads running at once.
    observe : callable, optional
        ``observe(seconds)`` after each read (a metrics histogram).
    """

    def __init__(self, source: BatchSource, workers: int, observe: Callable[[float], None] | None = None) -> None:
        self.source = source
        self.observe = observe
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="lace-archive-read")
        self.lock = threading.Lock()
        self.waiting: list[tuple[Extract, Future[Answer]]] = []
        self.reads = 0
        """Reads made (each at most one Spark job)."""
        self.answered = 0
        """Requests answered; ``answered - reads`` were answered by another request's read."""
        self.largest = 0
        """The most requests one read answered."""

    def submit(self, request: Extract) -> Future[Answer]:
        """Queue ``request``; the future gets its ``(table, keep)`` (or the read's exception)."""
        fut: Future[Answer] = Future()
        with self.lock:
            self.waiting.append((request, fut))
        self.pool.submit(self._read)
        return fut

    def _read(self) -> None:
        with self.lock:
            if not self.waiting:
                return  # answered by an earlier read
            key = self.waiting[0][0].batch_key()
            taken: list[tuple[Extract, Future[Answer]]] = []
            rest: list[tuple[Extract, Future[Answer]]] = []
            for item in self.waiting:
                (taken if len(taken) < MAX_BATCH and item[0].batch_key() == key else rest).append(item)
            self.waiting = rest
        started = time.perf_counter()
        try:
            answers = self.source.extract_tables([r for r, _ in taken])
        except Exception as e:  # noqa: BLE001 - each caller gets it (and retries, as a lone request would)
            log.debug("archive read for %d request(s) failed", len(taken), exc_info=True)
            for _, fut in taken:
                fut.set_exception(e)
            return
        if self.observe is not None:
            self.observe(time.perf_counter() - started)
        with self.lock:
            self.reads += 1
            self.answered += len(taken)
            self.largest = max(self.largest, len(taken))
        for (_, fut), answer in zip(taken, answers):
            fut.set_result(answer)

    def stats(self) -> dict[str, int]:
        """``{"reads", "requests", "largest_batch", "waiting"}``: reads made, requests they answered, the most
        one read answered, requests waiting now."""
        with self.lock:
            return {"reads": self.reads, "requests": self.answered, "largest_batch": self.largest,
                    "waiting": len(self.waiting)}

    def close(self) -> None:
        """Stop taking requests; the waiting ones fail."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        with self.lock:
            waiting, self.waiting = self.waiting, []
        for _, fut in waiting:
            fut.set_exception(RuntimeError("the service is stopping"))
