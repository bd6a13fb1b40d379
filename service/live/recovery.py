"""Checkpoints and the restart replay: recovery as one mechanism (docs/architecture.md section 4).

A statement's checkpoint is what Flink's is, a source position taken with what the state needs: its totals
and ``resume_seq``, a position in the service's durable ingest order (:mod:`service.live.ingest_order`) from
which replaying every event it reads, in that order, rebuilds its state. For a statement the runtime matches
itself, the position comes from an event-time horizon, the earliest event time its state may still need: its
WITHIN plus lateness plus what its operators remember (``CompiledQuery.state_span_us``), a window's size. A
live-and-archived query's position is what its worker acknowledged (:func:`acked_position`): the smallest ingest
position its unfinished work needs, read from its ledger (:mod:`engine.live_archived.ledger`) after the worker
matched a batch or committed a request's results; a worker that has not answered holds the position where its
last acknowledgement put it (the checkpoint never asks it, never waits, never guesses).

On restart the archive writer first replays its WAL into Delta, so every acknowledged event is in a Delta table with its
``ingest_seq`` and its request's ``ingested_at``. The replay reads, per event type, what some statement needs
(``ingest_seq >= resume_seq``; a statement without a checkpoint yet: what it received after ``active_since_us`` within
its horizon; one started with ``?state=warm`` counts as having received what was ingested before it too, warming fed it
that, and its warm start is a checkpoint committed before the answer), feeds it in ingest order to exactly those
statements, and the alerts found again are de-duplicated by (query, event ids). Derived events are not read: the
statements derive them again, with the same ids. Nothing is cut silently: only a statement without WITHIN (unbounded
state), or whose span exceeds ``LACE_REPLAY_MAX_S``, is limited, and that is logged, counted (``lace_replay_cut_total``,
``lace_replay_cut_seconds_total``) and shown in its stats (``replay_cut_ms``).

Reads use delta-rs directly (pyarrow dataset with partition, ``ingest_seq`` and ts pruning), not Spark: the
service must come back in seconds.
"""
from __future__ import annotations

import heapq
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy import update

from engine.event_type import EventType
from engine.events import Event
from service.core.faults import crash_point
from service.db.models import QueryRow
from service.db.session import transaction
from service.live.event_time import EventTime
from service.live.host import StreamState
from service.live.ingest import Ingest, content_digest
from service.live.live_query import LiveQuery
from service.live.outbox import Found

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from service.core.metrics import Metrics
    from service.live.applying_lock import ApplyingLock

log = logging.getLogger(__name__)
TS_TYPE = pa.timestamp("us", tz="UTC")
STATS_SLACK_US = 1_000  # Delta min/max statistics of timestamps are truncated to milliseconds
ALL_TIME = -(1 << 62)
"""An event time before every event, int us: the replay reads all a statement received."""
CHECKPOINT_ROWS = 250
"""Statements' checkpoints written per transaction (:func:`checkpoint`)."""


class RecoveryHost(StreamState, Protocol):
    """What checkpoints and the restart replay need of the runtime (:class:`~service.live.runtime.LiveRuntime` is
    one): its lock, the running statements (by id, by type, who emits each derived type), event types, event time,
    the ingest order and the ingest path (the recent producer ids), the rule graph and its advance, the archive,
    the recording of results, the database sessions, the metrics, the replay limit and the hand-over to the
    live-and-archived workers; ``replaying`` is set while the replay advances the statements."""

    replaying: bool
    """True while the restart replay advances the statements (:meth:`derived` archives only what is missing)."""

    @property
    def lock(self) -> ApplyingLock:
        """Held while the statements' state is read or fed."""

    @property
    def by_type(self) -> Mapping[str, list[LiveQuery]]:
        """Event type -> the running statements that read it."""

    @property
    def ingest_path(self) -> Ingest:
        """The ingest path (its recent producer ids; failed statements)."""

    @property
    def sessions(self) -> sessionmaker[Session]:
        """Database sessions (the checkpoints' rows)."""

    @property
    def metrics(self) -> Metrics:
        """The service's counters."""

    @property
    def replay_max_us(self) -> int:
        """How far back the replay goes at most (``LACE_REPLAY_MAX_S``), int us."""

    def advance(self) -> list[Found]:
        """Advance the rule graph's statements by their watermarks; their results."""

    def derived(self, items: list[tuple[str, Event]] | None = None, *, archive: bool = True) -> None:
        """Archive the derived events the graph emitted and hand them to live-and-archived workers."""

    def offer(self, events: list[Event], seqs: Sequence[int | None] | None = None) -> None:
        """Hand ``events`` at ingest positions ``seqs`` (and the watermarks) to the live-and-archived workers."""


