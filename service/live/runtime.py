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
runtime never asks which), checkpoints and the restart replay (:mod:`service.live.recovery`).

Queries start (create, update, resume) at ``active_since_us``, an instant taken under the lock; every later
request gets a larger ``ingested_at`` stamp, which is how a restart replay feeds each query exactly the events it
saw live. Live-and-archived results are committed by their worker when they are found.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy.orm import Session, sessionmaker

from engine.compiler import CompiledQuery
from engine.detector import DEFAULT_TOLERANCE_US, Detector, RuleStatement, Statement, detector_for, make_detector
from engine.event_type import EventType
from engine.events import Event
from engine.limits import QueryLimits
from engine.live_archived.base import ArchiveWork
from engine.live_archived.plan import LiveArchivedPlan
from engine.live_archived.source import ArchiveSource
from engine.match import Match
from engine.options import Algorithm, PmPolicy
from engine.pm.store import PartialMatchStore
from engine.rules.graph import RuleGraph
from engine.rules.index import RuleIndex
from service.core.faults import crash_point
from service.core.metrics import Metrics
from service.db.session import now_us, transaction
from service.live.applying_lock import ApplyingLock
from service.live.event_time import EventTime
from service.live.gauges import refresh_gauges
from service.live.ingest import Ingest, IngestResult
from service.live.ingest_order import IngestOrder
from service.live.la_process import ChildSpec, ProcessWorker
from service.live.live_archived import ArchiveLookups, LiveArchivedWorker
from service.live.live_query import LiveQuery, RunOptions
from service.live.outbox import Found, record_alerts
from service.live.run import GraphRun, Run, WorkerRun

__all__ = ["Ended", "IngestResult", "LiveQuery", "LiveRuntime", "RunOptions"]

