"""Live-and-archived queries in the service: off the ingest path, archive requests on a bounded pool.

A live-and-archived query (``LIVE ... ARCHIVED ... LOOKBACK ... JOIN``; docs/architecture.md sections 7.4, 7.7, 7.10)
runs in a :class:`LiveArchivedWorker`: a thread that owns the query's runner (ALAA, LLAA, OLLAA or
SLLAA, 001 section 4) and takes the events ingest hands it (:meth:`LiveArchivedWorker.offer`: a
queue append, never a wait). The runner defers every archive request it can (an SLLAA subwindow, an
LLAA or live-driven OLLAA instance) to :class:`ArchiveLookups`, a pool of a few threads shared by all
queries, so at most ``LACE_LA_LOOKUP_WORKERS`` Spark jobs run at once and the live side keeps
matching while they do. ALAA and archive-driven OLLAA read the archive on the worker's own thread
(they need the archived instances before they go on): they delay that query only.

Results go through ``record`` (alerts and outbox rows in one transaction, de-duplicated by (query,
event ids)). The archive is read through the service's Spark session and includes the recent
buffer: ingest archives every event before offering it, so a live instance sees every event
ingested before its start.

Restart (durability): the worker **acknowledges** (:meth:`LiveArchivedWorker._ack`) after each batch it matched
and after each deferred request whose results it committed: the last ingest position (``ingest_seq``) it matched
and the smallest position the query's unfinished work still needs, read from its one ledger
(:class:`engine.live_archived.ledger.Ledger`): every live instance enters it when the runner creates it and leaves
it when its results are committed; the live side's partial matches need the position of the live clock minus the
live span minus the lateness; nothing after the last position matched is needed by anything matched. The
checkpoint (every ``LACE_LA_CHECKPOINT_S``) writes the last acknowledged need as the query's ``resume_seq``; a
worker that has not acknowledged since holds it where it was. A restart replays the archive from there
(:mod:`service.live.recovery`), so after a SIGKILL every result is found again and recorded exactly once (the
alerts' de-duplication drops those that were already committed).
"""
from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from engine.events import Event
from engine.live_archived.base import MIN_TS, ArchiveWork, Runner
from engine.live_archived.counters import quantile
from engine.live_archived.ledger import Ledger
from engine.live_archived.plan import LiveArchivedPlan
from engine.match import Match
from engine.plugins.api import PluginError
from service.core.faults import crash_point
from service.live.event_time import END_OF_TIME

log = logging.getLogger(__name__)

_STOP = object()
MAX_DELAYS_KEPT = 10_000
"""Result delays kept per query for the percentiles (the most recent ones)."""
RETRY_MAX_S = 30.0