@dataclass(slots=True)
class Horizon:
    """How far back (event time, int us) a statement's state reaches, and what a replay limit cuts of it.

    ``cut_us``: event time its state needs beyond ``LACE_REPLAY_MAX_S`` (0: nothing cut); ``unbounded``: the
    statement's state has no bound (a pattern without WITHIN, an INTERVAL run, a count window).
    """

    start_us: int
    cut_us: int = 0
    unbounded: bool = False


def horizon(rt: RecoveryHost, lq: LiveQuery, newest: int) -> Horizon:
    """The event time from which ``lq``'s state must be rebuilt, given the newest event time of its types, int us.

    Its span (:meth:`LiveQuery.state_span_us`) plus its lateness. Without a span the state is unbounded and
    ``replay_max_us`` bounds it (an explicit loss, :func:`record_cut`). A live-and-archived query's position comes
    from its worker's acknowledgements instead (:func:`checkpoint`); this only says what the replay limit cuts of
    it (an unbounded live side).
    """
    need = reach_us(rt, lq)
    back = rt.replay_max_us if need is None else min(need, rt.replay_max_us)
    out = Horizon(newest - back)
    if need is None:
        out.cut_us, out.unbounded = back, True
    elif need > back and not lq.by_acks:
        out.cut_us = need - back
    return out


def reach_us(rt: RecoveryHost, lq: LiveQuery, seen: frozenset[int] = frozenset()) -> int | None:
    """How far before the newest event time ``lq``'s state reaches in ingested events, int us (None: unbounded):
    its span plus lateness, plus, when it reads a derived type, the reach of the statements that emit it (what
    derives the events its state needs lies that much further back)."""
    span = lq.state_span_us()
    if span is None:
        return None
    upstream = 0
    for t in lq.compiled.stream_types:
        for qid in rt.emitters.get(t, ()):
            q = rt.queries.get(qid)
            if q is None or qid in seen or qid == lq.id:
                continue
            r = reach_us(rt, q, seen | {lq.id})
            if r is None:
                return None
            upstream = max(upstream, r)
    return span + lq.max_lateness_us + upstream


def acked_position(rt: RecoveryHost, lq: LiveQuery, newest: int | None) -> int | None:
    """A live-and-archived query's ``resume_seq``: the smallest ingest position its worker's unfinished work
    needs, as the worker last acknowledged it (:meth:`LiveQuery.acked_position`); while it has acknowledged nothing
    since it started, the position it had. Only forward. An unbounded live side (no WITHIN) is cut at
    ``LACE_REPLAY_MAX_S`` before the newest event time ``newest`` (int us), as :func:`horizon` says."""
    need = lq.acked_position()
    known = lq.resume_seq
    if need is None:
        return known
    pos = need if known is None else max(need, known)
    if newest is not None and lq.state_span_us() is None:  # the one limit: logged and counted at the restart
        pos = max(pos, rt.order.position_of(newest - rt.replay_max_us, pos))
    return pos