log = logging.getLogger(__name__)


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
        max_future_skew_us: int = 86_400_000_000,
        idle_timeout_s: float = 60.0,
        dedup_window: int = 200_000,
        limits: QueryLimits | None = None,
        replay_max_us: int = 7 * 86_400_000_000,
        la_process: bool = False,
    ) -> None:
        self.sessions = sessions
        self.la_process = la_process
        """Run each live-and-archived query in a process of its own (``LACE_LA_PROCESS``)."""
        self.metrics = metrics
        self.archive = archive
        self.source = source
        self.pm_store = pm_store
        self.defaults = defaults or RunOptions(Algorithm.sllaa, DEFAULT_TOLERANCE_US, None, PmPolicy.stpm)
        self.lookups = ArchiveLookups(lookup_workers, metrics.archive_request_seconds.observe)
        self._warming: threading.Thread | None = None
        self.lock = ApplyingLock()
        """Held by ingest for a whole request and by every change of the running statements; a change that
        needs no answer from the running state is deferred to its holder (:meth:`start_deferred`)."""
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
        self.order = IngestOrder()
        """Positions in the durable ingest order; statements' checkpoints (:mod:`service.live.ingest_order`)."""
        self.ingest_path = Ingest(
            self, max_reported=max_reported, max_future_skew_us=max_future_skew_us, dedup_window=dedup_window
        )
        self.limits = limits or QueryLimits()
        self.replay_max_us = replay_max_us
        self.on_deliveries: Callable[[], None] | None = None
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
        """True while the restart replay advances the statements (derived events are archived already)."""
        self._unsaved: list[Found] = []
        metrics.on_collect(lambda: refresh_gauges(self))

    # ------------------------------------------------------------------ registry

    def set_type(self, spec: EventType) -> None:
        """Register or replace an event type (call with the lock held when queries are live)."""
        with self.lock:
            self.types[spec.name] = spec
            if spec.ended:
                self.event_time.end(spec.name, spec.end_ts_us)

    def drop_type(self, name: str) -> None:
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
            results = self.save(found) if found else 0
            return Ended([lq.name for lq in done], results, pending)

    def start_query(
        self,
        *,
        query_id: int,
        name: str,
        compiled: Statement | RuleStatement,
        active_since_us: int,
        options: RunOptions | None = None,
        totals: dict[str, float] | None = None,
        version: int = 1,
        restored: bool = False,
        resume_seq: int | None = None,
        checkpoint_seq: int | None = None,
    ) -> LiveQuery:
        """Start (or restart, dropping its state) a query: a matcher, or a live-and-archived worker.

        Call under the lock, with ``active_since_us`` from :meth:`activation_us`. ``restored``: started again
        on a restart, from its row, with its checkpointed ``resume_seq`` and ``checkpoint_seq`` (None: none yet)
        before the replay (:func:`service.live.recovery.rebuild`); otherwise it starts with nothing seen, at the
        next position.

        Raises
        ------
        ValueError
            For a live-and-archived query when the service has no archive.
        """
        with self.lock:
            self.stop_query(query_id)
            opts = self.resolve(options or RunOptions())
            types = compiled.stream_types
            lateness = self._lateness(types)
            max_lateness = max(lateness.values(), default=0)
            common = self._pm_options(query_id, opts)
            run: Run
            if compiled.reads_archive:  # what its class declares: it runs on a worker that reads the archive
                run = WorkerRun(self._worker(query_id, name, cast(LiveArchivedPlan, compiled), opts, lateness, common))
            else:
                run = GraphRun(detector_for(compiled, storage="chain", allowed_lateness_us=lateness, **common))
            lq = LiveQuery(
                id=query_id,
                name=name,
                compiled=compiled,
                run=run,
                max_lateness_us=max_lateness,
                active_since_us=active_since_us,
                options=opts,
                base=dict(totals or {}),
                version=version,
                resume_seq=resume_seq if restored else self.order.next_seq,
                checkpoint_seq=checkpoint_seq if restored else None,
            )
            lq.attach(self)
            emit = compiled.emit_into
            if emit is not None:
                self.emitters.setdefault(emit, set()).add(query_id)
            self.queries[query_id] = lq
            for t in types:
                self.by_type.setdefault(t, []).append(lq)
            return lq

    def _worker(
        self,
        query_id: int,
        name: str,
        compiled: LiveArchivedPlan,
        opts: RunOptions,
        lateness: dict[str, int],
        common: dict[str, Any],
    ) -> LiveArchivedWorker | ProcessWorker:
        """The worker that runs a statement reading the archive: in a process of its own with ``la_process``,
        else on a thread; its archive requests go to the shared lookup pool.

        Raises ValueError when the service has no archive."""
        max_lateness = max(lateness.values(), default=0)
        if self.source is None:
            raise ValueError("live-and-archived queries need the archive (LACE_ARCHIVE_ENABLED)")
        source = self.source

        def runner(defer: Callable[[ArchiveWork], None]) -> Any:
            return make_detector(
                compiled,
                source=source,
                algorithm=opts.algorithm or Algorithm.sllaa,
                tolerance_us=opts.tolerance_us or 0,
                allowed_lateness_us=lateness,
                defer=defer,
                **common,
            )

        self.warm_source()
        if self.la_process and hasattr(source, "extract_table"):  # its own process (la_process.py)
            return ProcessWorker(
                spec=ChildSpec(
                    query_id=query_id, name=name, ast=compiled.ast,
                    schemas={t: dict(s.attributes) for t, s in self.types.items()},
                    algorithm=opts.algorithm or Algorithm.sllaa, tolerance_us=opts.tolerance_us or 0,
                    allowed_lateness_us=lateness, lateness_us=max_lateness,
                    pm_capacity=opts.pm_capacity, pm_policy=opts.pm_policy, pm_query_id=f"q{query_id}",
                    pm_store_url=getattr(self.pm_store, "url", None),
                    lookup_workers=self.lookups.pool._max_workers, log_level=logging.getLogger().level,
                ),
                plan=compiled, source=source, spark_pool=self.lookups.pool, record=self.record_results,
                observe=self.metrics.archive_request_seconds.observe,
            )
        return LiveArchivedWorker(
            query_id=query_id,
            name=name,
            plan=compiled,
            make_runner=runner,
            lookups=self.lookups,
            record=self.record_results,
            lateness_us=max_lateness,
        )

    def start_deferred(
        self,
        *,
        query_id: int,
        name: str,
        compiled: Statement | RuleStatement,
        options: RunOptions,
        version: int,
        commit: Callable[[int], None],
    ) -> int:
        """Start a new version of a rule-graph statement without waiting for the ingest request in flight
        (issue 14: an update takes effect in < 100 ms, atomically with respect to ingest batches).

        Takes the activation instant, calls ``commit(t)`` (the caller's database commit of version
        ``version`` active since ``t``) and defers the start to the holder of :attr:`lock`
        (:class:`~service.live.applying_lock.ApplyingLock`), all under :attr:`stamp_lock`: the request in
        flight, stamped before ``t``, is matched by the old version; every request stamped after ``t``,
        which includes every request sent after this returns, by the new one. That is the split a restart
        replay makes by ``ingested_at`` (:meth:`replay`). Only for statements the ingest path does not read
        while stamping: no filter, no live-and-archived query, no EMIT INTO, no derived input (the caller
        checks). Returns ``t``; a start that fails later is logged and leaves the statement stopped.
        """

        def start() -> None:
            try:
                self.start_query(
                    query_id=query_id, name=name, compiled=compiled, active_since_us=t, options=options,
                    version=version,
                )
            except ValueError:
                log.exception("query %s (%d) version %d could not start", name, query_id, version)

        with self.stamp_lock:
            t = self.activation_us()
            commit(t)
            self.lock.defer(start, now=False)
        self.lock.apply_if_free()  # free: applied now, in this thread; else by the holder before it releases
        return t

    def pattern_detector(self, query_id: int, compiled: CompiledQuery, opts: RunOptions) -> Detector:
        """A live pattern query's matcher in the service: chain storage, its types' lateness, its budget
        (``opts`` resolved, :meth:`resolve`)."""
        return make_detector(
            compiled,
            storage="chain",
            allowed_lateness_us=self._lateness(compiled.stream_types),
            **self._pm_options(query_id, opts),
        )

    def _lateness(self, types: Iterable[str]) -> dict[str, int]:
        """Allowed lateness per registered event type of ``types``, int microseconds."""
        return {t: self.types[t].lateness_us for t in types if t in self.types}

    def _pm_options(self, query_id: int, opts: RunOptions) -> dict[str, Any]:
        """A query's partial-match budget as ``make_detector`` keywords (``opts`` resolved): capacity, policy,
        and the spill store under the query's own name when there is a capacity."""
        return {
            "pm_capacity": opts.pm_capacity,
            "pm_policy": opts.pm_policy,
            "pm_store": self.pm_store if opts.pm_capacity is not None else None,
            "pm_query_id": f"q{query_id}",
        }

    def warm_source(self) -> None:
        """Start the archive source (Spark) on a background thread, once: registering a query never waits."""
        get = getattr(self.source, "get", None)
        if get is None or self._warming is not None:
            return
        self._warming = threading.Thread(target=get, name="lace-spark-start", daemon=True)
        self._warming.start()

    def resolve(self, options: RunOptions) -> RunOptions:
        """``options`` with the service defaults filled in."""
        d = self.defaults
        return RunOptions(
            algorithm=options.algorithm or d.algorithm,
            tolerance_us=d.tolerance_us if options.tolerance_us is None else options.tolerance_us,
            pm_capacity=options.pm_capacity if options.pm_capacity is not None else d.pm_capacity,
            pm_policy=options.pm_policy or d.pm_policy,
        )

    def stop_query(self, query_id: int) -> None:
        """Drop a query's detector and its partial matches (pause, delete, update)."""
        with self.lock:
            lq = self.queries.pop(query_id, None)
            if lq is None:
                return
            for t in lq.compiled.stream_types:
                rest = [q for q in self.by_type.get(t, []) if q.id != query_id]
                if rest:
                    self.by_type[t] = rest
                else:
                    self.by_type.pop(t, None)
            lq.detach(self)
            emit = lq.compiled.emit_into
            if emit is not None:
                self.emitters.get(emit, set()).discard(query_id)
                if not self.emitters.get(emit):
                    self.emitters.pop(emit, None)
            if self.pm_store is not None:
                try:
                    self.pm_store.clear(f"q{query_id}")  # its spilled partial matches
                except Exception:
                    log.exception("clearing the spilled partial matches of query %d failed", query_id)

    def close(self) -> None:
        """Stop every live-and-archived worker and the archive request pool (service shut-down)."""
        with self.lock:
            for lq in list(self.queries.values()):
                lq.close()
        self.lookups.close()

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
        """Event type -> attribute types, for ``compile_query(text, schemas)``."""
        return {n: dict(s.attributes) for n, s in self.types.items()}

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
                self.save(found)

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
        self._derived()
        return out

    def _derived(self) -> None:
        """Archive the derived events the graph emitted (EMIT INTO) and hand them to live-and-archived workers."""
        items = self.graph.take_derived()
        if not items:
            return
        events = [e for _, e in items]
        if self.archive is not None and not self.replaying:
            self.archive.append(events)
        for e in events:
            self.event_time.observe(e.type, e.ts_end)
        self.metrics.events_derived.inc(len(events))
        if self.workers_active():
            self.offer(events)

    # ------------------------------------------------------------------ live-and-archived queries

    def workers_active(self) -> bool:
        """Whether some statement runs on a worker the runtime offers events (:attr:`offered`)."""
        return bool(self.offered)

    def offer(self, events: list[Event]) -> None:
        """Hand ``events`` (archived already) and the new watermark to every statement run by a live-and-archived
        worker (:meth:`LiveQuery.offer`); one whose every type is idle (``LACE_IDLE_TIMEOUT_S``) or ended is told
        so once per quiet spell (SLLAA closes its open subwindow)."""
        for lq in self.offered.values():
            lq.offer(events, self.query_watermark(lq), idle=self.event_time.idle(lq.compiled.stream_types))

    def record_results(self, query_id: int, matches: list[Match]) -> None:
        """Commit a live-and-archived query's results: alerts + outbox in one transaction (any thread).

        Raises
        ------
        Exception
            When the database cannot take them (the worker retries). A deleted query's results
            are dropped.
        """
        if query_id not in self.queries:
            return
        lq = self.queries.get(query_id)
        found = [Found(query_id, m, lq.version if lq else None) for m in matches]
        with transaction(self.sessions) as session:
            alerts, deliveries = record_alerts(session, found, now_us=now_us())
        lq = self.queries.get(query_id)
        self.metrics.matches.labels(lq.name if lq else str(query_id)).inc(len(found))
        self.metrics.alerts.inc(alerts)
        self.metrics.alerts_duplicate.inc(len(found) - alerts)
        if (alerts or deliveries) and self.on_deliveries is not None:
            self.on_deliveries()

    def save(self, found: list[Found]) -> int:
        """Record alerts + outbox in one transaction; keep them for the next try if the database fails."""
        batch = [f for f in self._unsaved if f.query_id in self.queries] + found  # a deleted query's are dropped
        if not batch:
            return 0
        for f in batch:
            if f.version is None:
                f.version = self.queries[f.query_id].version if f.query_id in self.queries else None
        try:
            with transaction(self.sessions) as session:
                alerts, deliveries = record_alerts(session, batch, now_us=now_us())
                crash_point("ingest.before_alert_commit")
        except Exception:
            self._unsaved = batch
            self.metrics.alert_write_errors.inc()
            log.exception("recording %d alerts failed; retried with the next batch", len(batch))
            return 0
        self._unsaved = []
        self.metrics.alerts.inc(alerts)
        self.metrics.alerts_duplicate.inc(len(batch) - alerts)
        if (alerts or deliveries) and self.on_deliveries is not None:  # rowcount of INSERT..SELECT is not portable
            self.on_deliveries()
        return alerts

    @property
    def results_recorded(self) -> bool:
        """Whether every result found so far is recorded (no failed alert transaction left one in memory)."""
        return not self._unsaved

    def retry_unsaved(self) -> None:
        """Try again to record alerts a failed transaction left in memory."""
        with self.lock:
            if self._unsaved:
                self.save([])