class ArchiveLookups:
    """A bounded pool of threads answering deferred archive requests (:class:`ArchiveWork`).

    Work waits per query; a pool thread takes a query's waiting work: every mergeable one at once
    (SLLAA subwindows that closed while the archive was busy become one request over the union of
    their access ranges: fewer Spark jobs exactly when they queue up), or the oldest other one (LLAA:
    one request per live instance, as the algorithm says).

    Parameters
    ----------
    workers : int
        Requests (Spark jobs) running at once, over all queries.
    observe : callable, optional
        ``observe(seconds)`` after each request (a metrics histogram).
    mergeable_in_flight : int, optional
        The most mergeable requests of one query running at once (None: up to ``workers``). A query process's
        pool has a thread per request in flight (:mod:`service.live.la_process`): without this bound every SLLAA
        subwindow would go at once and none would wait to be merged.
    """

    def __init__(
        self, workers: int, observe: Callable[[float], None] | None = None, *, mergeable_in_flight: int | None = None
    ) -> None:
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lace-archive")
        self.observe = observe
        self.lock = threading.Lock()
        self.waiting: dict[int, list[ArchiveWork]] = {}
        self.mergeable_in_flight = mergeable_in_flight
        self.merging: dict[int, int] = {}
        """Per query (``id(owner)``): mergeable requests running now."""

    def waiting_for(self, owner: LiveArchivedWorker) -> int:
        """Requests of ``owner`` queued, not yet taken by a pool thread."""
        with self.lock:
            return len(self.waiting.get(id(owner), ()))

    def submit(self, owner: LiveArchivedWorker, work: ArchiveWork) -> None:
        """Queue ``work``; a pool thread answers it (maybe merged), its results go to ``owner.finished``."""
        with self.lock:
            self.waiting.setdefault(id(owner), []).append(work)
        self.pool.submit(self._next, owner)
        crash_point("la.request_submitted")

    def _next(self, owner: LiveArchivedWorker) -> None:
        with self.lock:
            queue = self.waiting.get(id(owner))
            if not queue:
                return  # taken by an earlier call, merged
            limit = self.mergeable_in_flight
            if queue[0].mergeable and (limit is None or self.merging.get(id(owner), 0) < limit):
                taken = [w for w in queue if w.mergeable]
                queue[:] = [w for w in queue if not w.mergeable]
                self.merging[id(owner)] = self.merging.get(id(owner), 0) + 1
            else:  # the oldest one that is not mergeable; mergeable ones wait for a running one to finish
                first = next((n for n, w in enumerate(queue) if not w.mergeable), None)
                if first is None:
                    return
                taken = [queue.pop(first)]
            if not queue:
                del self.waiting[id(owner)]
        work = ArchiveWork.merged(taken) if len(taken) > 1 else taken[0]
        if len(taken) > 1:
            owner.merged += len(taken) - 1
        try:
            self._run(owner, work, taken)
        finally:
            if work.mergeable:
                with self.lock:
                    self.merging[id(owner)] -= 1
                    if not self.merging[id(owner)]:
                        del self.merging[id(owner)]
                    more = bool(self.waiting.get(id(owner)))
                if more:  # subwindows that closed meanwhile: one request now
                    self.pool.submit(self._next, owner)

    def _run(self, owner: LiveArchivedWorker, work: ArchiveWork, parts: list[ArchiveWork]) -> None:
        delay = 0.5
        while not owner.stopped:
            started = time.perf_counter()
            try:
                results = work.run()
            except PluginError as err:  # a plug-in the query names misbehaved: retrying cannot help
                owner.failed = str(err)
                log.error("live-and-archived query %s failed and stops matching: %s", owner.name, err)
                owner.finished(parts, [])
                return
            except Exception:  # Spark failed (e.g. a lost executor): retry, the instances wait
                owner.errors += 1
                log.exception("archive request of query %s failed; retrying in %.1f s", owner.name, delay)
                time.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            if self.observe is not None:
                self.observe(time.perf_counter() - started)
            owner.finished(parts, results)
            return

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class LiveArchivedWorker:
    """One live-and-archived query: its runner on a thread of its own (see the module docstring).

    Parameters
    ----------
    query_id, name
        The query's id and name.
    plan : LiveArchivedPlan
    make_runner : callable
        ``make_runner(defer) -> Runner`` (the algorithm, ``T_L``, budget and archive source are bound).
    lookups : ArchiveLookups
        Where deferred archive requests run.
    record : callable
        ``record(query_id, matches)``: commit results (alerts + outbox); raises when it cannot.
    lateness_us : int
        The largest allowed lateness of the query's event types, int microseconds.
    on_ack : callable, optional
        ``on_ack(last_seq, need)`` after each acknowledgement.
    on_error : callable, optional
        ``on_error(exception)`` when a batch raised (the batch is not acknowledged then).
    fault_batch : int, optional
        Raise on the n-th batch with events (a test fault).
    """

    def __init__(
        self,
        *,
        query_id: int,
        name: str,
        plan: LiveArchivedPlan,
        make_runner: Callable[[Callable[[ArchiveWork], None]], Runner],
        lookups: ArchiveLookups,
        record: Callable[[int, list[Match]], None],
        lateness_us: int,
        on_ack: Callable[[int, int], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        fault_batch: int | None = None,
    ) -> None:
        self.query_id = query_id
        self.name = name
        self.plan = plan
        self.lookups = lookups
        self.record = record
        self.lateness_us = lateness_us
        self.runner = make_runner(self._defer)
        self.ledger = Ledger()
        """The query's unfinished work (:mod:`engine.live_archived.ledger`): the runner enters each live instance,
        the worker takes it out once its results are committed."""
        self.runner.ledger = self.ledger
        self.on_ack = on_ack
        """``on_ack(last_seq, need)`` after each acknowledgement (:meth:`_ack`; a query process sends it)."""
        self.on_error = on_error
        """``on_error(exception)`` when matching a batch raised (not a plug-in's error): a pool worker reports it and
        exits before the batch is acknowledged (:mod:`service.live.la_process`); without it the error is logged and
        the worker goes on."""
        self.fault_batch = fault_batch
        """A test fault: raise on the n-th batch with events (``LACE_WORKER_FAULT``)."""
        self._batches = 0
        self.acked: tuple[int, int] | None = None
        """The last acknowledgement: (the last position matched, the smallest position its unfinished work
        needs); None until the worker has matched a batch with positions."""
        self._ack_lock = threading.Lock()
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.backlog = 0
        self.offered: collections.deque[float] = collections.deque()
        """When (wall seconds) each batch still queued was offered, oldest first (``backlog_s``)."""
        self.ended = False
        """Every type it reads ended: the runner was flushed (end of input) once."""
        self.in_flight: dict[int, ArchiveWork] = {}
        self.guard = threading.RLock()
        """Held while the runner works (it may wait for Spark there: ALAA, OLLAA's statistics)."""
        self.counts = threading.Lock()
        """Guards ``in_flight`` and ``backlog``: never held across a wait, so ingest never waits."""
        zero = {"p50": 0.0, "p99": 0.0}
        self._last_stats: dict[str, Any] = {**self.runner.stats(), "delay_ms": {"n": 0, "event": zero, "wall": zero}}
        """What :meth:`stats` answers while the runner is busy (complete from the start: readers index every key)."""
        self.stopped = False
        self.errors = 0
        self.failed: str | None = None
        """Why the query stopped matching: a plug-in it names misbehaved (issue 16)."""
        self.late = 0
        self.merged = 0
        """Deferred requests answered together with another one (SLLAA subwindows merged under load)."""
        self.cpu_s = 0.0
        """CPU seconds of the live side (the worker thread; archive requests not included)."""
        self._offered_at = 0.0
        self.closed_at: dict[int, float] = {}
        self.close_to_commit_s: collections.deque[float] = collections.deque(maxlen=MAX_DELAYS_KEPT)
        """Per answered request: from the ingest (POST) that closed it to its results committed, seconds."""
        self.thread = threading.Thread(target=self._loop, name=f"lace-la-{query_id}", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------ called by ingest (under its lock)

    def offer(
        self,
        events: list[Event],
        watermark_us: int | None,
        *,
        seqs: Sequence[int | None] | None = None,
        upto: int | None = None,
        offered_at: float | None = None,
        idle: bool = False,
    ) -> None:
        """Hand over accepted events (already archived) and the query's watermark; never waits.

        ``seqs``: the events' ingest positions (``ingest_seq``, one per event; None: unknown), what the worker
        acknowledges (:meth:`_ack`); ``upto``: the service's last ingest position when it offered them (every event
        of the query's types up to it has been offered).

        ``offered_at``: when ingest handed them over (wall seconds, default now), the start of
        ``close_to_commit_ms`` for the requests they close. ``idle``: every type the query reads is idle or
        ended (the runner closes what only batches requests: ``Runner.idle``). A watermark of
        :data:`~service.live.event_time.END_OF_TIME` (every type ended) flushes the runner: every live instance
        completes and every pending one is answered.
        """
        at = time.time() if offered_at is None else offered_at
        with self.counts:
            self.backlog += len(events)
            self.offered.append(at)
        self.queue.put((events, seqs, upto, watermark_us, at, idle))

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the worker's thread once everything offered before it is matched."""
        self.queue.put(fn)

    def settle(self, timeout_s: float) -> bool:
        """Answer what is due before the query stops (a pause or an update): match what was offered, close what waits
        only to batch archive requests (``Runner.idle``: SLLAA's open subwindow, ALAA's live window, archive-driven
        OLLAA's held refresh batch; closing early changes no result), then wait until every archive request is
        answered and its results committed. Live instances not
        complete (partial matches) stay as they are. Returns False when that took more than ``timeout_s`` wall
        seconds (the worker goes on; nothing is dropped)."""
        deadline = time.monotonic() + timeout_s
        matched = threading.Event()
        self.offer([], None, idle=True)
        self.call(matched.set)
        if not matched.wait(timeout_s):
            return False
        while True:
            with self.guard:
                waiting = len(self.runner.waiting())
            with self.counts:
                busy = bool(self.in_flight) or self.backlog > 0
            if not waiting and not busy:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop the thread; deferred requests still running are abandoned (a restart replays them)."""
        self.stopped = True
        self.queue.put(_STOP)
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=10)

    # ------------------------------------------------------------------ the thread

    def _loop(self) -> None:
        runner = self.runner
        while True:
            item = self.queue.get()
            if item is _STOP:
                return
            if callable(item):
                item()
                continue
            events, seqs, upto, watermark, self._offered_at, idle = item
            out: list[Match] = []
            started = time.thread_time()
            if self.failed is not None:  # a plug-in failed before: the query matches no more
                with self.counts:
                    self.backlog -= len(events)
                    self.offered.popleft()
                continue
            self.ledger.offered(events, seqs, upto)
            try:
                with self.guard:
                    if events and self.fault_batch is not None:
                        self._batches += 1
                        if self._batches == self.fault_batch:
                            raise RuntimeError(f"injected fault (LACE_WORKER_FAULT) on batch {self._batches}")
                    if events:
                        found, late = runner.push_many(events)
                        out += found
                        self.late += late
                    if watermark is not None and watermark >= END_OF_TIME:
                        if not self.ended:  # every type ended: end of input
                            self.ended = True
                            out += runner.flush()
                    elif watermark is not None:
                        due = runner.next_deadline()
                        if due is not None and due <= watermark:
                            out += runner.advance(watermark)
                    if idle:
                        out += runner.idle()
            except PluginError as err:
                self.failed = str(err)
                log.error("live-and-archived query %s failed and stops matching: %s", self.name, err)
            except Exception as err:
                if self.on_error is not None:  # the worker ends here, this batch not acknowledged
                    self.on_error(err)
                    return
                log.exception("live-and-archived query %s failed on %d events", self.name, len(events))
            self.cpu_s += time.thread_time() - started
            if not out or self._commit(out):
                self.ledger.committed()  # what the runner answered in this batch is recorded
            self.ledger.matched()
            span = self.plan.live_span_us
            clock = runner.live_clock
            if span is None:  # unbounded: its partial matches may hold anything since the first event
                self.ledger.settle_live(None)
            else:  # no live event matched yet: no partial match, nothing before the next position
                self.ledger.settle_live(clock - span - self.lateness_us if clock > MIN_TS else END_OF_TIME)
            self._ack()
            with self.counts:
                self.backlog -= len(events)
                self.offered.popleft()

    def _defer(self, work: ArchiveWork) -> None:
        with self.counts:  # called by the runner, on this thread
            self.in_flight[id(work)] = work
            self.closed_at[id(work)] = self._offered_at
        self.lookups.submit(self, work)

    def finished(self, works: list[ArchiveWork], results: list[Match]) -> None:
        """Deferred requests are answered (pool thread): commit their results, then forget them (their live
        instances leave the ledger, and the worker acknowledges again)."""
        if results and not self._commit(results):
            return  # stopped: nothing is recorded, nothing leaves
        self.ledger.leave([i for w in works for i in w.instances])
        self._ack()
        now = time.time()
        with self.counts:
            for work in works:
                self.in_flight.pop(id(work), None)
                closed = self.closed_at.pop(id(work), None)
                if closed is not None:
                    self.close_to_commit_s.append(now - closed)

    def _commit(self, results: list[Match]) -> bool:
        """Record ``results``, retrying until it works; False when the worker stopped first (not recorded)."""
        delay = 0.5
        while not self.stopped:
            try:
                self.record(self.query_id, results)
            except Exception:
                log.exception("recording %d results of query %s failed; retrying", len(results), self.name)
                time.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            return True
        return False

    def _ack(self) -> None:
        """Acknowledge: (the last position matched, the smallest position the query's unfinished work needs,
        :meth:`Ledger.need`), kept in :attr:`acked` and handed to ``on_ack``. Nothing before a batch with
        positions was matched."""
        with self._ack_lock:
            need = self.ledger.need()
            last = self.ledger.last_seq
            if need is None or last is None or (self.acked is not None and self.acked == (last, need)):
                return
            self.acked = (last, need)
            if self.on_ack is not None:
                self.on_ack(last, need)

    # ------------------------------------------------------------------ what the service reads

    def stats(self) -> dict[str, Any]:
        """The runner's counters plus the worker's: ``backlog_events`` (offered, not yet matched) and ``backlog_s``
        (wall seconds since the oldest of them was offered: how far behind ingest it is), ``requests_in_flight``
        (deferred archive requests not answered) of which ``requests_waiting`` wait for a pool thread,
        ``oldest_pending`` (``start_us``: the earliest start of a live instance waiting for the archive, int us UTC,
        None when none; ``since``: when it completed or its request was made, wall seconds; ``wait_s``: since then),
        ``caught_up`` (no backlog, no request in flight: every result due so far is recorded), delays p50/p99.

        When the runner is busy (waiting for Spark) for more than 0.2 s, the last counters are returned
        with the worker's current backlog and requests in flight.
        """
        waiting = self.lookups.waiting_for(self)
        now = time.time()
        with self.counts:
            starts = [w.earliest_start_us for w in self.in_flight.values()]
            live = {
                "backlog_events": self.backlog,
                "backlog_s": round(max(0.0, now - self.offered[0]), 3) if self.backlog and self.offered else 0.0,
                "requests_in_flight": len(self.in_flight),
                "requests_waiting": waiting,
                "caught_up": self.backlog == 0 and not self.in_flight,
                "in_flight_instances": sum(len(w.instances) for w in self.in_flight.values()),
                "errors": self.errors,
                "worker_late": self.late,
                **({"failed": self.failed} if self.failed is not None else {}),
                "cpu_s": round(self.cpu_s, 6),
                "requests_merged": self.merged,
                "close_to_commit_ms": _pcts([x * 1_000 for x in self.close_to_commit_s]),
                "requests_answered": len(self.close_to_commit_s),
            }
        if not self.guard.acquire(timeout=0.2):
            last = self._last_stats.get("oldest_pending") or {}
            if last.get("start_us") is not None:
                starts.append(last["start_us"])
            return {**self._last_stats, **live, "oldest_pending": _oldest(starts, last.get("since"), now)}
        try:
            d = self.runner.stats()
            sub = self.runner.waiting()
            starts += [i.match.start for i in sub]
            since = None
            if sub:  # LiveInstance.completed_wall is the runner's clock: turned into wall time here
                since = now - (self.runner.clock() - min(i.completed_wall for i in sub))
            with self.counts:
                if self.in_flight:
                    closed = min(self.closed_at.get(k, now) for k in self.in_flight)
                    since = closed if since is None else min(since, closed)
            d["oldest_pending"] = _oldest(starts, since, now)
            c = self.runner.counters
            with self.runner.lock:
                if len(c.delay_event_us) > MAX_DELAYS_KEPT:
                    del c.delay_event_us[:-MAX_DELAYS_KEPT], c.delay_wall_s[:-MAX_DELAYS_KEPT]
                ev = _pcts([x / 1_000 for x in c.delay_event_us])
                wall = _pcts([x * 1_000 for x in c.delay_wall_s])
                n = len(c.delay_event_us)
            d["delay_ms"] = {"n": n, "event": ev, "wall": wall}
            self._last_stats = d
        finally:
            self.guard.release()
        return {**d, **live}


def _oldest(starts: list[int], since: float | None, now: float) -> dict[str, Any]:
    """``stats.oldest_pending``: the earliest start (event time, int us UTC) of a live instance waiting for the
    archive (open subwindow or request in flight; None: none) and the wall seconds it has waited."""
    if not starts:
        return {"start_us": None, "since": None, "wait_s": 0.0}
    return {"start_us": min(starts), "since": since, "wait_s": round(max(0.0, now - (since or now)), 3)}


def _pcts(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p99": 0.0}
    xs = sorted(values)
    return {"p50": round(quantile(xs, 0.5), 3), "p99": round(quantile(xs, 0.99), 3)}
