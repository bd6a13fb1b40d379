"""The ingest path of the live service: ``POST /events`` from validation to the answer (docs/architecture.md
section 2).

One request runs under the runtime's lock, in this order: validate every event (its type's attributes,
repeated producer ids, derived types refused, ended types refused (``POST /event-types/{name}/end``),
lateness against its type's watermark, future skew), drop
what the FILTER rules drop, give the accepted events their positions in the durable ingest order
(:mod:`service.live.ingest_order`) and make them durable in the archive (WAL fsync), push them to the
statements that read their types, then commit the alerts with their outbox rows in one transaction. Only
then is the request answered.

Idempotent ingest: a producer id seen before (among the last ``dedup_window`` ids) with the same content
(type, ts, attributes) is acknowledged again and not taken twice; with different content it is refused
(``conflict``, HTTP 409 when nothing else was taken).
"""
from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from engine.events import Event
from engine.rules.graph import RuleGraph
from service.core.faults import crash_point
from service.db.session import now_us
from service.live.events import EventInvalid, validate_event
from service.live.host import StreamState
from service.live.outbox import Found
from service.schemas.common import iso

if TYPE_CHECKING:
    from service.core.metrics import Metrics
    from service.live.applying_lock import ApplyingLock
    from service.live.feeds import ThreadWorkers
    from service.live.la_process import WorkerPool
    from service.live.live_query import LiveQuery

log = logging.getLogger(__name__)