def checkpoint(rt: RecoveryHost) -> None:
    """Record each statement's checkpoint: its totals (``counters``), the position its state is rebuilt from
    (``resume_seq``) and, for a statement the runtime matches itself, the position the checkpoint is taken at
    (``checkpoint_seq``: the next one; under the runtime's lock, every result of the events before it is recorded,
    unless a failed alert transaction left some in memory, and then it does not move).

    Bulk UPDATEs by primary key, in transactions of :data:`CHECKPOINT_ROWS`: with thousands of statements one
    transaction of one UPDATE each held SQLite's write gate for up to 0.28 s. A statement nothing reached since
    the last checkpoint keeps what it has (its state has not moved).
    """
    queries = list(rt.queries.values())
    if not queries:
        return
    rows: list[tuple[LiveQuery, dict[str, Any]]] = []
    with rt.lock:
        for lq in queries:
            if not lq.moved_since_checkpoint():
                continue
            newest = rt.event_time.newest_of(lq.compiled.stream_types)
            if lq.by_acks:
                lq.resume_seq = acked_position(rt, lq, newest)
            elif newest is not None:
                known = lq.resume_seq if lq.resume_seq is not None else rt.order.floor
                lq.resume_seq = rt.order.position_of(horizon(rt, lq, newest).start_us, known)
            lq.note_checkpoint(rt.order.next_seq, rt.results.recorded)  # every result before it recorded
            values: dict[str, Any] = {
                "counters": lq.totals(), "resume_seq": lq.resume_seq, "checkpoint_seq": lq.checkpoint_seq
            }
            if values != lq.saved:  # unchanged since the last checkpoint (with thousands of statements, most are)
                rows.append((lq, values))
        rt.order.forget_before(min((q.resume_seq for q in queries if q.resume_seq is not None), default=0))
    if not rows:
        return
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for lq, values in rows:
        groups.setdefault(tuple(sorted(values)), []).append({"id": lq.id, **values})
    for group in groups.values():
        for i in range(0, len(group), CHECKPOINT_ROWS):
            with transaction(rt.sessions) as session:
                session.execute(update(QueryRow), group[i : i + CHECKPOINT_ROWS])
                crash_point("checkpoint.mid_transaction")
    for lq, values in rows:
        lq.saved = values


# ---------------------------------------------------------------------- reading the archive


def _table_uri(root: Path, name: str) -> str | None:
    from deltalake import DeltaTable

    uri = str(root / name)
    return uri if DeltaTable.is_deltatable(uri) else None


def _stat_max(acts: pa.Table, column: str) -> int | None:
    if acts.num_rows == 0 or column not in acts.column_names:
        return None
    col = acts.column(column)
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.int64())
    return pc.max(col).as_py()


def _columns_max(table: Any, columns: list[str]) -> dict[str, int | None]:
    """The largest value of each int or timestamp column of the Delta table ``table``, read from its files in one
    scan (int; timestamps in microseconds; None: no such column or value)."""
    ds = table.to_pyarrow_dataset()
    present = [c for c in columns if c in ds.schema.names]
    out: dict[str, int | None] = dict.fromkeys(columns)
    if not present:
        return out
    data = ds.to_table(columns=present)
    for c in present:
        col = data.column(c)
        value = pc.max(col.cast(pa.int64()) if pa.types.is_timestamp(col.type) else col).as_py()
        out[c] = None if value is None else int(value)
    return out


def archived_tops(root: Path, names: list[str]) -> tuple[dict[str, int], int | None, int | None]:
    """From Delta file statistics: per type its newest event time (``ts_end`` in an interval type's table,
    ``ts`` otherwise; int us), and over all of them the newest ``ingest_seq`` and ``ingested_at``."""
    from deltalake import DeltaTable

    tops: dict[str, int] = {}
    seq: int | None = None
    stamp: int | None = None
    for name in names:
        uri = _table_uri(root, name)
        if uri is None:
            continue
        table = DeltaTable(uri)
        acts = pa.table(table.get_add_actions(flatten=True))
        top = _stat_max(acts, "max.ts_end" if "max.ts_end" in acts.column_names else "max.ts")
        if top is not None:
            tops[name] = top + STATS_SLACK_US
        found = {c: _stat_max(acts, f"max.{c}") for c in ("ingest_seq", "ingested_at")}
        missing = [c for c, v in found.items() if v is None]
        if acts.num_rows and missing:  # no statistics (Delta indexes a table's first 32 columns): read the columns
            found.update(_columns_max(table, missing))
        s, t = found["ingest_seq"], found["ingested_at"]
        if s is not None:
            seq = s if seq is None else max(seq, s)
        if t is not None:
            stamp = t + STATS_SLACK_US if stamp is None else max(stamp, t + STATS_SLACK_US)
    return tops, seq, stamp


@dataclass(slots=True)
class Row:
    """One archived event as the replay feeds it: its ingest order key, the event, and its positions."""

    key: tuple[int, int, int, int]
    event: Event
    ingested_at: int
    seq: int | None


