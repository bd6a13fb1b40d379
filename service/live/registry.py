"""The statement registry of the live runtime: starting and stopping the runs of registered statements
(docs/architecture.md sections 2-5).

A statement runs as a :class:`~service.live.live_query.LiveQuery` holding a run (:mod:`service.live.run`): a node of
the runtime's rule graph (:class:`~service.live.run.GraphRun`), or, for a statement that reads the archive (what its
class declares, ``reads_archive``), a live-and-archived worker on a thread or in a process of its own
(:class:`~service.live.run.WorkerRun`). :meth:`StatementRegistry.start_query` picks the run once; nothing else asks.
What is running is the runtime's (``queries``, ``by_type``, ``emitters``; ``offered`` for the runs it offers events):
the ingest path, event time, checkpoints and the restart replay read it there. Options are resolved against the
service defaults (:meth:`StatementRegistry.resolve`); every run has a partial-match budget (``pm_capacity``, spilling
to the runtime's ``pm_store`` under ``q<id>``).

Timestamps are int microseconds UTC.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, cast

from engine.compiler import CompiledQuery
from engine.detector import Detector, RuleStatement, Statement, detector_for, make_detector
from engine.live_archived.base import ArchiveWork
from engine.live_archived.plan import LiveArchivedPlan
from engine.options import Algorithm
from service.live.la_process import ChildSpec, PooledQuery, WorkerPool
from service.live.live_archived import LiveArchivedWorker
from service.live.live_query import LiveQuery, Run, RunHost, RunOptions
from service.live.run import GraphRun, WorkerRun

if TYPE_CHECKING:
    from engine.live_archived.source import ArchiveSource
    from engine.pm.store import PartialMatchStore
    from service.live.applying_lock import ApplyingLock
    from service.live.feeds import ThreadWorkers
    from service.live.ingest_order import IngestOrder
    from service.live.live_archived import ArchiveLookups
    from service.live.results import Results

log = logging.getLogger(__name__)


class RegistryHost(RunHost, Protocol):
    """What the statement registry needs of the runtime (:class:`~service.live.runtime.LiveRuntime` is one): what a
    run attaches to (:class:`~service.live.live_query.RunHost`), what is running (``queries``, ``by_type``,
    ``emitters``), its locks and activation instants, event types (lateness, schemas), the archive source, the pool
    of archive requests, the partial-match store, the service defaults, the ingest order and the recording of
    results."""

    @property
    def workers(self) -> WorkerPool | ThreadWorkers:
        """Where the live-and-archived queries run (``start``, ``remove``)."""

    @property
    def queries(self) -> dict[int, LiveQuery]:
        """The running statements, by id (the registry adds and removes them)."""

    @property
    def by_type(self) -> dict[str, list[LiveQuery]]:
        """Event type -> the running statements that read it."""

    @property
    def emitters(self) -> dict[str, set[int]]:
        """Derived event type -> the queries that EMIT INTO it."""

    @property
    def lock(self) -> ApplyingLock:
        """Held by every change of the running statements."""

    @property
    def stamp_lock(self) -> threading.Lock:
        """Orders activation instants and ingest stamps."""

    @property
    def order(self) -> IngestOrder:
        """The durable ingest order (a new start's position)."""

    @property
    def source(self) -> ArchiveSource | None:
        """What live-and-archived queries read."""

    @property
    def lookups(self) -> ArchiveLookups:
        """The pool of archive requests of the in-thread workers."""

    @property
    def la_requests_in_flight(self) -> int:
        """Archive requests of one query at the scheduler at once."""

    @property
    def pm_store(self) -> PartialMatchStore | None:
        """Where partial matches beyond a budget spill."""

    @property
    def defaults(self) -> RunOptions:
        """The service defaults."""

    @property
    def results(self) -> Results:
        """Records results as alerts (``record``: an in-thread worker's)."""

    def activation_us(self) -> int:
        """A wall-clock instant every later ingest stamps strictly after."""

    def lateness(self, types: Iterable[str]) -> dict[str, int]:
        """Allowed lateness per registered event type of ``types``, int us."""

    def schemas(self) -> dict[str, dict[str, str]]:
        """Event type -> attribute types."""

    def ingested(self, types: Iterable[str]) -> bool:
        """Whether every type of ``types`` is registered and posted by producers (not derived, EMIT INTO): ingest
        refuses its late events."""


class StatementRegistry:
    """Starts and stops the runs of the runtime ``rt``'s statements (``rt.registry``).

    Parameters
    ----------
    rt : RegistryHost
        What it needs of the runtime (:class:`RegistryHost`): its lock, event types (lateness, schemas), archive
        source, pool of archive requests, partial-match store, service defaults and ingest order.
    """

    def __init__(self, rt: RegistryHost) -> None:
        self.rt = rt
        self._warming: threading.Thread | None = None

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
        warmed: bool = False,
    ) -> LiveQuery:
        """Start (or restart, dropping its state) a query: a matcher, or a live-and-archived worker.

        Call under the lock, with ``active_since_us`` from :meth:`LiveRuntime.activation_us`. ``restored``: started
        again on a restart, from its row, with its checkpointed ``resume_seq`` and ``checkpoint_seq`` (None: none yet)
        and whether it was warm-started (``warmed``) before the replay (:func:`service.live.recovery.rebuild`);
        otherwise it starts with nothing seen, at the next position.

        Raises
        ------
        ValueError
            For a live-and-archived query when the service has no archive.
        """
        rt = self.rt
        with rt.lock:
            self.stop_query(query_id)
            opts = self.resolve(options or RunOptions())
            types = compiled.stream_types
            lateness = rt.lateness(types)
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
                resume_seq=resume_seq if restored else rt.order.next_seq,
                checkpoint_seq=checkpoint_seq if restored else None,
                warmed=warmed and restored,
            )
            lq.attach(rt)
            emit = compiled.emit_into
            if emit is not None:
                rt.emitters.setdefault(emit, set()).add(query_id)
            rt.queries[query_id] = lq
            for t in types:
                rt.by_type.setdefault(t, []).append(lq)
            return lq

    def _worker(
        self,
        query_id: int,
        name: str,
        compiled: LiveArchivedPlan,
        opts: RunOptions,
        lateness: dict[str, int],
        common: dict[str, Any],
    ) -> LiveArchivedWorker | PooledQuery:
        """The worker that runs a statement reading the archive: hosted by a worker process of the pool
        (:meth:`~service.live.la_process.WorkerPool.start`) with ``la_process``, else on a thread of the service
        (:class:`~service.live.feeds.ThreadWorkers`).

        Raises ValueError when the service has no archive."""
        rt = self.rt
        max_lateness = max(lateness.values(), default=0)
        if rt.source is None:
            raise ValueError("live-and-archived queries need the archive (LACE_ARCHIVE_ENABLED)")
        source = rt.source

        # an access range read stays as read (engine/live_archived/known_ranges.py): ingest refuses late events
        known_ranges = rt.ingested(compiled.archived_types)

        def runner(defer: Callable[[ArchiveWork], None]) -> Any:
            return make_detector(
                compiled,
                source=source,
                algorithm=opts.algorithm or Algorithm.sllaa,
                tolerance_us=opts.tolerance_us or 0,
                allowed_lateness_us=lateness,
                defer=defer,
                known_ranges=known_ranges,
                **common,
            )

        self.warm_source()
        types = frozenset(compiled.stream_types)
        if isinstance(rt.workers, WorkerPool):  # a worker process of the pool (la_process.py)
            spec = ChildSpec(
                query_id=query_id, name=name, ast=compiled.ast, schemas=rt.schemas(),
                algorithm=opts.algorithm or Algorithm.sllaa, tolerance_us=opts.tolerance_us or 0,
                allowed_lateness_us=lateness, lateness_us=max_lateness,
                pm_capacity=opts.pm_capacity, pm_policy=opts.pm_policy, pm_query_id=f"q{query_id}",
                pm_store_url=getattr(rt.pm_store, "url", None), requests_in_flight=rt.la_requests_in_flight,
                mergeable_in_flight=rt.lookups.pool._max_workers, log_level=logging.getLogger().level,
                known_ranges=known_ranges,
            )
            return rt.workers.start(spec, compiled)
        return rt.workers.start(query_id, types, lambda: LiveArchivedWorker(
            query_id=query_id, name=name, plan=compiled, make_runner=runner, lookups=rt.lookups,
            record=rt.results.record, lateness_us=max_lateness,
        ))

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
        ``version`` active since ``t``) and defers the start to the holder of the runtime's lock
        (:class:`~service.live.applying_lock.ApplyingLock`), all under its ``stamp_lock``: the request in
        flight, stamped before ``t``, is matched by the old version; every request stamped after ``t``,
        which includes every request sent after this returns, by the new one. That is the split a restart
        replay makes by ``ingested_at``. Only for statements the ingest path does not read while stamping
        (``read_by_ingest``: no filter, no live-and-archived query), no EMIT INTO, no derived input (the caller
        checks). Returns ``t`` (int us UTC); a start that fails later is logged and leaves the statement stopped.
        """
        rt = self.rt

        def start() -> None:
            try:
                self.start_query(
                    query_id=query_id, name=name, compiled=compiled, active_since_us=t, options=options,
                    version=version,
                )
            except ValueError:
                log.exception("query %s (%d) version %d could not start", name, query_id, version)

        with rt.stamp_lock:
            t = rt.activation_us()
            commit(t)
            rt.lock.defer(start, now=False)
        rt.lock.apply_if_free()  # free: applied now, in this thread; else by the holder before it releases
        return t

    def pattern_detector(self, query_id: int, compiled: CompiledQuery, opts: RunOptions) -> Detector:
        """A live pattern query's matcher in the service: chain storage, its types' lateness, its budget
        (``opts`` resolved, :meth:`resolve`)."""
        return make_detector(
            compiled,
            storage="chain",
            allowed_lateness_us=self.rt.lateness(compiled.stream_types),
            **self._pm_options(query_id, opts),
        )

    def _pm_options(self, query_id: int, opts: RunOptions) -> dict[str, Any]:
        """A query's partial-match budget as ``make_detector`` keywords (``opts`` resolved): capacity, policy,
        and the spill store under the query's own name when there is a capacity."""
        return {
            "pm_capacity": opts.pm_capacity,
            "pm_policy": opts.pm_policy,
            "pm_store": self.rt.pm_store if opts.pm_capacity is not None else None,
            "pm_query_id": f"q{query_id}",
        }

    def warm_source(self) -> None:
        """Start the archive source (Spark) on a background thread, once: registering a query never waits."""
        get = getattr(self.rt.source, "get", None)
        if get is None or self._warming is not None:
            return
        self._warming = threading.Thread(target=get, name="lace-spark-start", daemon=True)
        self._warming.start()

    def resolve(self, options: RunOptions) -> RunOptions:
        """``options`` with the service defaults (``rt.defaults``) filled in."""
        d = self.rt.defaults
        return RunOptions(
            algorithm=options.algorithm or d.algorithm,
            tolerance_us=d.tolerance_us if options.tolerance_us is None else options.tolerance_us,
            pm_capacity=options.pm_capacity if options.pm_capacity is not None else d.pm_capacity,
            pm_policy=options.pm_policy or d.pm_policy,
        )

    def stop_query(self, query_id: int) -> None:
        """Drop a query's detector and its partial matches (pause, delete, update)."""
        rt = self.rt
        with rt.lock:
            lq = rt.queries.pop(query_id, None)
            if lq is None:
                return
            for t in lq.compiled.stream_types:
                rest = [q for q in rt.by_type.get(t, []) if q.id != query_id]
                if rest:
                    rt.by_type[t] = rest
                else:
                    rt.by_type.pop(t, None)
            lq.detach(rt)
            emit = lq.compiled.emit_into
            if emit is not None:
                rt.emitters.get(emit, set()).discard(query_id)
                if not rt.emitters.get(emit):
                    rt.emitters.pop(emit, None)
            if rt.pm_store is not None:
                try:
                    rt.pm_store.clear(f"q{query_id}")  # its spilled partial matches
                except Exception:
                    log.exception("clearing the spilled partial matches of query %d failed", query_id)