def content_digest(type_name: str, ts: int, attrs: dict[str, Any], ts_end: int | None = None) -> bytes:
    """16 bytes that identify an event's content (type, ts, attributes, an interval event's ``ts_end`` when it
    differs from ``ts``; not its id), stable across processes: the ingest's and the restart's
    (:func:`service.live.recovery.recent_ids`) are this one function."""
    if ts_end is not None and ts_end != ts:
        attrs = {**attrs, "ts_end": ts_end}
    body = orjson.dumps([type_name, ts, attrs], option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return hashlib.blake2b(body, digest_size=16).digest()


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
    held: list[dict[str, Any]] = field(default_factory=list)
    """``{"query", "events", "matches", "earliest", "latest", "watermark"}``: the queries reading the request's
    types that hold something back until their watermark passes (:meth:`LiveQuery.held`)."""


class IngestHost(StreamState, Protocol):
    """What the ingest path needs of the runtime (:class:`~service.live.runtime.LiveRuntime` is one): its locks, the
    event types and who emits the derived ones, event time, the ingest order, the archive, the rule graph, the
    running statements and their watermarks, the live-and-archived workers (``offer``, their room), the watermark
    advance, the recording of results and the metrics."""

    @property
    def lock(self) -> ApplyingLock:
        """Held for a whole request."""

    @property
    def stamp_lock(self) -> threading.Lock:
        """Orders the request's stamp with the deferred changes of statements."""

    @property
    def workers(self) -> WorkerPool | ThreadWorkers:
        """The host of the live-and-archived workers (``check_room``)."""

    @property
    def metrics(self) -> Metrics:
        """The service's counters."""

    def query_watermark(self, lq: LiveQuery) -> int | None:
        """``lq``'s watermark."""

    def workers_active(self) -> bool:
        """Whether some statement runs on a live-and-archived worker."""

    def offer(self, events: list[Event], seqs: Sequence[int | None] | None = None) -> None:
        """Hand ``events`` at ingest positions ``seqs`` to the live-and-archived workers."""

    def advance(self) -> list[Found]:
        """Advance the rule graph's statements by their watermarks; their results."""


class Ingest:
    """The runtime's ingest path and what only it keeps: the recent producer ids and the id counter.

    Parameters
    ----------
    runtime : IngestHost
        What it needs of the runtime (:class:`IngestHost`).
    max_reported : int
        Rejections listed one by one in a response.
    max_future_skew_us : int
        How far ahead of the wall clock and of its type's watermark an event may be, int microseconds.
    dedup_window : int
        Producer ids remembered for idempotent retries.
    """

    def __init__(self, runtime: IngestHost, *, max_reported: int, max_future_skew_us: int, dedup_window: int) -> None:
        self.rt = runtime
        self.max_reported = max_reported
        self.max_future_skew_us = max_future_skew_us
        self.dedup_window = dedup_window
        self.recent_ids: OrderedDict[int, bytes] = OrderedDict()
        """The last ``dedup_window`` producer ids -> digest of the event's content."""
        self.last_id = 0

    def next_id(self) -> int:
        """An id for an event its producer gave none: strictly increasing, and increasing across restarts."""
        nid = max(self.last_id + 1, now_us())
        self.last_id = nid
        return nid

    def restore(self, ids: dict[int, bytes]) -> None:
        """Start from ``ids`` (the last ``dedup_window`` producer ids -> content digests, in ingest order; the
        restart reads them from the archive, :func:`service.live.recovery.recent_ids`): a request posted again
        after a crash is acknowledged as a duplicate; the id counter continues after the largest."""
        self.recent_ids = OrderedDict()
        self.remember(ids)
        self.last_id = max(self.last_id, max(ids, default=0))

    def remember(self, ids: dict[int, bytes]) -> None:
        """Add producer ids -> content digests to the recent ids (the oldest go beyond ``dedup_window``)."""
        recent = self.recent_ids
        recent.update(ids)
        while len(recent) > self.dedup_window:
            recent.popitem(last=False)

    def run(self, items: list[tuple[Any, int | None]], *, atomic: bool = False) -> IngestResult:
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
        rt = self.rt
        res = IngestResult()
        with rt.lock:
            accepted: list[Event] = []
            index: list[int] = []
            seen = dict(rt.event_time.newest)
            staged: dict[int, bytes] = {}
            pending_ids: list[int] = []
            now = now_us()
            for i, (raw, line) in enumerate(items):
                try:
                    spec, eid, start, attrs, ts = validate_event(raw, rt.types)  # ts: the watermark's time
                except EventInvalid as e:
                    self._reject(res, i, line, e.field, e.reason, "invalid")
                    continue
                if spec.derived or spec.name in rt.emitters:  # before the time checks: not "late" but this
                    self._reject(res, i, line, "type", self._derived_reason(spec.name), "invalid")
                    continue
                digest = b""
                if eid is not None:  # before the time checks: a retry of an acknowledged event is late by nature
                    digest = content_digest(spec.name, start, attrs, ts)
                    known = staged.get(eid) or self.recent_ids.get(eid)
                    if known is not None:
                        if known == digest:
                            res.duplicates.append(eid)  # a retry: acknowledged, not taken twice
                            continue
                        reason = f"id {eid} was already ingested with different content (type, ts or attributes)"
                        self._reject(res, i, line, "id", reason, "conflict")
                        continue
                if spec.ended:  # Flink's end of input: nothing of it comes after the end
                    end = "no event" if spec.end_ts_us is None else f"its newest event at ts {iso(spec.end_ts_us)}"
                    reason = (
                        f"late event: the stream of type {spec.name} ended (POST /event-types/{spec.name}/end) after "
                        f"{end}; an ended type takes no more events"
                    )
                    self._reject(res, i, line, "type", reason, "late")
                    continue
                top = seen.get(spec.name)
                watermark = rt.event_time.watermark_of(spec.name, seen)
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
                if rt.graph.filters:
                    dropped = rt.graph.filter(event)
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
            rt.workers.check_room()  # raises WorkersBusy (503): nothing is taken
            for k in pending_ids:
                accepted[k].id = self.next_id()
            with rt.stamp_lock:
                rt.lock.drain()  # changes deferred before this stamp match these events
                stamp = rt.order.stamp(now_us())
            seqs = rt.order.take(accepted)
            if rt.archive is not None:
                rt.archive.append(accepted, ingested_at_us=stamp, ingest_seqs=seqs)
            crash_point("ingest.after_wal")
            rt.event_time.take(seen, {e.type for e in accepted})
            self.remember(staged)
            found = self.push(accepted, index, res, seqs)
            res.accepted = len(accepted)
            res.ids = [e.id for e in accepted]
            self._count_in(accepted)
            res.matches = len(found)
            res.alerts = rt.results.save(found)
            res.held = self.held({e.type for e in accepted})
        return res

    def held(self, types: set[str]) -> list[dict[str, Any]]:
        """What the queries reading ``types`` hold back until their watermark passes (those holding something)."""
        rt = self.rt
        out = []
        for lq in rt.queries.values():
            if types.isdisjoint(lq.compiled.stream_types):
                continue
            h = lq.held(rt.query_watermark(lq))
            if h is not None and (h["events"] or h["matches"]):
                out.append({"query": lq.name, **h})
        return out

    def push(
        self, events: list[Event], index: list[int] | None, res: IngestResult | None, seqs: list[int]
    ) -> list[Found]:
        """Match accepted ``events`` (archived already, at ingest positions ``seqs``): the rule graph, the
        live-and-archived workers, then the watermark advance; late refusals and failed statements are reported in
        ``res``. Returns the results."""
        rt = self.rt
        found: list[Found] = []
        if rt.workers_active():
            rt.offer(events, seqs)
        graph = rt.graph
        if graph.nodes:
            found.extend(Found(int(name), m) for name, m in graph.push_batch(events))
            if graph.late_events:
                self._query_late(graph, events, index, res)
            if graph.failures:
                self.mark_failed(graph, events, index, res)
        found.extend(rt.advance())
        per_query: dict[int, int] = {}
        for f in found:
            per_query[f.query_id] = per_query.get(f.query_id, 0) + 1
        for qid, n in per_query.items():
            live = rt.queries.get(qid)
            rt.metrics.matches.labels(live.name if live else str(qid)).inc(n)
        return found

    def _query_late(
        self, graph: RuleGraph, events: list[Event], index: list[int] | None, res: IngestResult | None
    ) -> None:
        where = {id(e): k for k, e in enumerate(events)}
        for name, event, reason in graph.late_events:
            self.rt.metrics.events_late.inc()
            k = where.get(id(event))
            if res is not None and index is not None and k is not None and len(res.query_late) < self.max_reported:
                lq = self.rt.queries.get(int(name))
                res.query_late.append({"index": index[k], "query": lq.name if lq else name, "reason": reason})
        graph.take_late()

    def mark_failed(
        self, graph: RuleGraph, events: list[Event] | None, index: list[int] | None, res: IngestResult | None
    ) -> None:
        """Mark the queries that failed (a plug-in misbehaved, issue 16; a query overran its matching time, issue
        13): they stop matching, the ingest and the others go on."""
        where = {id(e): k for k, e in enumerate(events or ())}
        for name, event, reason in graph.take_failures():
            lq = self.rt.queries.get(int(name))
            if lq is not None and lq.failed is None:
                lq.failed = reason
                log.error("query %s failed and stops matching: %s", lq.name, reason)
            k = where.get(id(event)) if event is not None else None
            if res is not None and index is not None and k is not None and len(res.query_errors) < self.max_reported:
                res.query_errors.append({"index": index[k], "query": lq.name if lq else name, "reason": reason})

    def _derived_reason(self, name: str) -> str:
        """Why an event of the derived type ``name`` is refused from a producer (issue 24)."""
        rt = self.rt
        who = ", ".join(sorted(rt.queries[q].name for q in rt.emitters.get(name, ())))
        made = f"EMIT INTO of {who}" if who else "made by EMIT INTO; no running statement emits it now"
        return f"'{name}' is a derived event type ({made}); it cannot be ingested"

    def _reject(self, res: IngestResult, i: int, line: int | None, fld: str, reason: str, kind: str) -> None:
        res.rejected += 1
        if kind == "conflict":
            res.conflicts += 1
        metrics = self.rt.metrics
        if kind == "late":
            metrics.events_late.inc()
        metrics.events_rejected.labels(kind).inc()
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
            self.rt.metrics.events_in.labels(t).inc(n)