def read_rows(root: Path, spec: EventType, *, from_seq: int | None, since: tuple[int, int] | None) -> list[Row]:
    """Archived events of ``spec`` at ``ingest_seq >= from_seq``, or stamped after ``since[0]``
    (``ingested_at``) and ending at or after ``since[1]`` (event time), int us; sorted in ingest order
    (``ingested_at``, then ``ingest_seq``; rows written before ``ingest_seq`` existed by (ts_end, id)).

    A point event ends at its ``ts``; an event of an interval type carries its ``ts_end`` (the type's
    ``max_duration_us`` bounds how far before its end it starts, else every date is read).
    """
    table, attrs = _scan(root, spec, from_seq=from_seq, since=since)
    if table is None:
        return []
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    ids, tss, ing = cols["id"], cols["ts"], cols["ingested_at"]
    ends = cols.get("ts_end", tss)
    seqs = cols.get("ingest_seq", [None] * table.num_rows)
    out = []
    for i in range(table.num_rows):
        values = {a: cols[a][i] for a in attrs if cols[a][i] is not None}
        ev = Event(ids[i], spec.name, tss[i], values, ends[i])
        out.append(Row((ing[i], seqs[i] or 0, ends[i], ids[i]), ev, ing[i], seqs[i]))
    out.sort(key=lambda r: r.key)
    return out


def _scan(
    root: Path, spec: EventType, *, from_seq: int | None, since: tuple[int, int] | None
) -> tuple[pa.Table | None, list[str]]:
    """The rows :func:`read_rows` selects, as a table of ``id``, ``ts``, ``ingested_at``, ``ts_end`` (an interval
    type's), ``ingest_seq`` (when the table has it) and the attributes (timestamps as int64 us), and the attribute
    names in it; None when there is nothing to read."""
    import pyarrow.dataset as pds
    from deltalake import DeltaTable

    uri = _table_uri(root, spec.name)
    if uri is None or (from_seq is None and since is None):
        return None, []
    ds = DeltaTable(uri).to_pyarrow_dataset()
    names = ds.schema.names
    interval = spec.interval and "ts_end" in names
    end = "ts_end" if interval else "ts"
    has_seq = "ingest_seq" in names
    flt = None
    if since is not None:
        stamp_after, end_from = since
        flt = (pds.field("ingested_at") > pa.scalar(stamp_after, TS_TYPE)) & (
            pds.field(end) >= pa.scalar(end_from, TS_TYPE)
        )
        first = end_from - (spec.max_duration_us or 0) if interval else end_from
        if from_seq is None and end_from > ALL_TIME and (not interval or spec.max_duration_us is not None):
            # date = UTC date of ts
            flt &= pds.field("date") >= datetime.fromtimestamp(first / 1e6, tz=UTC).strftime("%Y-%m-%d")
    if from_seq is not None and has_seq:
        by_seq = pds.field("ingest_seq") >= from_seq
        flt = by_seq if flt is None else (flt | by_seq)
    if flt is None:
        return None, []
    attrs = [a for a in spec.attributes if a in names]
    extra = (["ts_end"] if interval else []) + (["ingest_seq"] if has_seq else [])
    table = ds.to_table(columns=["id", "ts", "ingested_at", *extra, *attrs], filter=flt)
    cols = [col.cast(pa.int64()) if pa.types.is_timestamp(col.type) else col for col in table.columns]
    return pa.table(cols, names=table.column_names), attrs


def recent_ids(root: Path, types: Mapping[str, EventType], last_seq: int | None, window: int) -> dict[int, bytes]:
    """The ids of the last ``window`` ingested events (``ingest_seq > last_seq - window``, every ingested type, in
    ingest order) -> their content digests (:func:`service.live.ingest.content_digest`): what the ingest remembers
    for idempotent retries (``LACE_DEDUP_WINDOW``), restored from the archive on restart.

    Not from the replay: it reads only the types some statement reads, from the earliest position they need, and a
    request posted again after a crash (its answer lost, its events in the write-ahead log) holds events of every
    type, acknowledged or not (``tests/crash/test_repost_after_crash.py``).
    """
    if last_seq is None or window <= 0:
        return {}
    first = max(last_seq - window + 1, 0)
    found: list[tuple[int, int, bytes]] = []  # (ingest_seq, id, digest)
    for spec in types.values():
        table, attrs = (None, []) if spec.derived else _scan(root, spec, from_seq=first, since=None)
        if table is None or "ingest_seq" not in table.column_names:
            continue
        contents = table.select(attrs + (["ts_end"] if "ts_end" in table.column_names else [])).to_pylist()
        for seq, eid, ts, content in zip(
            table.column("ingest_seq").to_pylist(), table.column("id").to_pylist(), table.column("ts").to_pylist(),
            contents, strict=True,
        ):
            end = content.pop("ts_end", None)
            values = {k: v for k, v in content.items() if v is not None}
            found.append((seq, eid, content_digest(spec.name, ts, values, end)))
    found.sort()
    return {eid: digest for _, eid, digest in found}


