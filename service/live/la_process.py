"""The live-and-archived worker pool: a fixed set of processes hosts every live-and-archived query (issues 12, 43).

:class:`WorkerPool` runs ``LACE_WORKERS`` worker processes (default: the machine's cores minus one, at least one),
each started with the ``spawn`` context (no fork of a process that holds a JVM gateway, SQLite connections and
threads) when its first query is assigned to it. A query goes to one worker by one rule (:meth:`WorkerPool.assign`):
**the worker hosting the fewest queries, ties to the lowest index**; shown as ``worker`` in the query's stats and in
``GET /queries/{id}``. Inside a worker each query is a :class:`~service.live.live_archived.LiveArchivedWorker` (its
runner: ALAA, LLAA, OLLAA or SLLAA, 001 section 4, its ledger, its acknowledgements), fed through one index by event
type (:class:`~service.live.feeds.Feeds`).

- **Batches cross once per worker, in columns.** Ingest hands the pool each batch once (:meth:`WorkerPool.offer`,
  a queue append per worker, with every query's watermark and idleness); each worker's sender thread sends it as
  Arrow IPC bytes (:func:`encode_batch`: one record batch per event type with the events' ids, times, attributes,
  ingest positions and places in the batch), encoded once for all workers; the worker decodes it once
  (:func:`decode_batch`) and its index gives each query the events of its types.
- **Spark stays in the service.** A query asks for archived events with an ``extract`` message; the service's
  shared scheduler (:mod:`service.live.archive_scheduler`) reads it together with every other query's waiting
  requests of the same types and answers with the Arrow table as IPC bytes; the worker turns rows into events,
  matches ``P_A`` and joins. ``count`` and ``selectivity`` (OLLAA's statistics) go the same way. A worker has one
  thread per request in flight (``requests_in_flight``); mergeable requests (SLLAA subwindows) of one query keep
  their own bound (``mergeable_in_flight``) so the subwindows that close meanwhile become one request.
- **Results.** A query sends each batch of results with a ``record`` message and waits for the answer: the service
  commits them with their outbox rows in one transaction shared with the other queries' results waiting then
  (:meth:`service.live.results.Results.submit`, a group commit; de-duplicated by (query, event ids)) before the
  query forgets the request, so no acknowledged position passes an uncommitted result.
- **Positions.** A query acknowledges with an ``("ack", query_id, last_seq, need)`` message after each batch it
  matched and each request whose results were committed (:meth:`LiveArchivedWorker._ack`, from the query's ledger);
  the service keeps the last (:attr:`PooledQuery.acked`, only ever forward) and the checkpoint writes it. The
  service never asks a worker for a position: a busy, starting or dead worker's last acknowledgement stands.
- **A worker dies** (SIGKILL, or a query raised: the worker reports ``("failed", query_id, text)`` and exits
  without acknowledging the batch): the service logs it, counts it (``worker_restarts`` in the stats,
  ``lace_worker_restarts_total``), starts the worker again with its queries and replays each query from its
  acknowledged position (:func:`service.live.recovery.worker_replay`: the archive, flushed, up to the last position
  offered before the death); batches offered meanwhile wait in the service, bounded by ``LACE_WORKER_BACKLOG``
  events (ingest answers 503 with Retry-After past it, :class:`~service.live.feeds.WorkersBusy`), and follow the
  replay. Results found again are de-duplicated at commit, so each is delivered once. A query that raised
  :data:`MAX_QUERY_FAILURES` times is started failed (it matches no more; ``failed`` in its stats).

Messages are tuples, the first item their kind; requests carry an id and get a ``("reply", id, ok, value)``. A
worker exits when its pipe closes (the service stopped or was killed); it ignores SIGINT and SIGTERM (a signal to
the process group): the service stops it on purpose when it shuts down.
"""
from __future__ import annotations

import collections
import functools
import itertools
import logging
import multiprocessing
import os
import pickle
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from typing import Any

from archive.archived_source import Extract
from engine.events import Event
from engine.live_archived.memo import ArchivedMemo
from engine.live_archived.plan import LiveArchivedPlan, Range
from engine.live_archived.source import Ranges
from engine.match import Match
from service.live.archive_scheduler import MAX_BATCH, ArchiveScheduler
from service.live.feeds import Feeds, Marks, WorkersBusy

log = logging.getLogger(__name__)

STATS_TIMEOUT_S = 1.0
"""How long ``stats`` waits for a worker before answering with the last counters (positions never wait: they
come from the acknowledgements, :attr:`PooledQuery.acked`)."""
REQUESTS_IN_FLIGHT = MAX_BATCH
"""Default bound on one query's archive requests at the scheduler at once (:attr:`ChildSpec.requests_in_flight`):
the scheduler's ``MAX_BATCH``, so one query alone can fill a read."""
MAX_QUERY_FAILURES = 3
"""A query that raised this many times is started failed when its worker restarts (else it would raise again on
the replay, forever)."""
WORKER_BACKLOG = 1_000_000
"""Default bound on the events queued in the service for one worker (``LACE_WORKER_BACKLOG``)."""


def default_workers() -> int:
    """``LACE_WORKERS``' default: the machine's cores minus one, at least one."""
    return max(1, (os.cpu_count() or 2) - 1)


