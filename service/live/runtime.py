"""The live engine of the service: one :class:`engine.matcher.Matcher` per active query.

Ingest (``POST /events``) runs under one lock, in this order: validate every event, make
the accepted ones durable in the archive (WAL fsync), push them to the matchers of their
type, then commit the alerts with their outbox rows in one transaction. Only then is the
request answered and the dispatcher woken.

Event time (DESIGN.md section 3): the service keeps ``max_seen``, the newest ts accepted
(any type). An event of type T is late, and rejected, when ``ts < max_seen - lateness(T)``.
That is at least as strict as every matcher's own rule, so a matcher almost never refuses
an accepted event (it still can for producer-given ids that break (ts, id) order). After
each batch, a query whose trailing-negation deadline or buffered events fall behind its
watermark ``max_seen - max lateness of its types - 1`` is advanced, which no later accepted
event can precede.

Queries start (create, update, resume) at ``active_since_us``, a wall-clock instant taken
under the lock; the archive stamps every later event with a larger ``ingested_at``, which
is how a restart replay feeds each query exactly the events it saw live.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from engine.compiler import CompiledQuery
from engine.events import Event
from engine.matcher import LateEventError, Matcher
from service.core.metrics import Metrics
from service.db.session import now_us, transaction
from service.live.events import EventInvalid, TypeSpec, validate_event
from service.live.outbox import Found, record_alerts

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LiveQuery:
    """An active query and its matcher."""

    id: int
    name: str
    compiled: CompiledQuery
    matcher: Matcher
    max_lateness_us: int
    active_since_us: int


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
    """

    def __init__(
        self, *, sessions: sessionmaker[Session], metrics: Metrics, archive: Any = None, max_reported: int = 1_000
    ) -> None:
        self.sessions = sessions
        self.metrics = metrics
        self.archive = archive
        self.max_reported = max_reported
        self.lock = threading.RLock()
        self.types: dict[str, TypeSpec] = {}
        self.queries: dict[int, LiveQuery] = {}
        self.by_type: dict[str, list[LiveQuery]] = {}
        self.max_seen: int | None = None
        self.on_deliveries: Callable[[], None] | None = None
        self._last_id = 0
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

    def start_query(self, *, query_id: int, name: str, compiled: CompiledQuery, active_since_us: int) -> LiveQuery:
        """Start (or restart, dropping its state) the matcher of a query.

        Call under the lock, with ``active_since_us`` from :meth:`activation_us`.
        """
        with self.lock:
            self.stop_query(query_id)
            lateness = {t: self.types[t].lateness_us for t in compiled.types if t in self.types}
            lq = LiveQuery(
                id=query_id,
                name=name,
                compiled=compiled,
                matcher=Matcher(compiled, storage="chain", allowed_lateness_us=lateness),
                max_lateness_us=max(lateness.values(), default=0),
                active_since_us=active_since_us,
            )
            self.queries[query_id] = lq
            for t in compiled.types:
                self.by_type.setdefault(t, []).append(lq)
            return lq

    def stop_query(self, query_id: int) -> None:
        """Drop a query's matcher and its partial matches (pause, delete, update)."""
        with self.lock:
            lq = self.queries.pop(query_id, None)
            if lq is None:
                return
            for t in lq.compiled.types:
                rest = [q for q in self.by_type.get(t, []) if q.id != query_id]
                if rest:
                    self.by_type[t] = rest
                else:
                    self.by_type.pop(t, None)

    def activation_us(self) -> int:
        """A wall-clock instant that every later ingest stamps strictly after (call under the lock)."""
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
            seen = self.max_seen
            pending_ids: list[int] = []
            for i, (raw, line) in enumerate(items):
                try:
                    spec, eid, ts, attrs = validate_event(raw, self.types)
                except EventInvalid as e:
                    self._reject(res, i, line, e.field, e.reason, "invalid")
                    continue
                if seen is not None and ts < seen - spec.lateness_us:
                    reason = (
                        f"late event: ts {ts} us is more than the allowed lateness of type {spec.name} "
                        f"({spec.lateness_us} us) behind the newest event ts {seen} us"
                    )
                    self._reject(res, i, line, "ts", reason, "late")
                    continue
                if eid is None:
                    pending_ids.append(len(accepted))
                    eid = 0
                accepted.append(Event(eid, spec.name, ts, attrs))
                index.append(i)
                if seen is None or ts > seen:
                    seen = ts
            if atomic and res.rejected:
                return res
            if not accepted:
                return res
            for k in pending_ids:
                accepted[k].id = self._next_id()
            if self.archive is not None:
                self.archive.append(accepted)
            self.max_seen = seen
            found = self._push(accepted, index, res)
            res.accepted = len(accepted)
            res.ids = [e.id for e in accepted]
            self._count_in(accepted)
            res.matches = len(found)
            res.alerts = self._save(found)
        return res

    def _reject(self, res: IngestResult, i: int, line: int | None, fld: str, reason: str, kind: str) -> None:
        res.rejected += 1
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

    def _push(self, events: Iterable[Event], index: list[int] | None, res: IngestResult | None) -> list[Found]:
        found: list[Found] = []
        by_type = self.by_type
        for k, e in enumerate(events):
            for lq in by_type.get(e.type, ()):
                try:
                    ms = lq.matcher.push(e)
                except LateEventError as err:
                    self.metrics.events_late.inc()
                    if res is not None and index is not None and len(res.query_late) < self.max_reported:
                        res.query_late.append({"index": index[k], "query": lq.name, "reason": err.reason})
                    continue
                if ms:
                    found.extend(Found(lq.id, m) for m in ms)
        if self.max_seen is not None:
            found.extend(self._advance(self.max_seen))
        per_query: dict[int, int] = {}
        for f in found:
            per_query[f.query_id] = per_query.get(f.query_id, 0) + 1
        for qid, n in per_query.items():
            live = self.queries.get(qid)
            self.metrics.matches.labels(live.name if live else str(qid)).inc(n)
        return found

    def _advance(self, seen: int) -> list[Found]:
        out: list[Found] = []
        for lq in self.queries.values():
            m = lq.matcher
            wm = seen - lq.max_lateness_us - 1
            if (m.pending and m.pending[0][0] <= wm) or (m.buffer and m.buffer[0][0] <= wm):
                out.extend(Found(lq.id, x) for x in m.advance(wm))
        return out

    def _save(self, found: list[Found]) -> int:
        """Record alerts + outbox in one transaction; keep them for the next try if the database fails."""
        batch = [f for f in self._unsaved if f.query_id in self.queries] + found  # a deleted query's are dropped
        if not batch:
            return 0
        try:
            with transaction(self.sessions) as session:
                alerts, deliveries = record_alerts(session, batch, now_us=now_us())
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
        """Feed archived ``(event, ingested_at_us)`` rows, in (ts, id) order, to the queries that saw them live.

        Alerts found again are de-duplicated by (query, event ids). Returns
        ``(events replayed, new alerts)``.
        """
        n = 0
        found: list[Found] = []
        with self.lock:
            for e, ingested_at in rows:
                n += 1
                if self.max_seen is None or e.ts > self.max_seen:
                    self.max_seen = e.ts
                self._last_id = max(self._last_id, e.id)
                for lq in self.by_type.get(e.type, ()):
                    if ingested_at <= lq.active_since_us:
                        continue
                    try:
                        ms = lq.matcher.push(e)
                    except LateEventError:
                        continue
                    found.extend(Found(lq.id, m) for m in ms)
            if self.max_seen is not None:
                found.extend(self._advance(self.max_seen))
            self.metrics.replayed.inc(n)
            return n, self._save(found)

    # ------------------------------------------------------------------ gauges

    def partial_matches(self) -> int:
        return sum(lq.matcher.counters.live for lq in list(self.queries.values()))

    def _refresh_gauges(self) -> None:
        self.metrics.partial_matches.set(self.partial_matches())
        self.metrics.live_queries.set(len(self.queries))
        if self.archive is not None:
            stats = self.archive.stats()
            self.metrics.archive_buffered.set(stats.get("buffered", 0))
            self.metrics.archive_wal_bytes.set(stats.get("wal_bytes", 0))
            oldest = self.archive.buffer.oldest_s()
            self.metrics.archive_lag.set(max(time.monotonic() - oldest, 0.0) if oldest is not None else 0.0)