def not_archived(root: Path, events: list[Event]) -> list[Event]:
    """The derived ``events`` (EMIT INTO) whose ids the archive under ``root`` does not hold, in their order.

    The replay derives again what its statements derived before the restart, under the same ids
    (:func:`engine.rules.derived.derived_event_id`); the archive holds them unless a crash came between the
    input events' write-ahead log and the derived events' (a SIGKILL during the request that derived them; the
    re-posted request is a duplicate then and derives nothing). Reads the ``id`` column of each type's table
    over the events' dates and ``ts`` range only.
    """
    import pyarrow.dataset as pds
    from deltalake import DeltaTable

    by_type: dict[str, list[Event]] = {}
    for e in events:
        by_type.setdefault(e.type, []).append(e)
    held: set[int] = set()
    for name, evs in by_type.items():
        uri = _table_uri(root, name)
        if uri is None:
            continue
        lo, hi = min(e.ts for e in evs), max(e.ts for e in evs)
        day = [datetime.fromtimestamp(t / 1e6, tz=UTC).strftime("%Y-%m-%d") for t in (lo, hi)]
        flt = (
            (pds.field("date") >= day[0]) & (pds.field("date") <= day[1])
            & (pds.field("ts") >= pa.scalar(lo, TS_TYPE)) & (pds.field("ts") <= pa.scalar(hi, TS_TYPE))
        )
        ids = DeltaTable(uri).to_pyarrow_dataset().to_table(columns=["id"], filter=flt).column("id")
        held.update(ids.to_pylist())
    return [e for e in events if e.id not in held]


# ---------------------------------------------------------------------- the restart replay


def record_cut(rt: RecoveryHost, lq: LiveQuery, h: Horizon) -> None:
    """Record that the replay limit cut ``h.cut_us`` of ``lq``'s state: a warning, its stats, the metrics."""
    if not h.cut_us:
        return
    lq.replay_cut_us = h.cut_us
    rt.metrics.replay_cut.labels(lq.name).inc()
    rt.metrics.replay_cut_seconds.labels(lq.name).inc(h.cut_us / 1e6)
    if h.unbounded:
        log.warning(
            "query %s (%d): the restart replay goes back only %d s (LACE_REPLAY_MAX_S) because its state has no "
            "bound (a pattern without WITHIN, an INTERVAL run, a count window); what it held from earlier is lost",
            lq.name, lq.id, h.cut_us // 1_000_000,
        )
    else:
        log.warning(
            "query %s (%d): the restart replay stops LACE_REPLAY_MAX_S back; its WITHIN + lateness reaches %d s "
            "further: partial matches that started in those %d s are lost",
            lq.name, lq.id, h.cut_us // 1_000_000, h.cut_us // 1_000_000,
        )