@dataclass(slots=True)
class ChildSpec:
    """What a worker needs to build one query's runner (everything picklable).

    Attributes
    ----------
    query_id, name : the query's id and name
    ast : the query's syntax tree (``LiveArchivedPlan.ast``); the worker compiles it again with ``schemas``
    schemas : dict
        Event type -> {attribute -> type}, as the service compiled the query with.
    algorithm : str
    tolerance_us : int
        SLLAA's ``T_L``, int microseconds.
    allowed_lateness_us : dict
        Per event type, int microseconds.
    lateness_us : int
        The largest of them.
    pm_capacity, pm_policy, pm_query_id : partial-match budget (docs/architecture.md section 7.6)
    pm_store_url : str, optional
        SQLAlchemy URL of the partial-match store (the worker opens its own connection).
    requests_in_flight : int
        Archive requests of this query at the service's scheduler at once (``LACE_LA_REQUESTS_IN_FLIGHT``,
        default :data:`REQUESTS_IN_FLIGHT`); the query's later requests wait in the worker, in order.
    mergeable_in_flight : int
        Of those, mergeable ones (SLLAA subwindows) at once (``LACE_LA_LOOKUP_WORKERS``).
    known_ranges : bool
        Archive requests read only what the query's earlier requests did not (the runner's ``known_ranges``: ingest
        refuses late events of its archived types).
    failed : str, optional
        Start the query failed (it raised :data:`MAX_QUERY_FAILURES` times): it matches nothing.
    fault_batch : int, optional
        A test fault (``LACE_WORKER_FAULT=raise:<query name>:<n>``, a worker's first start only): the query raises
        on the n-th batch it matches.
    """

    query_id: int
    name: str
    ast: Any
    schemas: dict[str, dict[str, str]] | None
    algorithm: str
    tolerance_us: int
    allowed_lateness_us: dict[str, int]
    lateness_us: int
    pm_capacity: int | None = None
    pm_policy: str | None = None
    pm_query_id: str | None = None
    pm_store_url: str | None = None
    requests_in_flight: int = REQUESTS_IN_FLIGHT
    mergeable_in_flight: int = 2
    log_level: int = field(default=logging.WARNING)
    failed: str | None = None
    fault_batch: int | None = None
    known_ranges: bool = False


class RemoteError(RuntimeError):
    """The other process failed to answer a request (its exception, as text)."""


class Channel:
    """Both ends' half of the pipe: thread-safe sends, requests with ids, their replies as futures."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.send_lock = threading.Lock()
        self.pending: dict[int, Future[Any]] = {}
        self.ids = itertools.count(1)
        self.closed = False

    def send(self, msg: tuple[Any, ...]) -> None:
        with self.send_lock:
            self.conn.send(msg)

    def request(self, kind: str, *args: Any) -> Future[Any]:
        """Send ``("rpc", id, kind, args)``; the future gets the value of the matching reply."""
        rid = next(self.ids)
        fut: Future[Any] = Future()
        self.pending[rid] = fut
        try:
            self.send(("rpc", rid, kind, args))
        except Exception as e:
            self.pending.pop(rid, None)
            fut.set_exception(e)
        return fut

    def reply(self, rid: int, fn: Callable[[], Any]) -> None:
        """Answer request ``rid`` with ``fn()`` (or the exception it raises, as text)."""
        try:
            value, ok = fn(), True
        except Exception as e:  # noqa: BLE001 - sent to the other side, which raises RemoteError
            log.debug("request %d failed", rid, exc_info=True)
            value, ok = f"{type(e).__name__}: {e}", False
        try:
            self.send(("reply", rid, ok, value))
        except (OSError, ValueError):
            pass  # the other side is gone

    def resolve(self, rid: int, ok: bool, value: Any) -> None:
        fut = self.pending.pop(rid, None)
        if fut is not None:
            fut.set_result(value) if ok else fut.set_exception(RemoteError(value))

    def fail_all(self) -> None:
        """The pipe closed: every request waiting fails."""
        self.closed = True
        for rid in list(self.pending):
            fut = self.pending.pop(rid, None)
            if fut is not None:
                fut.set_exception(RemoteError("the other process is gone"))


class JsonMatch:
    """A result as the service records it: ``to_json()`` of the child's :class:`engine.match.Match`."""

    __slots__ = ("doc",)

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc

    def to_json(self) -> dict[str, Any]:
        return self.doc


# ---------------------------------------------------------------------------------------- the batch on the pipe

_ATTR = "a:"
"""Prefix of an attribute's column (the other columns are the event's own fields)."""


def encode_batch(events: Sequence[Event], seqs: Sequence[int | None]) -> list[tuple[str, bytes]]:
    """``events`` with their ingest positions ``seqs`` as Arrow IPC streams, one per event type: columns ``pos``
    (the event's place in the batch), ``id``, ``ts``, ``ts_end`` (int us UTC), ``seq`` and one ``a:<name>``
    column per attribute. An attribute whose values Arrow would change (ints among floats, mixed kinds) or a type
    whose events do not all have the same attributes travels pickled in the schema's metadata instead, so the
    worker rebuilds every event exactly (:func:`decode_batch`)."""
    import pyarrow as pa

    out = []
    for t, idx in _group(events).items():
        evs = [events[i] for i in idx]
        cols: dict[str, Any] = {
            "pos": pa.array(idx, pa.int64()),
            "id": pa.array([e.id for e in evs], pa.int64()),
            "ts": pa.array([e.ts for e in evs], pa.int64()),
            "ts_end": pa.array([e.ts_end for e in evs], pa.int64()),
            "seq": pa.array([seqs[i] for i in idx], pa.int64()),
        }
        meta: dict[bytes, bytes] = {}
        first = evs[0].attrs.keys()
        if all(e.attrs.keys() == first for e in evs):
            for name in first:
                values = [e.attrs[name] for e in evs]
                col = _column(values)
                if col is None:
                    meta[(_ATTR + name).encode()] = pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL)
                else:
                    cols[_ATTR + name] = col
            if meta:
                meta[b"order"] = pickle.dumps(list(first))
        else:
            meta[b"attrs"] = pickle.dumps([e.attrs for e in evs], protocol=pickle.HIGHEST_PROTOCOL)
        table = pa.table(cols).replace_schema_metadata(meta or None)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        out.append((t, sink.getvalue().to_pybytes()))
    return out


