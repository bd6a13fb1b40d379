"""The live engine of the service: the running statements, wired to the ingest path, event time, the archive
and the alerts (docs/architecture.md sections 2-4).

Every statement but a live-and-archived one is a node of one rule graph (:class:`engine.rules.graph.RuleGraph`:
filters first, derived streams between, each node a detector of :mod:`engine.detector`); a live-and-archived
query runs on a :class:`~service.live.live_archived.LiveArchivedWorker` (its own thread, or its own process,
archive requests on a bounded pool: ingest never waits for Spark). Every query runs under a partial-match budget
(``pm_capacity``, STPM or TPM spilling to the database's partial-match table; docs/architecture.md section 7.6).

The parts, each in its own module: the ingest path (:mod:`service.live.ingest`), event time
(:mod:`service.live.event_time`), the durable ingest order (:mod:`service.live.ingest_order`), a running
statement (:mod:`service.live.live_query`) and what runs it, the graph or a worker (:mod:`service.live.run`: the
runtime never asks which), the statement registry that starts and stops those runs (:mod:`service.live.registry`,
:attr:`LiveRuntime.registry`), the recording of results as alerts (:mod:`service.live.results`,
:attr:`LiveRuntime.results`), checkpoints and the restart replay (:mod:`service.live.recovery`). What stays here is
their composition: the event types, what is running (``queries``, ``by_type``, ``emitters``, ``offered``), the locks,
and event time's advance and offer to the running statements. No part imports this module: each names what it needs
of the runtime as a small ``Protocol`` of its own, which :class:`LiveRuntime` satisfies
(:class:`~service.live.ingest.IngestHost`, :class:`~service.live.registry.RegistryHost`,
:class:`~service.live.recovery.RecoveryHost`, :class:`~service.live.warm.WarmHost`,
:class:`~service.live.gauges.GaugeSource`, and a run's :class:`~service.live.live_query.RunHost`), so service/live
has no import circle (``tests/service/test_live_imports.py``).

Queries start (create, update, resume) at ``active_since_us``, an instant taken under the lock; every later
request gets a larger ``ingested_at`` stamp, which is how a restart replay feeds each query exactly the events it
saw live. Live-and-archived results are committed by their worker when they are found.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy.orm import Session, sessionmaker

from engine.detector import DEFAULT_TOLERANCE_US
from engine.event_type import EventType, schema
from engine.events import Event
from engine.limits import QueryLimits
from engine.live_archived.source import ArchiveSource
from engine.options import Algorithm, PmPolicy
from engine.pm.store import PartialMatchStore
from engine.rules.graph import RuleGraph
from engine.rules.index import RuleIndex
from service.core.metrics import Metrics
from service.db.session import now_us
from service.live.applying_lock import ApplyingLock
from service.live.archive_scheduler import ArchiveScheduler, BatchSource
from service.live.event_time import EventTime
from service.live.feeds import ThreadWorkers
from service.live.gauges import refresh_gauges
from service.live.ingest import Ingest, IngestResult
from service.live.ingest_order import IngestOrder
from service.live.la_process import REQUESTS_IN_FLIGHT, WORKER_BACKLOG, WorkerPool, default_workers
from service.live.live_archived import ArchiveLookups
from service.live.live_query import LiveQuery, RunOptions
from service.live.outbox import Found
from service.live.recovery import not_archived
from service.live.registry import StatementRegistry
from service.live.results import Results

__all__ = ["Ended", "IngestResult", "LiveQuery", "LiveRuntime", "RunOptions"]


@dataclass(slots=True)
class Ended:
    """What ending a stream closed (:meth:`LiveRuntime.end_type`): the running statements whose every type has
    ended, the rule-graph results recorded, and per live-and-archived query its live instances pending then."""

    queries: list[str]
    results: int
    pending: dict[str, int]


class LiveRuntime:
    """Event types, live queries and the ingest path.

    Parameters
    ----------
    sessions : sessionmaker
        Database sessions (alerts and outbox).
    metrics : Metrics
    archive : object, optional
        An :class:`archive.writer.ArchiveWriter` (``append(events)``, durable on return).
    max_reported : int
        Rejections listed one by one in a response.
    source : ArchiveSource, optional
        What live-and-archived queries read (the service's Delta archive through Spark, the
        recent buffer included); without it they cannot be started.
    pm_store : PartialMatchStore, optional
        Where queries spill partial matches beyond their budget (default: in memory).
    defaults : RunOptions
        The service defaults (every field set).
    lookup_workers : int
        Archive requests of live-and-archived queries that run at once.
    requests_in_flight : int
        Archive requests of one live-and-archived query at the scheduler at once
        (``LACE_LA_REQUESTS_IN_FLIGHT``; :class:`~service.live.la_process.ChildSpec`).
    la_process : bool
        Run live-and-archived queries in the worker pool (else on threads of the service).
    workers : int, optional
        Worker processes of the pool (``LACE_WORKERS``; default the cores minus one, at least one).
    worker_backlog : int
        Events queued for one worker at most (``LACE_WORKER_BACKLOG``); ingest answers 503 past it.
    worker_fault : str, optional
        ``LACE_WORKER_FAULT`` (tests): ``raise:<query name>:<n>``.
    ingest_order_bucket_s : float
        ``LACE_INGEST_ORDER_BUCKET_S``: wall seconds one bucket of the ingest order's index covers.
    """

    def __init__(
        self,
        *,
        sessions: sessionmaker[Session],
        metrics: Metrics,
        archive: Any = None,
        max_reported: int = 1_000,
        source: ArchiveSource | None = None,
        pm_store: PartialMatchStore | None = None,
        defaults: RunOptions | None = None,
        lookup_workers: int = 2,
        requests_in_flight: int = REQUESTS_IN_FLIGHT,
        max_future_skew_us: int = 86_400_000_000,
        idle_timeout_s: float = 60.0,
        dedup_window: int = 200_000,
        limits: QueryLimits | None = None,
        replay_max_us: int = 7 * 86_400_000_000,
        la_process: bool = False,
        workers: int | None = None,
        worker_backlog: int = WORKER_BACKLOG,
        worker_fault: str | None = None,
        ingest_order_bucket_s: float = 1.0,
    ) -> None:
        self.sessions = sessions
        self.la_process = la_process
        """Run the live-and-archived queries in the worker pool's processes (``LACE_LA_PROCESS``), else on threads."""
        self.la_requests_in_flight = requests_in_flight
        """Archive requests of one query at the scheduler at once (``LACE_LA_REQUESTS_IN_FLIGHT``)."""
        self.metrics = metrics
        self.archive = archive
        self.source = source
        self.pm_store = pm_store
        self.defaults = defaults or RunOptions(Algorithm.sllaa, DEFAULT_TOLERANCE_US, None, PmPolicy.stpm)
        self.lookups = ArchiveLookups(lookup_workers, metrics.archive_request_seconds.observe)
        self.scheduler = ArchiveScheduler(
            cast("BatchSource", source), lookup_workers, metrics.archive_request_seconds.observe
        ) if source is not None and hasattr(source, "extract_tables") else None
        """Reads the archive for every live-and-archived query run in the worker pool, batched (issue 25)."""
        self.lock = ApplyingLock()
        """Held by ingest for a whole request and by every change of the running statements; a change that
        needs no answer from the running state is deferred to its holder
        (:meth:`~service.live.registry.StatementRegistry.start_deferred`)."""
        self.control = threading.RLock()
        """Serializes the REST changes of statements and event types (taken before :attr:`lock`)."""
        self.stamp_lock = threading.Lock()
        """Orders activation instants (:meth:`activation_us`) and ingest stamps: a change deferred before a
        request's stamp applies to it, one deferred after applies from the next request."""
        self.types: dict[str, EventType] = {}
        self.queries: dict[int, LiveQuery] = {}
        self.offered: dict[int, LiveQuery] = {}
        """The statements run by live-and-archived workers, which :meth:`offer` hands events (the others are
        nodes of :attr:`graph`); in start order, as :attr:`queries`."""
        self.by_type: dict[str, list[LiveQuery]] = {}
        self.event_time = EventTime(self._type_lateness, idle_timeout_s)
        """Per event type: the newest ts accepted and its watermark (:mod:`service.live.event_time`)."""
        self.order = IngestOrder(ingest_order_bucket_s)
        """Positions in the durable ingest order; statements' checkpoints (:mod:`service.live.ingest_order`)."""
        self.ingest_path = Ingest(
            self, max_reported=max_reported, max_future_skew_us=max_future_skew_us, dedup_window=dedup_window
        )
        self.limits = limits or QueryLimits()
        self.replay_max_us = replay_max_us
        self.graph = RuleGraph(auto_advance=False, measure_cpu=True, router=RuleIndex())
        """Every statement but the live-and-archived ones: filters first, derived streams between (003)."""
        self.graph.time_budget_s = self.limits.max_match_s
        self.graph.budget_note = (
            "; a query may match one request for at most LACE_QUERY_MAX_MATCH_S of CPU time; it stops here: "
            "narrow its WITHIN or add predicates, then resume or update it"
        )
        self.graph.keep_derived = True
        self.emitters: dict[str, set[int]] = {}
        """Derived event type -> the queries that EMIT INTO it."""
        self.replaying = False
        """True while the restart replay advances the statements (the derived events it derives again are archived
        already, but for those a crash kept from the archive: :func:`service.live.recovery.not_archived`)."""
        self.workers: WorkerPool | ThreadWorkers
        """Where the live-and-archived queries run (:meth:`offer` hands it each batch once): the worker pool
        (``LACE_WORKERS`` processes, :class:`~service.live.la_process.WorkerPool`) or, without ``la_process`` or a
        scheduler, threads of the service (:class:`~service.live.feeds.ThreadWorkers`)."""
        if la_process and self.scheduler is not None:
            from service.live.recovery import worker_replay

            self.workers = WorkerPool(
                workers=workers or default_workers(), source=source, spark_pool=self.lookups.pool,
                scheduler=self.scheduler, submit=self.results_submit, lock=self.lock,
                position=lambda: self.order.last_noted, replay=lambda ids, upto: worker_replay(self, ids, upto),
                backlog=worker_backlog, on_restart=metrics.worker_restarts.inc, fault=worker_fault,
            )
        else:
            self.workers = ThreadWorkers()
        self.registry = StatementRegistry(self)
        """Starts and stops the statements' runs (:mod:`service.live.registry`)."""
        self.results = Results(sessions=sessions, metrics=metrics, queries=self.queries, lock=self.lock)
        """Records their results as alerts + outbox rows (:mod:`service.live.results`)."""
        metrics.on_collect(lambda: refresh_gauges(self))

    # ------------------------------------------------------------------ event types

    def set_type(self, spec: EventType) -> None:
        """Register or replace an event type (call with the lock held when queries are live)."""
        with self.lock:
            self.types[spec.name] = spec
            if spec.ended:
                self.event_time.end(spec.name, spec.end_ts_us)

    def drop_type(self, name: str) -> None:
        """Forget event type ``name`` (deleted): its spec, and that its stream had ended."""
        with self.lock:
            self.types.pop(name, None)
            self.event_time.reopen(name)

    def end_type(self, spec: EventType) -> Ended:
        """End the stream of ``spec`` (its row records the end: ``spec.ended``; call under :attr:`control`):
        its watermark becomes the end of time (:class:`~service.live.event_time.EventTime`), the rule graph's
        statements advance (their results are recorded now) and the live-and-archived workers are offered the
        new watermark (a worker whose every type has ended answers every pending live instance:
        ``Runner.flush``). Returns what it closed.
        """
        with self.lock:
            self.set_type(spec)
            done = [
                lq for lq in self.queries.values()
                if spec.name in (types := lq.compiled.stream_types) and all(t in self.event_time.ended for t in types)
            ]
            pending: dict[str, int] = {}
            for lq in done:
                if lq.id in self.offered:  # run by a worker: its results come as its archive requests answer
                    pending[lq.name] = int(lq.stats().get("pending_instances", 0))
            found = self.advance()
            self.offer([])
            results = self.results.save(found) if found else 0
            return Ended([lq.name for lq in done], results, pending)

    def lateness(self, types: Iterable[str]) -> dict[str, int]:
        """Allowed lateness per registered event type of ``types``, int microseconds."""
        return {t: self.types[t].lateness_us for t in types if t in self.types}

    def ingested(self, types: Iterable[str]) -> bool:
        """Whether every type of ``types`` is registered and not derived (EMIT INTO): ingest refuses its late
        events (an EMIT INTO never targets an ingested type, service/statement.py)."""
        return all(t in self.types and not self.types[t].derived for t in types)

    def close(self) -> None:
        """Stop every live-and-archived worker and the archive request pool (service shut-down)."""
        with self.lock:
            for lq in list(self.queries.values()):
                lq.close()
        self.workers.close()
        self.lookups.close()
        if self.scheduler is not None:
            self.scheduler.close()

    def activation_us(self) -> int:
        """A wall-clock instant that every later ingest stamps strictly after (call under :attr:`lock`, or
        under :attr:`stamp_lock` for a deferred start)."""
        t = now_us()
        while now_us() <= t:  # at most a microsecond: later events get ingested_at > t
            pass
        return t

    def _type_lateness(self, name: str) -> int:
        spec = self.types.get(name)
        return spec.lateness_us if spec is not None else 0

    def schemas(self) -> dict[str, dict[str, str]]:
        """Event type -> attribute types, for ``compile_query(text, schemas)`` (:func:`engine.event_type.schema`)."""
        return schema(self.types.values())

    # ------------------------------------------------------------------ ingest

    def ingest(self, items: list[tuple[Any, int | None]], *, atomic: bool = False) -> IngestResult:
        """One ``POST /events`` request: see :meth:`service.live.ingest.Ingest.run`."""
        return self.ingest_path.run(items, atomic=atomic)

    def checkpoint(self) -> None:
        """Record every statement's checkpoint: see :func:`service.live.recovery.checkpoint`."""
        from service.live.recovery import checkpoint

        checkpoint(self)

    def query_watermark(self, lq: LiveQuery) -> int | None:
        """No event of ``lq``'s types with ts <= this will be accepted (None: no event yet).

        The minimum over its types of ``max_seen[T] - lateness(T)``, minus 1 us; types idle for
        ``idle_timeout_s`` (wall clock) do not hold it back; when every type is idle, the largest.
        """
        return self.event_time.watermark(lq.compiled.stream_types)

    def tick(self) -> None:
        """Advance queries by their watermarks while nothing arrives (idle streams); call every second."""
        with self.lock:
            found = self.advance()
            self.offer([])
            if found:
                self.results.save(found)

    def advance(self) -> list[Found]:
        graph = self.graph
        if not graph.nodes:
            return []
        top = self.event_time.furthest()
        if top is None:
            return []
        out = [Found(int(name), m) for name, m in graph.advance(top, self.event_time.watermark)]
        if graph.failures:
            self.ingest_path.mark_failed(graph, None, None, None)
        self.derived()
        return out

    def derived(self, items: list[tuple[str, Event]] | None = None, *, archive: bool = True) -> None:
        """Archive the derived events the graph emitted (EMIT INTO; ``items``: (statement, event) taken from it
        earlier; ``archive``: False for those the restart replay knows were archived before it) and hand them to
        live-and-archived workers."""
        items = self.graph.take_derived() if items is None else items
        if not items:
            return
        events = [e for _, e in items]
        if self.archive is not None and archive:  # the replay's: archived before, unless a crash came first
            self.archive.append(not_archived(self.archive.root, events) if self.replaying else events)
        for e in events:
            self.event_time.observe(e.type, e.ts_end)
        self.metrics.events_derived.inc(len(events))
        if self.workers_active():  # no position of their own: the last one noted, whose processing derived them
            self.offer(events, [self.order.last_noted] * len(events))

    # ------------------------------------------------------------------ live-and-archived queries

    def workers_active(self) -> bool:
        """Whether some statement runs on a worker the runtime offers events (:attr:`offered`)."""
        return bool(self.offered)

    def offer(self, events: list[Event], seqs: Sequence[int | None] | None = None) -> None:
        """Hand ``events`` (archived already) at ingest positions ``seqs`` (one per event; required when there are
        events) and the new watermark to every statement run by a live-and-archived worker, through their host
        (:attr:`workers`: :meth:`WorkerPool.offer <service.live.la_process.WorkerPool.offer>` or
        :meth:`ThreadWorkers.offer <service.live.feeds.ThreadWorkers.offer>`, then
        :meth:`Feeds.offer <service.live.feeds.Feeds.offer>` to each worker): the one path from ingest to a worker;
        one whose every type is idle (``LACE_IDLE_TIMEOUT_S``) or ended is told so once per quiet spell (SLLAA closes
        its open subwindow)."""
        positions: Sequence[int | None] = () if seqs is None else seqs
        if len(positions) != len(events):
            raise ValueError("every event offered needs its ingest position")
        upto = self.order.last_noted  # under the lock: every event up to it is being or was offered
        marks = {
            lq.id: (self.query_watermark(lq), self.event_time.idle(lq.compiled.stream_types))
            for lq in self.offered.values()
        }
        self.workers.offer(events, positions, upto, marks)

    def results_submit(self, query_id: int, matches: list[Any]) -> Future[None]:
        """Queue a worker's results for the group commit (:meth:`service.live.results.Results.submit`; bound late:
        the results are made after the pool)."""
        return self.results.submit(query_id, matches)
