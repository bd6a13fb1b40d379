"""The live engine of the service: one detector per active query (:class:`engine.detector.Detector`).

A live-only query runs on a :class:`~engine.matcher.Matcher` in the ingest path; a live-and-archived
query on a :class:`~service.live.live_archived.LiveArchivedWorker` (its own thread, archive requests
on a bounded pool: ingest never waits for Spark). Every query runs under a partial-match budget
(``pm_capacity``, STPM or TPM spilling to the database's partial-match table; docs/architecture.md section 7.6).

Ingest (``POST /events``) runs under one lock, in this order: validate every event, make
the accepted ones durable in the archive (WAL fsync), push them to the matchers of their
type and hand them to the live-and-archived workers, then commit the live-only queries' alerts
with their outbox rows in one transaction. Only then is the request answered and the dispatcher
woken. Live-and-archived results are committed by their worker, the same way, when they are found.

Event time (docs/architecture.md section 7.3), per stream: each event type T has its newest accepted ts
``max_seen[T]`` and its watermark ``max_seen[T] - lateness(T)``; an event of T is late, and
rejected, when its ts is behind T's watermark, whatever other types do (unrelated streams need not
arrive in one global time order). An event more than ``max_future_skew`` ahead of both the wall
clock and its type's watermark is refused too (a clock error must not make every later event
late). A query's watermark is the minimum over the types it reads of their watermarks (minus 1
us), Flink-style: a type that has sent nothing for ``idle_timeout_s`` of wall time stops holding
it back, and :meth:`LiveRuntime.tick` advances queries while nothing arrives. Events of two types
that one query reads must still arrive within their lateness of each other (the query's matcher
refuses the rest, reported as ``query_late``).

Idempotent ingest: a producer id seen before (among the last ``dedup_window`` ids) with the same
content (type, ts, attributes) is acknowledged again and not taken twice; with different content it
is refused (``conflict``, HTTP 409 when nothing else was taken).

Queries start (create, update, resume) at ``active_since_us``, a wall-clock instant taken
under the lock; the archive stamps every later event with a larger ``ingested_at``, which
is how a restart replay feeds each query exactly the events it saw live.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from engine.compiler import CompiledQuery
from engine.detector import DEFAULT_TOLERANCE_US, Detector, RuleStatement, Statement, make_detector
from engine.events import Event
from engine.limits import QueryLimits
from engine.live_archived.base import ArchiveWork
from engine.live_archived.plan import LiveArchivedPlan
from engine.live_archived.source import ArchiveSource
from engine.match import Match
from engine.options import Algorithm, PmPolicy
from engine.pm.store import PartialMatchStore
from engine.rules.derived import DERIVED_ID_MIN
from engine.rules.filters import CompiledFilter
from engine.rules.graph import RuleGraph
from engine.rules.index import RuleIndex
from service.core.faults import crash_point
from service.core.metrics import Metrics
from service.db.models import QueryRow
from service.db.session import now_us, transaction
from service.live.applying_lock import ApplyingLock
from service.live.events import EventInvalid, TypeSpec, validate_event
from service.live.la_process import ChildSpec, ProcessWorker
from service.live.live_archived import ArchiveLookups, LiveArchivedWorker
from service.live.outbox import Found, record_alerts
from service.schemas.common import iso

log = logging.getLogger(__name__)


def content_digest(type_name: str, ts: int, attrs: dict[str, Any]) -> bytes:
    """16 bytes that identify an event's content (type, ts, attributes; not its id), stable across processes."""
    body = orjson.dumps([type_name, ts, attrs], option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return hashlib.blake2b(body, digest_size=16).digest()


@dataclass(slots=True)
class RunOptions:
    """How one query runs (``None``: the service default from the settings).

    ``algorithm`` and ``tolerance_us`` (SLLAA's ``T_L``, int microseconds) apply to live-and-archived
    queries; ``pm_capacity`` and ``pm_policy`` to every query.
    """

    algorithm: str | None = None
    tolerance_us: int | None = None
    pm_capacity: int | None = None
    pm_policy: str | None = None

    @classmethod
    def from_row(cls, row: QueryRow) -> RunOptions:
        """The options stored in a query's row."""
        return cls(row.algorithm, row.tolerance_us, row.pm_capacity, row.pm_policy)


CHECKPOINT_ROWS = 250
"""Statements' totals written per checkpoint transaction (:meth:`LiveRuntime.checkpoint`)."""


@dataclass(slots=True)
class LiveQuery:
    """An active query: its compiled statement and what runs it.

    ``detector`` is the live-only query's matcher (None for a live-and-archived query, which runs
    on ``worker``).
    """

    id: int
    name: str
    compiled: Statement | RuleStatement
    detector: Detector | None
    worker: LiveArchivedWorker | ProcessWorker | None
    max_lateness_us: int
    active_since_us: int
    options: RunOptions
    offered_wm: int | None = None
    cpu_s: float = 0.0
    """CPU seconds spent matching (live-only; a live-and-archived query's worker keeps its own)."""
    base: dict[str, float] = field(default_factory=dict)
    """Totals recorded before this start (kept across restarts and pauses)."""
    offset: dict[str, float] = field(default_factory=dict)
    """What the restart replay counted again: left out of the totals."""
    node: Any = None
    """Its node in the runtime's rule graph (every statement but a live-and-archived one)."""
    saved_mark: tuple[float, int, int] | None = None
    """(CPU seconds, results, events) of its graph node at the last checkpoint."""
    saved: dict[str, Any] | None = None
    """What the last checkpoint wrote to its row (not written again while unchanged)."""
    version: int = 1
    replay_cut_us: int | None = None
    """How much event time the restart replay did not go back over for this query because of
    ``LACE_REPLAY_MAX_S`` (None: not cut); partial matches that started earlier were lost."""
    warm: dict[str, int] | None = None
    """What rebuilt this start's state from the archive (``state=warm``, a plan switch; None: nothing did):
    the answer of :meth:`LiveRuntime.warm_query` or :meth:`LiveRuntime.switch_plan`, shown as ``warm``."""
    failed: str | None = None
    """Why the query stopped matching: a plug-in it names misbehaved (issue 16); it sees no more events
    until it is updated or the service restarts, and the other queries go on."""

    def counts(self) -> dict[str, float]:
        """The counters that add up across restarts, since this start."""
        s = self.stats()
        m = s.get("live_matcher", s)
        out = {
            "events": float(m.get("events", 0)),
            "late": float(m.get("late", 0)),
            "matches": float(s["results"] if self.worker is not None else m.get("emitted", 0)),
            "cpu_s": float(s.get("cpu_s", 0.0)),
        }
        if self.worker is not None:
            out["live_instances"] = float(s.get("live_instances", 0))
            out["archive_requests"] = float(s.get("archive_requests", 0))
        return out

    def totals(self) -> dict[str, float]:
        """Counters since the query was created or last updated, kept across restarts (see ``offset``)."""
        now = self.counts()
        keys = set(now) | set(self.base)
        return {k: round(self.base.get(k, 0.0) + now.get(k, 0.0) - self.offset.get(k, 0.0), 6) for k in sorted(keys)}

    def mark_replayed(self) -> None:
        """The restart replay is done: what it counted is not counted again."""
        self.offset = self.counts()

    @property
    def live_archived(self) -> bool:
        return self.worker is not None

    def stats(self) -> dict[str, Any]:
        """The detector's counters (a live-and-archived query's include the worker's)."""
        if self.worker is not None:
            return self._with_cut(self.worker.stats())
        if isinstance(self.compiled, CompiledFilter):
            f = self.compiled.stats()
            return {"events": f["kept"] + f["dropped"], "late": 0, "emitted": f["dropped"], "filter": f, "cpu_s": 0.0}
        assert self.detector is not None
        cpu = self.node.cpu_s if self.node is not None else self.cpu_s
        d = {**self.detector.stats(), "cpu_s": round(cpu, 6)}
        if self.node is not None:
            d["results"] = self.node.results
        if self.failed is not None:
            d["failed"] = self.failed
        return self._with_cut(d)

    def _with_cut(self, d: dict[str, Any]) -> dict[str, Any]:
        if self.replay_cut_us is not None:
            d["replay_cut_ms"] = self.replay_cut_us / 1_000
        return d


@dataclass(slots=True)
class IngestResult:
    """What ``POST /events`` answers.

    ``rejections``: ``{"index", "line"?, "field", "reason"}`` per refused event (at most
    ``max_reported``; ``rejected`` counts them all). ``query_late``: events accepted and
    archived that one query's matcher refused (producer ids out of order at equal ts).
    """

    accepted: int = 0
    rejected: int = 0
    ids: list[int] = field(default_factory=list)
    rejections: list[dict[str, Any]] = field(default_factory=list)
    query_late: list[dict[str, Any]] = field(default_factory=list)
    query_errors: list[dict[str, Any]] = field(default_factory=list)
    """``{"index", "query", "reason"}``: a query a plug-in failed on this event (the query is marked failed)."""
    duplicates: list[int] = field(default_factory=list)
    conflicts: int = 0
    matches: int = 0
    alerts: int = 0


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
        self.max_reported = max_reported
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
        self.types: dict[str, TypeSpec] = {}
        self.queries: dict[int, LiveQuery] = {}
        self.by_type: dict[str, list[LiveQuery]] = {}
        self.type_max: dict[str, int] = {}
        """Per event type: the newest ts accepted, int us."""
        self.type_wall: dict[str, float] = {}
        """Per event type: when (monotonic seconds) it last sent an event."""
        self.max_future_skew_us = max_future_skew_us
        self.idle_timeout_s = idle_timeout_s
        self.dedup_window = dedup_window
        self.limits = limits or QueryLimits()
        self.replay_max_us = replay_max_us
        self.recent_ids: OrderedDict[int, bytes] = OrderedDict()
        """The last ``dedup_window`` producer ids -> digest of the event's content."""
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
        self._last_id = 0
        self._replaying = False
        self._unsaved: list[Found] = []
        metrics.on_collect(self._refresh_gauges)

    # ------------------------------------------------------------------ registry

    def set_type(self, spec: TypeSpec) -> None:
        """Register or replace an event type (call with the lock held when queries are live)."""
        with self.lock:
            self.types[spec.name] = spec

    def drop_type(self, name: str) -> None:
        with self.lock:
            self.types.pop(name, None)

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
    ) -> LiveQuery:
        """Start (or restart, dropping its state) a query: a matcher, or a live-and-archived worker.

        Call under the lock, with ``active_since_us`` from :meth:`activation_us`.

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
            detector: Detector | None = None
            worker: LiveArchivedWorker | ProcessWorker | None = None
            if isinstance(compiled, LiveArchivedPlan):
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
                    worker = ProcessWorker(
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
                else:
                    worker = LiveArchivedWorker(
                        query_id=query_id,
                        name=name,
                        plan=compiled,
                        make_runner=runner,
                        lookups=self.lookups,
                        record=self.record_results,
                        lateness_us=max_lateness,
                    )
            elif isinstance(compiled, CompiledQuery):
                detector = self._pattern_detector(query_id, compiled, opts)
            elif not isinstance(compiled, CompiledFilter):
                detector = compiled.make_detector(lateness)
            lq = LiveQuery(
                id=query_id,
                name=name,
                compiled=compiled,
                detector=detector,
                worker=worker,
                max_lateness_us=max_lateness,
                active_since_us=active_since_us,
                options=opts,
                base=dict(totals or {}),
                version=version,
            )
            if worker is None:
                self.graph.add(str(query_id), compiled, detector, version=version)  # derived ids: (id, version)
                lq.node = self.graph.nodes.get(str(query_id))
            emit = compiled.emit_into
            if emit is not None:
                self.emitters.setdefault(emit, set()).add(query_id)
            self.queries[query_id] = lq
            for t in types:
                self.by_type.setdefault(t, []).append(lq)
            return lq

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

    def warm_query(self, query_id: int, *, emit_history: bool = False) -> dict[str, int]:
        """Rebuild a just-started statement's state from the archive over its span (``state=warm``, issue 14).

        Reads the statement's types from the archive (Delta and the recent buffer) from ``newest ts - span
        - lateness`` (span: WITHIN or the window size; ``replay_max_us`` without one), feeds them to its
        detector alone and advances it to the current watermark, so it behaves as if it had always run.
        What that history completes is dropped, or recorded as alerts with ``emit_history`` (an EMIT INTO
        statement's history is never re-emitted: its readers saw it live). Call under the lock, right
        after :meth:`start_query`.

        Returns
        -------
        dict
            ``{"events": history events fed, "results": results they completed, "alerts": recorded}``.

        Raises
        ------
        ValueError
            For a live-and-archived query (it reads the archive itself) or without an archive.
        """
        lq = self.queries[query_id]
        if lq.node is None:
            raise ValueError("state=warm applies to statements of the rule graph, not to live-and-archived queries")
        history, wm = self._window_history(lq)
        results = self.graph.warm(str(query_id), history, wm)
        alerts = 0
        if emit_history and results and lq.compiled.emit_into is None:
            alerts = self._save([Found(query_id, m, lq.version) for m in results])
        lq.warm = {"events": len(history), "results": len(results), "alerts": alerts}
        return lq.warm

    def switch_plan(self, query_id: int, compiled: CompiledQuery) -> dict[str, int]:
        """Switch a running pattern query to another plan of its text (``POST /queries/{id}/plan``, 004):
        a new detector of ``compiled`` takes its place in the rule graph, rebuilt from the current window's
        events (archive and recent buffer, as ``state=warm`` reads them), so nothing is lost and nothing is
        reported twice (:meth:`engine.rules.graph.RuleGraph.replace`). Counters go on; its spilled partial
        matches are dropped with the old detector. Call under the lock.

        Returns ``{"events": window events fed, "results": results they completed (dropped: reported)}``.

        Raises
        ------
        ValueError
            For a query that is not a running pattern query of the rule graph, a failed one, or without the
            archive.
        """
        lq = self.queries.get(query_id)
        if lq is None or lq.node is None or not isinstance(lq.compiled, CompiledQuery):
            raise ValueError("a plan switch applies to running pattern queries (PATTERN ...)")
        if lq.failed is not None:
            raise ValueError(f"the query failed ({lq.failed}); resume it first")
        history, wm = self._window_history(lq)
        totals = lq.totals()
        if self.pm_store is not None and lq.options.pm_capacity is not None:
            self.pm_store.clear(f"q{query_id}")  # the old detector's spilled partial matches
        detector = self._pattern_detector(query_id, compiled, lq.options)
        dropped = self.graph.replace(str(query_id), compiled, detector, history, wm)
        lq.compiled, lq.detector = compiled, detector
        lq.base = totals
        lq.offset = lq.counts()  # the window's events are counted once, before the switch
        lq.saved_mark = None
        lq.warm = {"events": len(history), "results": dropped}
        return lq.warm

    def _window_history(self, lq: LiveQuery) -> tuple[list[Event], int | None]:
        """The events of ``lq``'s types from ``newest ts - span - lateness`` on (span: WITHIN plus what its
        operators remember, ``CompiledQuery.state_span_us``, or the window size; ``replay_max_us`` without one),
        from the archive and the recent buffer, in the matcher's (ts_end, id) order (an interval event counts by
        its end), and the query's watermark: what rebuilds its state (``state=warm``, a plan switch).

        Raises ValueError without the archive."""
        if self.archive is None:
            raise ValueError("rebuilding a query's state reads the archive (LACE_ARCHIVE_ENABLED=true)")
        types = lq.compiled.stream_types
        tops = [self.type_max[t] for t in types if t in self.type_max]
        wm = self._types_watermark(frozenset(t for t in types if t not in self.emitters))
        if not tops:
            return [], wm
        span = getattr(lq.compiled, "state_span_us", getattr(lq.compiled, "window_us", None)) or self.replay_max_us
        since = max(tops) - min(span + lq.max_lateness_us, self.replay_max_us)
        from service.live.replay import read_tail

        seen: dict[int, Event] = {}
        for t in sorted(types):
            spec = self.types.get(t)
            if spec is None:
                continue
            for _, e, _ in read_tail(self.archive.root, spec, since):
                seen[e.id] = e
        for e in self.archive.buffer.events([t for t in types if t in self.types]):
            if e.ts_end >= since:
                seen.setdefault(e.id, e)
        return sorted(seen.values(), key=Event.order_key), wm

    def _pattern_detector(self, query_id: int, compiled: CompiledQuery, opts: RunOptions) -> Detector:
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
            if lq.worker is not None:
                lq.worker.stop()
            else:
                self.graph.remove(str(query_id))
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
                if lq.worker is not None:
                    lq.worker.stop()
        self.lookups.close()

    def activation_us(self) -> int:
        """A wall-clock instant that every later ingest stamps strictly after (call under :attr:`lock`, or
        under :attr:`stamp_lock` for a deferred start)."""
        t = now_us()
        while now_us() <= t:  # at most a microsecond: later events get ingested_at > t
            pass
        return t

    def schemas(self) -> dict[str, dict[str, str]]:
        """Event type -> attribute types, for ``compile_query(text, schemas)``."""
        return {n: dict(s.attributes) for n, s in self.types.items()}

    # ------------------------------------------------------------------ ingest

    def _next_id(self) -> int:
        nid = max(self._last_id + 1, now_us())  # strictly increasing, and increasing across restarts
        self._last_id = nid
        return nid

    def ingest(self, items: list[tuple[Any, int | None]], *, atomic: bool = False) -> IngestResult:
        """Validate, archive, match and record alerts for one request's events.

        Parameters
        ----------
        items : list of (raw event, NDJSON line or None)
        atomic : bool
            Refuse every event when any is invalid or late.

        Raises
        ------
        Exception
            Whatever the archive raises when it cannot make the events durable (nothing
            was taken then).
        """
        res = IngestResult()
        with self.lock:
            accepted: list[Event] = []
            index: list[int] = []
            seen = dict(self.type_max)
            staged: dict[int, bytes] = {}
            pending_ids: list[int] = []
            now = now_us()
            for i, (raw, line) in enumerate(items):
                try:
                    spec, eid, start, attrs, ts = validate_event(raw, self.types)  # ts: the watermark's time
                except EventInvalid as e:
                    self._reject(res, i, line, e.field, e.reason, "invalid")
                    continue
                if spec.derived or spec.name in self.emitters:  # before the time checks: not "late" but this
                    self._reject(res, i, line, "type", self._derived_reason(spec.name), "invalid")
                    continue
                digest = b""
                if eid is not None:  # before the time checks: a retry of an acknowledged event is late by nature
                    digest = content_digest(spec.name, start, attrs if ts == start else {**attrs, "ts_end": ts})
                    known = staged.get(eid) or self.recent_ids.get(eid)
                    if known is not None:
                        if known == digest:
                            res.duplicates.append(eid)  # a retry: acknowledged, not taken twice
                            continue
                        reason = f"id {eid} was already ingested with different content (type, ts or attributes)"
                        self._reject(res, i, line, "id", reason, "conflict")
                        continue
                top = seen.get(spec.name)
                watermark = None if top is None else top - spec.lateness_us
                if top is not None and watermark is not None and ts < watermark:
                    reason = (
                        f"late event: ts {iso(ts)} is more than the allowed lateness of type {spec.name} "
                        f"({spec.lateness_us // 1000} ms) behind its newest event, ts {iso(top)}"
                    )
                    self._reject(res, i, line, "ts", reason, "late")
                    continue
                limit = max(now, watermark if watermark is not None else now) + self.max_future_skew_us
                if ts > limit:
                    ahead = "the wall clock" if watermark is None or watermark <= now else f"{spec.name}'s watermark"
                    reason = (
                        f"ts {iso(ts)} is more than the allowed future skew of "
                        f"{self.max_future_skew_us // 1_000_000} s ahead of {ahead} (LACE_MAX_FUTURE_SKEW_S)"
                    )
                    self._reject(res, i, line, "ts", reason, "future")
                    continue
                event = Event(eid or 0, spec.name, start, attrs, ts)  # ts: ts_end (= start for a point type)
                if self.graph.filters:
                    dropped = self.graph.filter(event)
                    if dropped is not None:
                        self._reject(res, i, line, "", dropped, "filtered")
                        continue
                if eid is None:
                    pending_ids.append(len(accepted))
                else:
                    staged[eid] = digest
                accepted.append(event)
                index.append(i)
                if top is None or ts > top:
                    seen[spec.name] = ts
            if atomic and res.rejected:
                return res
            if not accepted:
                return res
            for k in pending_ids:
                accepted[k].id = self._next_id()
            with self.stamp_lock:
                self.lock.drain()  # changes deferred before this stamp match these events
                stamp = now_us()
            if self.archive is not None:
                self.archive.append(accepted, ingested_at_us=stamp)
            crash_point("ingest.after_wal")
            self.type_max = seen
            wall = time.monotonic()
            for t in {e.type for e in accepted}:
                self.type_wall[t] = wall
            self._remember(staged)
            found = self._push(accepted, index, res)
            res.accepted = len(accepted)
            res.ids = [e.id for e in accepted]
            self._count_in(accepted)
            res.matches = len(found)
            res.alerts = self._save(found)
        return res

    def _derived_reason(self, name: str) -> str:
        """Why an event of the derived type ``name`` is refused from a producer (issue 24)."""
        who = ", ".join(sorted(self.queries[q].name for q in self.emitters.get(name, ())))
        made = f"EMIT INTO of {who}" if who else "made by EMIT INTO; no running statement emits it now"
        return f"'{name}' is a derived event type ({made}); it cannot be ingested"

    def _remember(self, ids: dict[int, bytes]) -> None:
        recent = self.recent_ids
        recent.update(ids)
        while len(recent) > self.dedup_window:
            recent.popitem(last=False)

    def query_watermark(self, lq: LiveQuery) -> int | None:
        """No event of ``lq``'s types with ts <= this will be accepted (None: no event yet).

        The minimum over its types of ``max_seen[T] - lateness(T)``, minus 1 us; types idle for
        ``idle_timeout_s`` (wall clock) do not hold it back; when every type is idle, the largest.
        """
        return self._types_watermark(lq.compiled.stream_types)

    def tick(self) -> None:
        """Advance queries by their watermarks while nothing arrives (idle streams); call every second."""
        with self.lock:
            found = self._advance()
            self._offer([])
            if found:
                self._save(found)

    def _reject(self, res: IngestResult, i: int, line: int | None, fld: str, reason: str, kind: str) -> None:
        res.rejected += 1
        if kind == "conflict":
            res.conflicts += 1
        if kind == "late":
            self.metrics.events_late.inc()
        self.metrics.events_rejected.labels(kind).inc()
        if len(res.rejections) < self.max_reported:
            where = f"events[{i}]" + (f".{fld}" if fld else "")
            item: dict[str, Any] = {"index": i, "field": where, "reason": reason}
            if line is not None:
                item["line"] = line
            res.rejections.append(item)

    def _count_in(self, events: list[Event]) -> None:
        per: dict[str, int] = {}
        for e in events:
            per[e.type] = per.get(e.type, 0) + 1
        for t, n in per.items():
            self.metrics.events_in.labels(t).inc(n)

    def _push(self, events: list[Event], index: list[int] | None, res: IngestResult | None) -> list[Found]:
        found: list[Found] = []
        if self.workers_active():
            self._offer(events)
        graph = self.graph
        if graph.nodes:
            found.extend(Found(int(name), m) for name, m in graph.push_batch(events))
            if graph.late_events:
                self._query_late(graph, events, index, res)
            if graph.failures:
                self._failed(graph, events, index, res)
        found.extend(self._advance())
        per_query: dict[int, int] = {}
        for f in found:
            per_query[f.query_id] = per_query.get(f.query_id, 0) + 1
        for qid, n in per_query.items():
            live = self.queries.get(qid)
            self.metrics.matches.labels(live.name if live else str(qid)).inc(n)
        return found

    def _query_late(
        self, graph: RuleGraph, events: list[Event], index: list[int] | None, res: IngestResult | None
    ) -> None:
        where = {id(e): k for k, e in enumerate(events)}
        for name, event, reason in graph.late_events:
            self.metrics.events_late.inc()
            k = where.get(id(event))
            if res is not None and index is not None and k is not None and len(res.query_late) < self.max_reported:
                lq = self.queries.get(int(name))
                res.query_late.append({"index": index[k], "query": lq.name if lq else name, "reason": reason})
        graph.take_late()

    def _failed(
        self, graph: RuleGraph, events: list[Event] | None, index: list[int] | None, res: IngestResult | None
    ) -> None:
        """Mark the queries that failed (a plug-in misbehaved, issue 16; a query overran its matching time, issue
        13): they stop matching, the ingest and the others go on."""
        where = {id(e): k for k, e in enumerate(events or ())}
        for name, event, reason in graph.take_failures():
            lq = self.queries.get(int(name))
            if lq is not None and lq.failed is None:
                lq.failed = reason
                log.error("query %s failed and stops matching: %s", lq.name, reason)
            k = where.get(id(event)) if event is not None else None
            if res is not None and index is not None and k is not None and len(res.query_errors) < self.max_reported:
                res.query_errors.append({"index": index[k], "query": lq.name if lq else name, "reason": reason})

    def _types_watermark(self, types: frozenset[str]) -> int | None:
        """No event of ``types`` with ts <= this will be accepted (None: none yet); see :meth:`query_watermark`."""
        active: list[int] = []
        idle: list[int] = []
        now = time.monotonic()
        for t in types:
            top = self.type_max.get(t)
            if top is None:
                continue
            spec = self.types.get(t)
            wm = top - (spec.lateness_us if spec is not None else 0)
            (idle if now - self.type_wall.get(t, 0.0) > self.idle_timeout_s else active).append(wm)
        if active:
            return min(active) - 1
        return max(idle) - 1 if idle else None

    def _advance(self) -> list[Found]:
        graph = self.graph
        if not graph.nodes:
            return []
        tops = [wm for t in self.type_max if (wm := self._types_watermark(frozenset({t}))) is not None]
        if not tops:
            return []
        out = [Found(int(name), m) for name, m in graph.advance(max(tops), self._types_watermark)]
        if graph.failures:
            self._failed(graph, None, None, None)
        self._derived()
        return out

    def _derived(self) -> None:
        """Archive the derived events the graph emitted (EMIT INTO) and hand them to live-and-archived workers."""
        items = self.graph.take_derived()
        if not items:
            return
        events = [e for _, e in items]
        if self.archive is not None and not self._replaying:
            self.archive.append(events)
        for e in events:
            top = self.type_max.get(e.type)
            if top is None or e.ts > top:
                self.type_max[e.type] = e.ts
            self.type_wall[e.type] = time.monotonic()
        self.metrics.events_derived.inc(len(events))
        if self.workers_active():
            self._offer(events)

    # ------------------------------------------------------------------ live-and-archived queries

    def workers_active(self) -> bool:
        return any(lq.worker is not None for lq in self.queries.values())

    def _offer(self, events: list[Event]) -> None:
        """Hand ``events`` (archived already) and the new watermark to every live-and-archived worker."""
        for lq in self.queries.values():
            w = lq.worker
            if w is None:
                continue
            types = lq.compiled.stream_types
            mine = [e for e in events if e.type in types]
            wm = self.query_watermark(lq)
            if mine or (wm is not None and (lq.offered_wm is None or wm > lq.offered_wm)):
                lq.offered_wm = wm
                w.offer(mine, wm)

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

    def checkpoint(self) -> None:
        """Record each query's totals (``counters``) and each live-and-archived query's ``resume_from_us``
        (where a restart replay must start)."""
        queries = list(self.queries.values())
        if not queries:
            return
        rows: list[tuple[int, dict[str, Any]]] = []
        for lq in queries:
            node = lq.node
            if node is not None:
                mark = (node.cpu_s, node.results, len(node.inbox))  # CPU time moves whenever an event reaches it
                if mark == lq.saved_mark:
                    continue  # nothing reached it since the last checkpoint: its totals are as written
                lq.saved_mark = mark
            values: dict[str, Any] = {"counters": lq.totals()}
            if lq.worker is not None:
                resume = lq.worker.resume_from_us()
                if resume is not None:
                    values["resume_from_us"] = resume
            if values == lq.saved:
                continue  # unchanged since the last checkpoint (with thousands of statements, most are)
            rows.append((lq.id, values))
        if not rows:
            return
        # bulk UPDATEs by primary key, in transactions of CHECKPOINT_ROWS: with thousands of statements one
        # transaction of one UPDATE each held SQLite's write gate for up to 0.28 s, and alerts and
        # statement updates waited behind it; each row is a statement's own totals, consistent by itself
        groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for qid, values in rows:
            groups.setdefault(tuple(sorted(values)), []).append({"id": qid, **values})
        for group in groups.values():
            for i in range(0, len(group), CHECKPOINT_ROWS):
                with transaction(self.sessions) as session:
                    session.execute(update(QueryRow), group[i : i + CHECKPOINT_ROWS])
                    crash_point("checkpoint.mid_transaction")
        for qid, values in rows:
            lq_saved = self.queries.get(qid)
            if lq_saved is not None:
                lq_saved.saved = values

    def _save(self, found: list[Found]) -> int:
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

    def retry_unsaved(self) -> None:
        """Try again to record alerts a failed transaction left in memory."""
        with self.lock:
            if self._unsaved:
                self._save([])

    # ------------------------------------------------------------------ restart replay

    def replay(self, rows: Iterable[tuple[Event, int]]) -> tuple[int, int]:
        """Feed archived ``(event, ingested_at_us)`` rows, in (ts_end, id) order, to the queries that saw them live.

        Alerts found again are de-duplicated by (query, event ids). Returns
        ``(events replayed, new alerts)``.
        """
        n = 0
        found: list[Found] = []
        handed: dict[int, list[Event]] = {}  # live-and-archived queries' events, handed over in one batch each
        with self.lock:
            wall = time.monotonic()
            for e, ingested_at in rows:
                n += 1
                top = self.type_max.get(e.type)
                if top is None or e.ts_end > top:
                    self.type_max[e.type] = e.ts_end
                self.type_wall[e.type] = wall
                attrs = e.attrs if e.ts_end == e.ts else {**e.attrs, "ts_end": e.ts_end}
                if e.id < DERIVED_ID_MIN:  # an ingested event (derived ids are hashes from 2^62 on)
                    self.recent_ids[e.id] = content_digest(e.type, e.ts, attrs)
                    self._last_id = max(self._last_id, e.id)
                if e.type in self.emitters:
                    continue  # a derived event: the statements derive it again from what they replay
                graph_wanted = False
                for lq in self.by_type.get(e.type, ()):
                    if ingested_at <= lq.active_since_us:
                        continue
                    if lq.worker is not None:
                        handed.setdefault(lq.id, []).append(e)
                    else:
                        graph_wanted = True
                if graph_wanted:
                    if self.graph.filter(e) is not None:
                        continue

                    def saw(name: str, at: int = ingested_at) -> bool:
                        q = self.queries.get(int(name))
                        return q is not None and at > q.active_since_us

                    found.extend(Found(int(name), m) for name, m in self.graph.push(e, saw))
                    self.graph.take_late()
                    if self.graph.failures:
                        self._failed(self.graph, None, None, None)
            self._remember({})
            for qid, events in handed.items():
                worker = self.queries[qid].worker
                assert worker is not None
                worker.offer(events, None)
            self._replaying = True
            try:
                found.extend(self._advance())
            finally:
                self._replaying = False
            self._offer([])
            for lq in self.queries.values():  # what the replay counts again was counted before the restart
                if lq.worker is None:
                    lq.mark_replayed()
                else:
                    lq.worker.call(lq.mark_replayed)  # once its worker has matched the replayed events
            self.metrics.replayed.inc(n)
            return n, self._save(found)

    # ------------------------------------------------------------------ gauges

    def _refresh_gauges(self) -> None:
        m = self.metrics
        total = spilled = 0
        for lq in list(self.queries.values()):
            s = lq.stats()
            pm = s.get("live_matcher", s)
            total += pm.get("live_partial_matches", 0)
            spilled += pm.get("spilled_now", 0)
            m.query_partial_matches.labels(lq.name, "memory").set(pm.get("live_partial_matches", 0))
            m.query_partial_matches.labels(lq.name, "spilled").set(pm.get("spilled_now", 0))
            for kind in ("spilled", "reloaded", "misses"):
                m.query_pm_events.labels(lq.name, kind).set(pm.get(kind, 0))
            if lq.worker is not None:
                m.query_archive_requests.labels(lq.name).set(s.get("archive_requests", 0))
                m.query_pending_instances.labels(lq.name).set(
                    s.get("pending_instances", 0) + s.get("in_flight_instances", 0)
                )
        m.partial_matches.set(total)
        m.partial_matches_spilled.set(spilled)
        self.metrics.live_queries.set(len(self.queries))
        if self.archive is not None:
            stats = self.archive.stats()
            self.metrics.archive_buffered.set(stats.get("buffered", 0))
            self.metrics.archive_wal_bytes.set(stats.get("wal_bytes", 0))
            oldest = self.archive.buffer.oldest_s()
            self.metrics.archive_lag.set(max(time.monotonic() - oldest, 0.0) if oldest is not None else 0.0)