def _group(events: Sequence[Event]) -> dict[str, list[int]]:
    from service.live.feeds import by_type

    return by_type(events)


def _column(values: list[Any]) -> Any:
    """``values`` as an Arrow array when it gives them back unchanged (None otherwise)."""
    import pyarrow as pa

    kinds = {type(v) for v in values if v is not None}
    if len(kinds) > 1 or not kinds <= {int, float, str, bool}:
        return None
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return None


def decode_batch(parts: list[tuple[str, bytes]] | None) -> tuple[list[Event], list[int | None], dict[str, list[int]]]:
    """What :func:`encode_batch` sent: the events in batch order, their ingest positions, and the batch's index by
    event type (type -> the events' places, in order)."""
    if not parts:
        return [], [], {}
    import pyarrow as pa

    tables = [(t, pa.ipc.open_stream(data).read_all()) for t, data in parts]
    n = sum(tb.num_rows for _, tb in tables)
    events: list[Any] = [None] * n
    seqs: list[int | None] = [None] * n
    index: dict[str, list[int]] = {}
    for t, tb in tables:
        pos = tb.column("pos").to_pylist()
        ids, tss, ends, sq = (tb.column(c).to_pylist() for c in ("id", "ts", "ts_end", "seq"))
        meta = tb.schema.metadata or {}
        if b"attrs" in meta:
            attrs = pickle.loads(meta[b"attrs"])
        else:
            names = [c[len(_ATTR):] for c in tb.column_names if c.startswith(_ATTR)]
            values = [tb.column(_ATTR + name).to_pylist() for name in names]
            if b"order" in meta:  # some attributes came pickled: put them back in the events' order
                order = pickle.loads(meta[b"order"])
                got = dict(zip(names, values))
                for name in order:
                    if name not in got:
                        got[name] = pickle.loads(meta[(_ATTR + name).encode()])
                names, values = order, [got[name] for name in order]
            attrs = [dict(zip(names, row)) for row in zip(*values)] if names else [{} for _ in pos]
        for p, i, ts, end, s, a in zip(pos, ids, tss, ends, sq, attrs):
            events[p] = Event(i, t, ts, a, end)
            seqs[p] = s
        index[t] = pos
    return events, seqs, index


class Batch:
    """One batch offered to the pool: its events and positions, encoded once (by the first sender that needs it)."""

    __slots__ = ("events", "seqs", "_data", "_lock")

    def __init__(self, events: list[Event], seqs: Sequence[int | None]) -> None:
        self.events = events
        self.seqs = seqs
        self._data: list[tuple[str, bytes]] | None = None
        self._lock = threading.Lock()

    def encoded(self) -> list[tuple[str, bytes]] | None:
        """:func:`encode_batch` of it, once (None: no event)."""
        if not self.events:
            return None
        with self._lock:
            if self._data is None:
                self._data = encode_batch(self.events, self.seqs)
            return self._data


# ---------------------------------------------------------------------------------------- service side


@dataclass(slots=True)
class _Child:
    """One start of a worker process: its process, pipe, outbox (what its sender thread sends) and readiness."""

    proc: Any
    chan: Channel
    outbox: queue.SimpleQueue[Any]
    ready: threading.Event
    generation: int