def rebuild(rt: RecoveryHost, root: Path, types: Mapping[str, EventType]) -> dict[str, int]:
    """Replay the archive into ``rt``'s statements (started with their checkpointed ``resume_seq``) and continue
    the ingest order after the archive's; return counters for the log.

    The replay starts at the earliest position any statement needs (a statement without a checkpoint: what it
    received after ``active_since_us`` within its horizon) and feeds every statement, in ingest order, what it
    received live from there (``ingested_at > active_since_us``): more history than a statement needs rebuilds
    the state it had then, and an emitter re-derives what the readers of its stream need.
    """
    tops, last_seq, last_stamp = archived_tops(root, list(types))
    rt.order.resume_after(last_seq, last_stamp)
    rt.ingest_path.restore(recent_ids(root, types, last_seq, rt.ingest_path.dedup_window))
    if not tops:
        return {"events": 0, "alerts": 0}
    from_seq: int | None = None
    since: tuple[int, int] | None = None
    with rt.lock:
        for name, top in tops.items():  # each stream's event time; refined by the replayed events below
            rt.event_time.observe(name, top - STATS_SLACK_US)
        for lq in rt.queries.values():
            newest = max((tops[t] for t in lq.compiled.stream_types if t in tops), default=None)
            if newest is None:
                continue
            h = horizon(rt, lq, newest)
            record_cut(rt, lq, h)
            # a live-and-archived query without a position yet (killed before its worker's first acknowledgement
            # was checkpointed): everything it received, its live instances may wait for any of it
            start = ALL_TIME if lq.by_acks and not h.unbounded else h.start_us
            if lq.resume_seq is not None:
                from_seq = lq.resume_seq if from_seq is None else min(from_seq, lq.resume_seq)
            elif since is None:
                since = (received_from(lq), start)
            else:
                since = (min(since[0], received_from(lq)), min(since[1], start))
        wanted = {t for lq in rt.queries.values() for t in lq.compiled.stream_types}
        wanted = {t for t in wanted if t in types and t not in rt.emitters}  # derived events are derived again
    parts = [read_rows(root, types[t], from_seq=from_seq, since=since) for t in sorted(wanted)]
    rows = list(heapq.merge(*parts, key=lambda r: r.key))
    floor = min((r.seq for r in rows if r.seq is not None), default=rt.order.next_seq)
    rt.order.floor = min(rt.order.floor, floor)
    n, alerts = replay(rt, rows)
    for lq in rt.queries.values():
        if lq.resume_seq is None:
            lq.resume_seq = floor  # it has been fed all it needs from the replay's first position on
    log.info("replayed %d archived events from position %d: %d new alerts", n, floor, alerts)
    return {"events": n, "alerts": alerts, "from_seq": floor}


def settle(rt: RecoveryHost, replayed: EventTime, derived: list[tuple[str, Event]]) -> list[Found]:
    """Advance the rule graph to the watermark of the rows replayed so far (``replayed``: their event time, per type
    its newest, :func:`replay`'s), as the service had advanced it when it took the checkpoint; return the results of
    statements without a checkpoint position (the others recorded theirs before the restart), and add the derived
    events emitted so far to ``derived`` (archived before the restart; the replay hands them on with the rest).

    Without it, what the watermark had released before the checkpoint came out only at the end of the replay,
    where nothing tells it from a new result: a replay that starts inside an ``INTERVAL`` run (the earliest
    position of any statement, not this one's) derives that run again without its first events, under another
    id, and its reader alerted a pair with it (the crash suite, PostgreSQL, archive flush;
    ``tests/crash/test_replay_start.py``). The watermark is each type's newest minus its lateness, the earliest
    over a statement's types, never an ended type's end of time nor an idle type's, and none for a statement with
    a type no replayed row has reached yet (:meth:`~service.live.event_time.EventTime.watermark_reached`): at most
    the service's then, so nothing released here was still to come after the checkpoint. The graph's clock goes
    to the largest single type's (:meth:`~service.live.event_time.EventTime.furthest`).
    """
    top = replayed.furthest()
    if top is None or not rt.graph.nodes:
        derived.extend(rt.graph.take_derived())
        return []
    out = [Found(int(name), m) for name, m in rt.graph.advance(top, replayed.watermark_reached)]
    derived.extend(rt.graph.take_derived())
    return [f for f in out if rt.queries[f.query_id].checkpoint_seq is None]


def received_from(lq: LiveQuery) -> int:
    """The ``ingested_at`` (int us) after which ``lq`` received events: its ``active_since_us``, or 0 for a
    warm-started statement (``warmed``: warming fed it what was ingested before it started, within its horizon)."""
    return 0 if lq.warmed else lq.active_since_us