class PooledQuery:
    """The service's handle on a query hosted by a worker of the pool (what a live-and-archived worker offers the
    runtime: ``offer`` for the restart replay, ``call``, ``settle``, ``stop``, ``acked``, ``stats``).

    ``spec`` builds it in the worker; ``plan`` is the service's own compiled plan (OLLAA's ``selectivity`` and
    the archive requests' ``P_A``)."""

    def __init__(self, slot: WorkerSlot, spec: ChildSpec, plan: LiveArchivedPlan) -> None:
        self.slot = slot
        self.spec = spec
        self.query_id = spec.query_id
        self.name = spec.name
        self.algorithm = spec.algorithm
        self.plan = plan
        self.stopped = False
        self.failures = 0
        """Times the query raised in its worker (:data:`MAX_QUERY_FAILURES`)."""
        self.acked: tuple[int, int] | None = None
        """The query's last acknowledgement (:meth:`LiveArchivedWorker._ack`): (the last ingest position it matched,
        the smallest position its unfinished work needs), each only ever forward (a restarted worker's first ones
        may lie before: its replay starts at the acknowledged need); None until it sent one."""
        self._last_stats: dict[str, Any] = {}
        self._answered_sent = 0

    def note_ack(self, last_seq: int, need: int) -> None:
        """Keep an acknowledgement from the worker (in the pipe's order)."""
        old = self.acked
        self.acked = (last_seq, need) if old is None else (max(old[0], last_seq), max(old[1], need))

    def offer(
        self, events: list[Event], watermark_us: int | None, *, seqs: Sequence[int | None] | None = None,
        upto: int | None = None, idle: bool = False,
    ) -> None:
        """Hand the query a batch of its own (the restart replay's events, at positions ``seqs``)."""
        self.slot.put(("replay", self.query_id, Batch(events, list(seqs or [None] * len(events)))), len(events))

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` (on a thread of the service) once the query has matched everything offered before it."""
        self.slot.call(self.query_id, fn)

    def settle(self, timeout_s: float) -> bool:
        """See :meth:`LiveArchivedWorker.settle` (False also when the worker is gone)."""
        deadline = time.monotonic() + timeout_s
        matched = threading.Event()
        self.call(matched.set)  # after the events already queued
        if not matched.wait(timeout_s):
            return False
        try:
            left = max(0.0, deadline - time.monotonic())
            return bool(self.slot.request("settle", self.query_id, left).result(timeout=left + STATS_TIMEOUT_S))
        except Exception:  # noqa: BLE001 - gone or too slow: not settled
            return False

    def stop(self) -> None:
        """Stop the query in its worker (requests in flight are abandoned: a restart replays them)."""
        if not self.stopped:
            self.stopped = True
            self.slot.pool.remove(self.query_id)

    def stats(self) -> dict[str, Any]:
        """The query's :meth:`LiveArchivedWorker.stats` in its worker, with ``worker`` (index, pid, alive, restarts);
        ``backlog_events`` includes the events queued for the worker and, while it is starting or too busy to
        answer (the last counters stand), those piped to it since."""
        slot = self.slot
        d = self._last_stats or self._empty_stats()
        child = slot.child
        if child is not None and child.ready.is_set():
            asked = slot.sent
            try:
                d = self._last_stats = slot.request("stats", self.query_id).result(timeout=STATS_TIMEOUT_S)
                self._answered_sent = asked
            except Exception:  # noqa: BLE001 - busy or gone: the last counters
                pass
        d = dict(d)
        with slot.lock:
            waiting = slot.unsent + max(0, slot.sent - self._answered_sent)
            oldest = slot.unsent_at[0] if slot.unsent_at else None
        d["backlog_events"] = d.get("backlog_events", 0) + waiting
        if waiting and oldest is not None:
            d["backlog_s"] = round(max(float(d.get("backlog_s", 0.0)), time.time() - oldest), 3)
        d["caught_up"] = bool(d.get("caught_up", False)) and d["backlog_events"] == 0
        d["worker"] = slot.info()
        return d

    def _empty_stats(self) -> dict[str, Any]:
        """The counters of a query that has seen nothing yet (its worker is starting)."""
        from engine.live_archived.counters import RunCounters
        from engine.matcher import Matcher

        zero = {"p50": 0.0, "p99": 0.0}
        d = RunCounters(self.algorithm).as_dict()
        d.update(
            live_matcher=Matcher(self.plan.live).stats(), pending_instances=0,
            delay_ms={"n": 0, "event": zero, "wall": zero}, backlog_events=0, requests_in_flight=0,
            in_flight_instances=0, errors=0, worker_late=0, cpu_s=0.0, requests_merged=0,
            close_to_commit_ms=zero, requests_answered=0, backlog_s=0.0, requests_waiting=0, caught_up=True,
            oldest_pending={"start_us": None, "since": None, "wait_s": 0.0},
        )
        return d


class WorkerSlot:
    """One worker of the pool: its queries, its current process (:class:`_Child`, started again when it dies) and
    the batches queued for it."""

    def __init__(self, pool: WorkerPool, index: int) -> None:
        self.pool = pool
        self.index = index
        self.queries: dict[int, PooledQuery] = {}
        self.child: _Child | None = None
        self.restarts = 0
        self.lock = threading.Lock()
        """Guards the queue counters, ``holding`` and ``held``."""
        self.holding = False
        """Restarting: batches wait in :attr:`held` until the replay is queued."""
        self.held: list[tuple[Any, int]] = []
        self.unsent = 0
        """Events queued for the worker, not yet piped (``held`` included)."""
        self.sent = 0
        self.unsent_at: collections.deque[float] = collections.deque()
        self._calls: dict[int, tuple[int, Callable[[], None]]] = {}
        self._call_ids = itertools.count(1)
        self._restart_lock = threading.Lock()

    # ------------------------------------------------------------------ queue

    def put(self, item: tuple[Any, ...], n: int) -> None:
        """Queue ``item`` (``n`` events) for the worker; held while it restarts. Never waits."""
        with self.lock:
            if n:
                self.unsent += n
                self.unsent_at.append(time.time())
            if self.holding or self.child is None:
                self.held.append((item, n))
            else:
                self.child.outbox.put((item, n))

    def backlog(self) -> int:
        """Events queued for the worker, not yet piped to it."""
        return self.unsent

    def call(self, query_id: int, fn: Callable[[], None]) -> None:
        token = next(self._call_ids)
        self._calls[token] = (query_id, fn)
        self.put(("call", query_id, token), 0)

    def request(self, kind: str, *args: Any) -> Future[Any]:
        child = self.child
        if child is None:
            fut: Future[Any] = Future()
            fut.set_exception(RemoteError("the worker is not running"))
            return fut
        return child.chan.request(kind, *args)

    def info(self) -> dict[str, Any]:
        """``worker`` in a query's stats: its index, process id, whether it is alive, its restarts."""
        child = self.child
        alive = child is not None and child.proc.is_alive()
        return {"index": self.index, "pid": child.proc.pid if child else None, "alive": alive,
                "restarts": self.restarts, "queries": len(self.queries)}

    # ------------------------------------------------------------------ process

    def spawn(self, generation: int) -> _Child:
        """Start a worker process (not yet fed: its outbox is filled by the caller)."""
        ctx = multiprocessing.get_context("spawn")
        mine, theirs = ctx.Pipe(duplex=True)
        proc = ctx.Process(
            target=child_main, args=(theirs, self.index, logging.getLogger().level),
            name=f"lace-worker-{self.index}", daemon=True,
        )
        proc.start()
        theirs.close()
        child = _Child(proc, Channel(mine), queue.SimpleQueue(), threading.Event(), generation)
        threading.Thread(target=self._send_loop, args=(child,), name=f"lace-worker-send-{self.index}",
                         daemon=True).start()
        threading.Thread(target=self._read_loop, args=(child,), name=f"lace-worker-read-{self.index}",
                         daemon=True).start()
        return child

    def stop(self) -> None:
        """Stop the process (service shut-down)."""
        child, self.child = self.child, None
        if child is None:
            return
        child.outbox.put(None)
        child.proc.join(timeout=5)
        if child.proc.is_alive():
            child.proc.terminate()
            child.proc.join(timeout=5)
        child.chan.conn.close()

    def _send_loop(self, child: _Child) -> None:
        while True:
            entry = child.outbox.get()
            if entry is None:
                try:
                    child.chan.send(("stop",))
                except (OSError, ValueError):
                    pass
                return
            item, n = entry
            try:
                if item[0] == "batch":
                    _, batch, upto, marks, at = item
                    child.chan.send(("batch", batch.encoded(), upto, marks, at))
                elif item[0] == "replay":
                    _, qid, batch = item
                    child.chan.send(("replay", qid, batch.encoded()))
                else:
                    child.chan.send(item)
            except (OSError, ValueError):
                return  # gone: the reader restarts it
            with self.lock:
                if self.child is child and n:
                    self.unsent -= n
                    self.sent += n
                    if self.unsent_at:
                        self.unsent_at.popleft()

    def _read_loop(self, child: _Child) -> None:
        chan = child.chan
        while True:
            try:
                msg = chan.conn.recv()
            except (EOFError, OSError):
                chan.fail_all()
                if self.child is child and not self.pool.closed:  # killed, or a query raised
                    child.proc.join(timeout=1)
                    self.pool.restart(self, child)
                return
            kind = msg[0]
            if kind == "reply":
                chan.resolve(msg[1], msg[2], msg[3])
            elif kind == "ack":  # in the pipe's order: each one at least as far as the one before
                q = self.queries.get(msg[1])
                if q is not None:
                    q.note_ack(msg[2], msg[3])
            elif kind == "ready":
                child.ready.set()
            elif kind == "failed":
                q = self.queries.get(msg[1])
                if q is not None:
                    q.failures += 1
                log.error("live-and-archived query %s raised in worker %d (pid %s); the worker restarts:\n%s",
                          q.name if q else msg[1], self.index, child.proc.pid, msg[2])
            elif kind == "rpc":
                _, rid, what, args = msg
                q = self.queries.get(args[0])
                if q is None:
                    chan.reply(rid, functools.partial(_gone, args[0]))
                elif what == "record":  # not on the Spark pool: a commit never waits behind a Spark job
                    self._record(chan, rid, q, args[1])
                elif what == "extract":  # to the shared scheduler: read together with other queries' requests
                    self._extract(chan, rid, q, *args[1:])
                else:
                    self.pool.spark_pool.submit(chan.reply, rid, functools.partial(self._archive, q, what, *args[1:]))
            elif kind == "called":
                entry = self._calls.pop(msg[1], None)
                if entry is not None:  # on a thread of its own: fn may ask the worker for stats
                    threading.Thread(target=entry[1], daemon=True).start()

    def _record(self, chan: Channel, rid: int, q: PooledQuery, docs: list[dict[str, Any]]) -> None:
        """Queue a query's results for the group commit; answered (their number, or the error) once committed."""
        done = self.pool.submit(q.query_id, [JsonMatch(d) for d in docs])
        done.add_done_callback(lambda f: chan.reply(rid, lambda: (f.result(), len(docs))[1]))

    def _extract(
        self, chan: Channel, rid: int, q: PooledQuery, types: list[str], keys: list[Any] | None, ranges: Any,
        key_attr: str | None, archived: bool,
    ) -> None:
        """Queue a query's archive request on the shared scheduler; its answer (the rows as Arrow IPC bytes, and
        the ``keep`` filter) is sent when the read that covers it is done."""
        pattern = q.plan.archived if archived else None
        request = Extract(tuple(types), None if keys is None else tuple(keys), ranges, key_attr, pattern)

        def answer(done: Future[Any]) -> None:
            def value() -> Any:
                table, keep = done.result()
                return (_to_ipc(table) if table is not None else None), keep

            chan.reply(rid, value)

        self.pool.scheduler.submit(request).add_done_callback(answer)

    def _archive(self, q: PooledQuery, what: str, *args: Any) -> Any:
        source = self.pool.source
        if what == "count":
            types, keys, rng, key_attr = args
            return source.count(types, keys, rng, key_attr=key_attr)
        if what == "selectivity":
            side, rng = args
            return source.selectivity(q.plan.live if side == "live" else q.plan.archived, rng)
        raise ValueError(f"unknown request {what!r}")


def _gone(query_id: int) -> Any:
    raise RuntimeError(f"query {query_id} no longer runs in this worker")


class WorkerPool:
    """The fixed pool of worker processes hosting every live-and-archived query (module docstring).

    Parameters
    ----------
    workers : int
        Worker processes (``LACE_WORKERS``).
    source : object
        The service's archive source; needs ``count`` and ``selectivity`` (OLLAA).
    spark_pool : ThreadPoolExecutor
        Where ``count`` and ``selectivity`` run (bounded, shared).
    scheduler : ArchiveScheduler
        Where ``extract`` requests go (one read answers the waiting requests of every query).
    submit : callable
        ``submit(query_id, matches) -> Future``: queue results for the group commit.
    lock : context manager
        The runtime's lock (held by ingest while it offers a batch): a restart takes it to cut the ingest order.
    position : callable
        ``position()``: the last ingest position offered (read under ``lock``).
    replay : callable
        ``replay(query_ids, upto) -> {query_id: (events, seqs)}``: what each of a restarted worker's queries needs
        again, from its acknowledged position up to position ``upto`` (:func:`service.live.recovery.worker_replay`).
    backlog : int
        Events queued in the service for one worker at most (``LACE_WORKER_BACKLOG``): ingest refuses past it.
    on_restart : callable, optional
        Called after each worker restart (a metrics counter).
    fault : str, optional
        ``LACE_WORKER_FAULT`` (tests): ``raise:<query name>:<n>``.
    """

    def __init__(
        self, *, workers: int, source: Any, spark_pool: ThreadPoolExecutor, scheduler: ArchiveScheduler,
        submit: Callable[[int, list[Any]], Future[None]], lock: Any, position: Callable[[], int | None],
        replay: Callable[[list[int], int | None], dict[int, tuple[list[Event], list[int | None]]]],
        backlog: int = WORKER_BACKLOG, on_restart: Callable[[], None] | None = None, fault: str | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("a pool needs at least one worker")
        self.slots = [WorkerSlot(self, i) for i in range(workers)]
        self.source = source
        self.spark_pool = spark_pool
        self.scheduler = scheduler
        self.submit = submit
        self.lock = lock
        self.position = position
        self.replay = replay
        self.bound = backlog
        self.on_restart = on_restart
        self.fault = _parse_fault(fault)
        self.slot_of: dict[int, WorkerSlot] = {}
        self.closed = False

    @property
    def restarts(self) -> int:
        """Worker restarts since the service started."""
        return sum(s.restarts for s in self.slots)

    def assign(self) -> WorkerSlot:
        """The worker a new query goes to: the one hosting the fewest queries, ties to the lowest index."""
        return min(self.slots, key=lambda s: (len(s.queries), s.index))

    def start(self, spec: ChildSpec, plan: LiveArchivedPlan) -> PooledQuery:
        """Host query ``spec.query_id`` on its worker (:meth:`assign`), started when it has none yet."""
        slot = self.assign()
        if self.fault is not None and self.fault[0] == spec.name and slot.restarts == 0:
            spec = replace(spec, fault_batch=self.fault[1])
        q = PooledQuery(slot, spec, plan)
        slot.queries[spec.query_id] = q
        self.slot_of[spec.query_id] = slot
        if slot.child is None:
            slot.child = slot.spawn(0)
            with slot.lock:  # anything queued before it existed
                held, slot.held = slot.held, []
                for entry in held:
                    slot.child.outbox.put(entry)
        slot.put(("add", spec), 0)
        return q

    def remove(self, query_id: int) -> None:
        """Stop hosting the query (its worker drops it)."""
        slot = self.slot_of.pop(query_id, None)
        if slot is None:
            return
        slot.queries.pop(query_id, None)
        slot.put(("remove", query_id), 0)

    def check_room(self) -> None:
        """Raise :class:`~service.live.feeds.WorkersBusy` when a worker's queue reached the bound (before ingest
        takes a request)."""
        for s in self.slots:
            if s.unsent >= self.bound:
                raise WorkersBusy(
                    f"live-and-archived worker {s.index} has {s.unsent} events queued (LACE_WORKER_BACKLOG "
                    f"{self.bound}){' while it restarts' if s.holding else ''}"
                )

    def offer(self, events: list[Event], seqs: Sequence[int | None], upto: int | None, marks: Marks) -> None:
        """One batch for every worker hosting a query in ``marks`` (each query's watermark and idleness): a queue
        append per worker; the batch is encoded once, by the first sender."""
        per: dict[int, Marks] = {}
        for qid, mark in marks.items():
            slot = self.slot_of.get(qid)
            if slot is not None:
                per.setdefault(slot.index, {})[qid] = mark
        if not per:
            return
        batch = Batch(events, seqs)
        at = time.time()
        for i, m in per.items():
            self.slots[i].put(("batch", batch, upto, m, at), len(events))

    def restart(self, slot: WorkerSlot, dead: _Child) -> None:
        """The worker's process ``dead`` exited: start it again on a thread of its own (:meth:`_restart`)."""
        threading.Thread(target=self._restart, args=(slot, dead), name=f"lace-worker-restart-{slot.index}",
                         daemon=True).start()

    def _restart(self, slot: WorkerSlot, dead: _Child) -> None:
        with slot._restart_lock:
            if slot.child is not dead or self.closed:
                return
            log.error(
                "live-and-archived worker %d (pid %s) exited (code %s); restarting it with its %d queries",
                slot.index, dead.proc.pid, dead.proc.exitcode, len(slot.queries),
            )
            with self.lock:  # between two ingest batches: what is offered from now on waits for the replay
                with slot.lock:
                    slot.holding = True
                    slot.unsent = sum(n for _, n in slot.held)
                    slot.unsent_at = collections.deque(time.time() for _, n in slot.held if n)
                upto = self.position()
                queries = list(slot.queries.values())
            slot.restarts += 1
            if self.on_restart is not None:
                self.on_restart()
            child = slot.spawn(dead.generation + 1)
            with slot.lock:
                slot.child = child
            for q in queries:
                spec = q.spec
                if q.failures >= MAX_QUERY_FAILURES:
                    spec = replace(spec, failed=f"it raised {q.failures} times in its worker (see the service log)")
                child.outbox.put((("add", spec), 0))
            try:
                again = self.replay([q.query_id for q in queries], upto)
            except Exception:  # the archive could not be read: the queries go on from here (logged as a loss)
                log.exception("worker %d: the replay of its queries failed; results may be missing", slot.index)
                again = {}
            for qid, (events, seqs) in again.items():
                if events:
                    child.outbox.put((("replay", qid, Batch(events, seqs)), 0))
            for token, (qid, _) in list(slot._calls.items()):  # calls the dead process never answered
                child.outbox.put((("call", qid, token), 0))
            with self.lock:
                with slot.lock:
                    for entry in slot.held:
                        child.outbox.put(entry)
                    slot.held = []
                    slot.holding = False
            log.info("worker %d restarted (pid %s): %d events replayed", slot.index, child.proc.pid,
                     sum(len(e) for e, _ in again.values()))

    def close(self) -> None:
        """Stop every worker (service shut-down)."""
        self.closed = True
        for s in self.slots:
            s.stop()

    def stats(self) -> dict[str, Any]:
        """The pool's counters: per worker its index, pid, liveness, restarts and queries."""
        return {"mode": "pool", "workers": [s.info() for s in self.slots], "restarts": self.restarts}


def _parse_fault(spec: str | None) -> tuple[str, int] | None:
    """``raise:<query name>:<n>`` -> (name, n)."""
    if not spec:
        return None
    kind, _, rest = spec.partition(":")
    name, _, n = rest.rpartition(":")
    if kind != "raise" or not name or not n.isdigit():
        raise ValueError(f"LACE_WORKER_FAULT={spec!r}: expected raise:<query name>:<n>")
    return name, int(n)


def _to_ipc(table: Any) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


# ---------------------------------------------------------------------------------------- worker side


class RemoteSource:
    """The child's :class:`engine.live_archived.source.ArchiveSource`: requests answered by the service's Spark."""

    def __init__(self, chan: Channel, plan: LiveArchivedPlan, query_id: int) -> None:
        self.chan = chan
        self.plan = plan
        self.query_id = query_id
        self.memo_of: Callable[[], ArchivedMemo | None] = lambda: None
        """The runner's memo of archived events (:class:`engine.live_archived.memo.ArchivedMemo`): rows it knows
        are not turned into events again. Set by :func:`child_main` once the worker exists."""

    def extract(
        self, types: Iterable[str], keys: Iterable[Hashable] | None, ranges: Ranges, *, key_attr: str | None = None,
        pattern: Any = None,
    ) -> list[Event]:
        """One archive request in the service; the Arrow rows become events here (only the requested keys).

        ``pattern``: the plan's archived side, or None (another pattern is not sent: no filter).
        """
        import pyarrow as pa

        from archive.archived_source import keep_requested
        from archive.schema import output_to_events

        rs: Any = {k: list(v) for k, v in ranges.items()} if isinstance(ranges, dict) else list(ranges)
        data, keep = self.chan.request(
            "extract", self.query_id, list(types), None if keys is None else list(keys), rs, key_attr,
            pattern is self.plan.archived,
        ).result()
        if data is None:
            return []
        table = pa.ipc.open_stream(data).read_all()
        memo = self.memo_of() if pattern is self.plan.archived else None
        events = output_to_events(table) if memo is None else rows_to_events(table, memo)
        return events if keep is None else keep_requested(events, keep, key_attr)

    def count(
        self, types: Iterable[str], keys: Iterable[Hashable] | None, range: Range, *, key_attr: str | None = None
    ) -> int:
        return int(
            self.chan.request(
                "count", self.query_id, list(types), None if keys is None else list(keys), range, key_attr
            ).result()
        )

    def selectivity(self, query: Any, range: Range) -> float:
        side = "live" if query is self.plan.live else "archived"
        return float(self.chan.request("selectivity", self.query_id, side, range).result())


def rows_to_events(table: Any, memo: ArchivedMemo) -> list[Event]:
    """Output-shaped rows (``archive.schema.output_to_events``'s) as events, in row order: the events ``memo``
    remembers by ``(type, id, ts_end)`` as they are (consecutive requests of a query bring mostly the same rows,
    issue 25), the others converted."""
    from archive.schema import output_to_events

    cols = table.column_names
    types, ids, starts = (table.column(c).to_pylist() for c in ("type", "id", "ts"))
    ends = table.column("ts_end").to_pylist() if "ts_end" in cols else starts
    known = memo.known([(t, i, s if e is None else e) for t, i, s, e in zip(types, ids, starts, ends)])
    missing = [n for n, e in enumerate(known) if e is None]
    converted = iter(output_to_events(table.take(missing)) if missing else ())
    return [next(converted) if e is None else e for e in known]


def warm_answers() -> None:
    """Import what the child's first archive answer needs (:meth:`RemoteSource.extract`: pyarrow, its IPC reader,
    ``archive.schema``, and pandas, which pyarrow imports on its first conversion from Python objects, here the
    ``take`` of :func:`rows_to_events`), so the child does it while it starts, before it reports ready.

    Without it every query process paid the import at its first answer: with ten queries all at once, at the start
    of the stream (issue 25's (b): ~18 % of an SLLAA process's GIL samples over its first minute, on a slow machine;
    ~0.5 s of CPU per process on a quiet one)."""
    import pyarrow as pa
    import pyarrow.ipc  # noqa: F401

    import archive.schema  # noqa: F401

    pa.array([0]).take(pa.array([0]))


def child_main(conn: Connection, index: int, log_level: int) -> None:
    """A worker process: host the queries the service adds, feed them each batch through one index by event type,
    serve the pipe until it closes.

    It ignores SIGINT and SIGTERM: a terminal's Ctrl-C, ``kill -TERM -PGID`` or systemd signal the whole process
    group, and the service, shutting down cleanly, stops its workers itself (``stop``). A service killed outright
    closes the pipe: the worker exits then. A query that raises ends the worker (``("failed", query_id, text)``,
    exit code 70) before it acknowledges the batch: the service restarts it and replays."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format=f"%(asctime)s lace-worker-{index} %(levelname)s %(message)s")
    from service.core.gc_tuning import tune

    tune()  # a large long-lived heap (the memos), many short-lived objects: fewer full collections
    warm_answers()
    from service.live.live_archived import ArchiveLookups, LiveArchivedWorker

    chan = Channel(conn)
    feeds = Feeds()
    workers: dict[int, LiveArchivedWorker] = {}
    lookups: ArchiveLookups | None = None
    control = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lace-worker-control")

    def failed(query_id: int, err: BaseException) -> None:
        text = "".join(traceback.format_exception(err))
        try:
            chan.send(("failed", query_id, text))
        finally:
            os._exit(70)

    chan.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break  # the service is gone
        kind = msg[0]
        if kind == "batch":
            _, data, upto, marks, at = msg
            events, seqs, index_ = decode_batch(data)
            feeds.offer(events, seqs, upto, marks, at, index_)
        elif kind == "replay":
            w = workers.get(msg[1])
            if w is not None:
                events, seqs, _ = decode_batch(msg[2])
                w.offer(events, None, seqs=seqs)
        elif kind == "reply":
            chan.resolve(msg[1], msg[2], msg[3])
        elif kind == "rpc":
            _, rid, what, args = msg
            w = workers.get(args[0])
            if w is None:
                chan.reply(rid, functools.partial(_gone, args[0]))
            elif what == "settle":  # not on the control thread: stats are asked meanwhile
                threading.Thread(target=chan.reply, args=(rid, functools.partial(w.settle, *args[1:])),
                                 daemon=True).start()
            else:
                control.submit(chan.reply, rid, w.stats)
        elif kind == "call":
            _, qid, token = msg
            w = workers.get(qid)
            if w is None:
                chan.send(("called", token))
            else:
                w.call(functools.partial(chan.send, ("called", token)))
        elif kind == "add":
            spec: ChildSpec = msg[1]
            if lookups is None:  # one thread per request in flight, shared by the worker's queries
                lookups = ArchiveLookups(spec.requests_in_flight, mergeable_in_flight=spec.mergeable_in_flight)
            w = _start_query(chan, spec, lookups, failed)
            workers[spec.query_id] = w
            feeds.add(spec.query_id, w.plan.stream_types, w)
        elif kind == "remove":
            feeds.remove(msg[1])
            w = workers.pop(msg[1], None)
            if w is not None:
                threading.Thread(target=w.stop, daemon=True).start()
        elif kind == "stop":
            break
    for w in workers.values():
        w.stopped = True
    chan.fail_all()
    os._exit(0)  # daemon threads may wait on the pipe or the pool: leave at once


def _start_query(
    chan: Channel, spec: ChildSpec, lookups: Any, failed: Callable[[int, BaseException], None]
) -> Any:
    """Build one query's :class:`LiveArchivedWorker` in the worker (its runner, remote archive source, results
    and acknowledgements over the pipe)."""
    from engine.detector import make_detector
    from service.live.live_archived import LiveArchivedWorker

    plan = LiveArchivedPlan(spec.ast, spec.schemas)
    source = RemoteSource(chan, plan, spec.query_id)
    pm_store = None
    if spec.pm_store_url is not None and spec.pm_capacity is not None:
        from service.db.pm_store import SqlPartialMatchStore

        pm_store = SqlPartialMatchStore(spec.pm_store_url, migrate=False)

    def make_runner(defer: Any) -> Any:
        return make_detector(
            plan, source=source, algorithm=spec.algorithm, tolerance_us=spec.tolerance_us,
            allowed_lateness_us=spec.allowed_lateness_us, defer=defer, pm_capacity=spec.pm_capacity,
            pm_policy=spec.pm_policy or "stpm", pm_store=pm_store, pm_query_id=spec.pm_query_id,
            known_ranges=spec.known_ranges,
        )

    def record(query_id: int, matches: list[Match]) -> None:
        chan.request("record", query_id, [m.to_json() for m in matches]).result()  # raises: the worker retries

    def ack(last_seq: int, need: int) -> None:
        try:
            chan.send(("ack", spec.query_id, last_seq, need))
        except (OSError, ValueError):
            pass  # the service is gone

    worker = LiveArchivedWorker(
        query_id=spec.query_id, name=spec.name, plan=plan, make_runner=make_runner, lookups=lookups,
        record=record, lateness_us=spec.lateness_us, on_ack=ack,
        on_error=functools.partial(failed, spec.query_id), fault_batch=spec.fault_batch,
    )
    worker.failed = spec.failed
    source.memo_of = lambda: getattr(worker.runner, "archived_memo", None)
    return worker


__all__ = [
    "ChildSpec", "PooledQuery", "RemoteSource", "WorkerPool", "child_main", "decode_batch", "default_workers",
    "encode_batch", "warm_answers",
]