def replay(rt: RecoveryHost, rows: list[Row]) -> tuple[int, int]:
    """Feed ``rows`` (in ingest order) to the statements that received them live (stamped after their
    ``active_since_us``, or any of a warm-started one: :func:`received_from`). Returns ``(events replayed, new
    alerts)``.

    The results a row makes for a statement whose checkpoint was taken after it (``row.seq < checkpoint_seq``)
    were recorded before the restart: they rebuild its state and are not alerted again (the replay may start
    inside an AGGREGATE window or a ``dedup`` chain that fired long ago, and find them otherwise). So are those
    the watermark had released by the checkpoint: before the first row at or after the earliest
    ``checkpoint_seq`` the statements are advanced as far as the rows before it take them (:func:`settle`). The
    others are de-duplicated by their identity (query, event ids; a window's bounds and fields).
    """
    found: list[Found] = []
    graph = rt.graph
    ingest = rt.ingest_path
    settle_at = min((q.checkpoint_seq for q in rt.queries.values() if q.checkpoint_seq is not None), default=None)
    replayed = EventTime(rt.event_time.lateness_us)  # the rows replayed so far: per type, the newest event time
    archived: list[tuple[str, Event]] = []  # derived before the checkpoint
    with rt.lock:
        for row in rows:
            e = row.event
            rt.event_time.observe(e.type, e.ts_end)
            if row.seq is not None:
                rt.order.note(row.seq, [e])
            if settle_at is not None and row.seq is not None and row.seq >= settle_at:
                found.extend(settle(rt, replayed, archived))
                settle_at = None
            replayed.observe(e.type, e.ts_end)
            takers = [lq for lq in rt.by_type.get(e.type, ()) if row.ingested_at > received_from(lq)]
            graph_wanted = False
            for lq in takers:  # a worker keeps its events, handed over in one batch (offer_replayed)
                graph_wanted = lq.take_replayed(e, row.seq) or graph_wanted
            if not graph_wanted or graph.filter(e) is not None:
                continue
            names = {str(lq.id) for lq in takers}
            for name, m in graph.push(e, names.__contains__):
                lq = rt.queries[int(name)]
                if row.seq is None or lq.checkpoint_seq is None or row.seq >= lq.checkpoint_seq:
                    found.append(Found(lq.id, m))
            graph.take_late()
            if graph.failures:
                ingest.mark_failed(graph, None, None, None)
        if settle_at is not None:  # every row lies before the checkpoint
            found.extend(settle(rt, replayed, archived))
        for lq in rt.queries.values():
            lq.offer_replayed()
        rt.derived(archived, archive=False)
        rt.replaying = True
        try:
            found.extend(rt.advance())
        finally:
            rt.replaying = False
        rt.offer([])
        for lq in rt.queries.values():  # what the replay counts again was counted before the restart
            lq.mark_replayed()  # a worker's: once it has matched the replayed events
        rt.metrics.replayed.inc(len(rows))
        return len(rows), rt.results.save(found)


def worker_replay(
    rt: RecoveryHost, query_ids: list[int], upto: int | None
) -> dict[int, tuple[list[Event], list[int | None]]]:
    """What each of a restarted worker's queries needs again (:meth:`service.live.la_process.WorkerPool._restart`):
    per query id, the events it received live (stamped after :func:`received_from`) from its acknowledged position
    (:meth:`LiveQuery.acked_position`; everything it received when it acknowledged nothing) up to ingest position
    ``upto`` (the last position offered before the worker died; the later ones wait in the service), in ingest
    order, with their positions.

    The archive is flushed first (the recent buffer's events become Delta rows), then read with delta-rs as the
    restart replay reads it (:func:`read_rows`). Not replayed: derived events (``EMIT INTO``; they have no ingest
    position), as for a statement reading a derived type at a service restart they come again only when derived.
    Results found again are de-duplicated at commit.
    """
    with rt.lock:
        lqs = [rt.queries[q] for q in query_ids if q in rt.queries]
        needs = {lq.id: lq.acked_position() for lq in lqs}
        specs = dict(rt.types)
        derived = set(rt.emitters)
    if not lqs or rt.archive is None or upto is None:
        return {}
    rt.archive.flush()
    root = rt.archive.root
    wanted = {t for lq in lqs for t in lq.compiled.stream_types if t in specs and t not in derived}
    known = [n for n in needs.values() if n is not None]
    from_seq = min(known) if known else None
    unacked = [lq for lq in lqs if needs[lq.id] is None]
    since = (min(received_from(lq) for lq in unacked), ALL_TIME) if unacked else None
    parts = [read_rows(root, specs[t], from_seq=from_seq, since=since) for t in sorted(wanted)]
    out: dict[int, tuple[list[Event], list[int | None]]] = {lq.id: ([], []) for lq in lqs}
    for row in heapq.merge(*parts, key=lambda r: r.key):
        if row.seq is None or row.seq > upto:
            continue
        e = row.event
        for lq in lqs:
            need = needs[lq.id]
            if e.type in lq.compiled.stream_types and row.ingested_at > received_from(lq) and (
                need is None or row.seq >= need
            ):
                events, seqs = out[lq.id]
                events.append(e)
                seqs.append(row.seq)
    return out
