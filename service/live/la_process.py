"""A live-and-archived query in a process of its own: no GIL shared with ingest (issue 12).

:class:`ProcessWorker` offers the service what :class:`~service.live.live_archived.LiveArchivedWorker`
offers (``offer``, ``call``, ``stop``, ``acked``, ``stats``) and runs that very worker, the
query's runner (ALAA, LLAA, OLLAA or SLLAA, 001 section 4) and its deferred archive requests in a
child process started with the ``spawn`` context (no fork of a process that holds a JVM gateway,
SQLite connections and threads). What stays in the service process:

- **Spark.** The Spark session lives in the service; the child asks for archived events with an
  ``extract`` message, the service's shared scheduler (:mod:`service.live.archive_scheduler`) reads it
  together with the other queries' waiting requests of the same types (at most ``LACE_LA_LOOKUP_WORKERS``
  reads at once; a Spark job, or an Arrow read of a small request, with the rows failing a one-event
  ``P_A``'s WHERE left out; each request gets exactly its own rows) and answers with the Arrow
  table as IPC bytes; the child turns rows into events (``archive.schema.output_to_events``), matches ``P_A`` and
  joins, on its own CPU. ``count`` and ``selectivity`` (OLLAA's statistics) go the same way.
- **Requests in flight.** A query's requests all wait at the scheduler together, so one read answers many of
  them (issue 25: LLAA makes one request per live instance; with two at a time, reads answered 1.7 requests
  each and LLAA fell minutes behind). The child's :class:`~service.live.live_archived.ArchiveLookups` has one
  thread per request in flight, up to ``requests_in_flight`` (:data:`REQUESTS_IN_FLIGHT`, 256: the scheduler's
  ``MAX_BATCH``); a later request waits in the child until a thread is free, none is dropped. Mergeable
  requests (SLLAA subwindows) keep their own bound (``mergeable_in_flight``, ``LACE_LA_LOOKUP_WORKERS``): the
  subwindows that close while those run are merged into one request, as before. Why threads and
  not a future completed by the read loop: an algorithm's answer (:class:`engine.live_archived.base.ArchiveWork`:
  request, then ``P_A`` matching and the joins) is one synchronous call, the same the in-thread worker and the
  engine run; splitting it into a request and a continuation would change every algorithm for what a blocked
  thread gives (no CPU, a stack; the pool starts them only as requests wait). The guarantees are the worker's:
  a request's results are committed before its live instances leave the query's ledger (so no acknowledged
  position passes them),
  whatever order the answers come back in (each instance's join is its own); a failed read raises in its
  thread, which retries as before. The scheduler still bounds the real reads (``LACE_LA_LOOKUP_WORKERS``).
- **Results.** The child sends each batch of results (``Match.to_json()`` documents) with a
  ``record`` message and waits for the answer: the service commits them with their outbox rows in
  one transaction, shared with the other queries' results waiting then (:meth:`service.live.results.Results.submit`,
  a group commit; de-duplicated by (query, event ids)) before
  the child forgets the request, so no acknowledged position passes an uncommitted result and a
  SIGKILL loses nothing (the restart replays from there; duplicates are dropped).
- **Positions.** The child acknowledges with an ``("ack", last_seq, need)`` message after each batch it matched
  and each request whose results were committed (:meth:`LiveArchivedWorker._ack`: the last ingest position it
  matched and the smallest its unfinished work needs, from the query's ledger); the service keeps the last one
  (:attr:`ProcessWorker.acked`) and the checkpoint writes it. The service never asks the child for a position,
  so a busy or starting child cannot be read as "nothing pending": its last acknowledgement stands.

Ingest hands a batch over with a queue append (:meth:`ProcessWorker.offer`); a sender thread pickles
it as ``(id, type, ts, attrs)`` tuples onto the pipe, with the events' ingest positions. Messages are tuples, the
first item their kind;
requests carry an id and get a ``("reply", id, ok, value)``. The child exits when the pipe closes
(the service stopped or was killed); it ignores SIGINT and SIGTERM (a signal to the process group):
the service stops it on purpose when it shuts down.
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
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from archive.archived_source import Extract
from engine.events import Event
from engine.live_archived.memo import ArchivedMemo
from engine.live_archived.plan import LiveArchivedPlan, Range
from engine.live_archived.source import Ranges
from engine.match import Match
from service.live.archive_scheduler import MAX_BATCH, ArchiveScheduler

log = logging.getLogger(__name__)

STATS_TIMEOUT_S = 1.0
"""How long ``stats`` waits for the child before answering with the last counters (positions never wait: they
come from the child's acknowledgements, :attr:`ProcessWorker.acked`)."""
REQUESTS_IN_FLIGHT = MAX_BATCH
"""Default bound on one query's archive requests at the scheduler at once (:attr:`ChildSpec.requests_in_flight`):
the scheduler's ``MAX_BATCH``, so one query alone can fill a read."""


@dataclass(slots=True)
class ChildSpec:
    """What the child needs to build the query's runner (everything picklable).

    Attributes
    ----------
    query_id, name : the query's id and name
    ast : the query's syntax tree (``LiveArchivedPlan.ast``); the child compiles it again with ``schemas``
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
        SQLAlchemy URL of the partial-match store (the child opens its own connection).
    requests_in_flight : int
        Archive requests of this query at the service's scheduler at once (``LACE_LA_REQUESTS_IN_FLIGHT``,
        default :data:`REQUESTS_IN_FLIGHT`); the query's later requests wait in the child, in order, until
        an answer comes back (none is dropped). The child's lookup pool has this many threads.
    mergeable_in_flight : int
        Of those, mergeable ones (SLLAA subwindows) at once (``LACE_LA_LOOKUP_WORKERS``, as when the child had that
        many lookup threads): subwindows that close meanwhile wait and become one request over their union.
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


# ---------------------------------------------------------------------------------------- service side


class ProcessWorker:
    """The service's handle on a live-and-archived query running in a child process (module docstring).

    Parameters
    ----------
    spec : ChildSpec
    plan : LiveArchivedPlan
        The service's own compiled plan (for OLLAA's ``selectivity`` of ``plan.live``/``plan.archived``).
    source : object
        The service's archive source; needs ``extract_table`` (``archive.archived_source``), ``count``
        and ``selectivity``.
    spark_pool : ThreadPoolExecutor
        Where OLLAA's ``count`` and ``selectivity`` run (bounded, shared by all queries).
    scheduler : ArchiveScheduler
        Where ``extract`` requests go: one read answers the waiting requests of every query
        (:mod:`service.live.archive_scheduler`, issue 25).
    submit : callable
        ``submit(query_id, matches) -> Future``: queues results to be committed (alerts + outbox,
        :meth:`service.live.results.Results.submit`); the future is done once they are committed, or fails.
    """

    def __init__(
        self,
        *,
        spec: ChildSpec,
        plan: LiveArchivedPlan,
        source: Any,
        spark_pool: ThreadPoolExecutor,
        scheduler: ArchiveScheduler,
        submit: Callable[[int, list[Any]], Future[None]],
    ) -> None:
        self.query_id = spec.query_id
        self.name = spec.name
        self.algorithm = spec.algorithm
        self.plan = plan
        self.ready = threading.Event()
        """Set when the child has built its runner and answers requests."""
        self.source = source
        self.spark_pool = spark_pool
        self.scheduler = scheduler
        self.submit = submit
        self.stopped = False
        self.unsent = 0
        self.sent = 0
        """Events piped to the child so far."""
        self._unsent_lock = threading.Lock()
        self._unsent_at: collections.deque[float] = collections.deque()
        """When each batch not yet piped to the child was offered (wall seconds), oldest first."""
        self._last_stats: dict[str, Any] = {}
        self._answered_sent = 0
        """:attr:`sent` when the child was asked for ``_last_stats`` (the pipe is in order: it had read them)."""
        self.acked: tuple[int, int] | None = None
        """The child's last acknowledgement (:meth:`LiveArchivedWorker._ack`): (the last ingest position it
        matched, the smallest position its unfinished work needs); None until it has sent one. Only what the child
        said: while it is busy, starting or gone, the last one stands."""
        self._calls: dict[int, Callable[[], None]] = {}
        self._call_ids = itertools.count(1)
        self._outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        ctx = multiprocessing.get_context("spawn")
        mine, theirs = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=child_main, args=(theirs, spec), name=f"lace-la-{spec.query_id}", daemon=True)
        self.proc.start()
        theirs.close()
        self.chan = Channel(mine)
        self._sender = threading.Thread(target=self._send_loop, name=f"lace-la-send-{spec.query_id}", daemon=True)
        self._reader = threading.Thread(target=self._read_loop, name=f"lace-la-read-{spec.query_id}", daemon=True)
        self._sender.start()
        self._reader.start()

    # ------------------------------------------------------------------ what the runtime calls

    def offer(
        self, events: list[Event], watermark_us: int | None, *, seqs: Sequence[int | None] | None = None,
        upto: int | None = None, idle: bool = False,
    ) -> None:
        """Hand over accepted events (already archived) with their ingest positions ``seqs``, the query's watermark
        and whether its types are all idle or ended (see :meth:`LiveArchivedWorker.offer`): a queue append."""
        at = time.time()
        with self._unsent_lock:
            self.unsent += len(events)
            self._unsent_at.append(at)
        self._outbox.put((events, seqs, upto, watermark_us, at, idle))

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` (on a thread of the service) once the child has matched everything offered before it."""
        token = next(self._call_ids)
        self._calls[token] = fn
        self._outbox.put(("call", token))

    def settle(self, timeout_s: float) -> bool:
        """See :meth:`LiveArchivedWorker.settle` (run by the child once it has matched what was offered before;
        False also when the child is gone)."""
        deadline = time.monotonic() + timeout_s
        matched = threading.Event()
        self.call(matched.set)  # the events go through the sender thread: the request must come after them
        if not matched.wait(timeout_s):
            return False
        try:
            left = max(0.0, deadline - time.monotonic())
            return bool(self.chan.request("settle", left).result(timeout=left + STATS_TIMEOUT_S))
        except Exception:  # noqa: BLE001 - gone or too slow: not settled
            return False

    def stop(self) -> None:
        """Stop the child (requests in flight are abandoned: a restart replays them)."""
        if self.stopped:
            return
        self.stopped = True
        self._outbox.put(None)
        self._sender.join(timeout=5)
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=5)
        self.chan.conn.close()

    def stats(self) -> dict[str, Any]:
        """The child's :meth:`LiveArchivedWorker.stats`; ``backlog_events`` includes events not sent yet and,
        while the child is starting or too busy to answer (the last counters stand), those piped to it since."""
        d = self._last_stats or self._empty_stats()
        if self.ready.is_set():  # before: the child is still starting (registering never waits for it)
            asked = self.sent
            try:
                d = self._last_stats = self.chan.request("stats").result(timeout=STATS_TIMEOUT_S)
                self._answered_sent = asked
            except Exception:  # noqa: BLE001 - busy or gone: the last counters
                pass
        d = dict(d)
        with self._unsent_lock:
            waiting = self.unsent + self.sent - self._answered_sent
            oldest = self._unsent_at[0] if self._unsent_at else None
        d["backlog_events"] = d.get("backlog_events", 0) + waiting
        if waiting and oldest is not None:
            d["backlog_s"] = round(max(float(d.get("backlog_s", 0.0)), time.time() - oldest), 3)
        d["caught_up"] = bool(d.get("caught_up", False)) and d["backlog_events"] == 0
        d["process"] = {"pid": self.proc.pid, "alive": self.proc.is_alive()}
        return d

    def _empty_stats(self) -> dict[str, Any]:
        """The counters of a worker that has seen nothing yet (the child is starting)."""
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

    # ------------------------------------------------------------------ threads

    def _send_loop(self) -> None:
        while True:
            item = self._outbox.get()
            if item is None:
                try:
                    self.chan.send(("stop",))
                except (OSError, ValueError):
                    pass
                return
            try:
                if item[0] == "call":
                    self.chan.send(item)
                    continue
                events, seqs, upto, wm, at, idle = item
                self.chan.send(("events", encoded_rows(events), seqs, upto, wm, at, idle))
                with self._unsent_lock:
                    self.unsent -= len(events)
                    self.sent += len(events)
                    self._unsent_at.popleft()
            except (OSError, ValueError):
                log.error("live-and-archived query %s: its process is gone", self.name)
                return

    def _read_loop(self) -> None:
        chan = self.chan
        while True:
            try:
                msg = chan.conn.recv()
            except (EOFError, OSError):
                chan.fail_all()
                if not self.stopped:  # not stopped on purpose (:meth:`stop`): killed, or it crashed
                    self.proc.join(timeout=1)  # its exit code (None until it is reaped)
                    if not self.stopped:
                        log.error("live-and-archived query %s: its process exited (code %s)", self.name,
                                  self.proc.exitcode)
                return
            kind = msg[0]
            if kind == "reply":
                chan.resolve(msg[1], msg[2], msg[3])
            elif kind == "ack":  # in the pipe's order: each one at least as far as the one before
                self.acked = (msg[1], msg[2])
            elif kind == "ready":
                self.ready.set()
            elif kind == "rpc":
                _, rid, what, args = msg
                if what == "record":  # not on the Spark pool: a commit never waits behind a Spark job
                    self._record(rid, *args)
                elif what == "extract":  # to the shared scheduler: read together with other queries' requests
                    self._extract(rid, *args)
                else:
                    self.spark_pool.submit(chan.reply, rid, functools.partial(self._archive, what, *args))
            elif kind == "called":
                fn = self._calls.pop(msg[1], None)
                if fn is not None:  # on a thread of its own: fn may ask the child for its stats
                    threading.Thread(target=fn, daemon=True).start()

    def _record(self, rid: int, docs: list[dict[str, Any]]) -> None:
        """Queue the child's results (request ``rid``) for the group commit; answered (the number of results, or
        the error) once they are committed."""
        done = self.submit(self.query_id, [JsonMatch(d) for d in docs])
        done.add_done_callback(lambda f: self.chan.reply(rid, lambda: (f.result(), len(docs))[1]))

    def _extract(
        self, rid: int, types: list[str], keys: list[Any] | None, ranges: Any, key_attr: str | None, archived: bool
    ) -> None:
        """Queue the child's archive request ``rid`` on the shared scheduler; its answer (the rows as Arrow IPC
        bytes, and the ``keep`` filter) is sent when the read that covers it is done."""
        pattern = self.plan.archived if archived else None  # the child's P_A is this plan's
        request = Extract(tuple(types), None if keys is None else tuple(keys), ranges, key_attr, pattern)

        def answer(done: Future[Any]) -> None:
            def value() -> Any:
                table, keep = done.result()
                return (_to_ipc(table) if table is not None else None), keep

            self.chan.reply(rid, value)

        self.scheduler.submit(request).add_done_callback(answer)

    def _archive(self, what: str, *args: Any) -> Any:
        if what == "count":
            types, keys, rng, key_attr = args
            return self.source.count(types, keys, rng, key_attr=key_attr)
        if what == "selectivity":
            side, rng = args
            return self.source.selectivity(self.plan.live if side == "live" else self.plan.archived, rng)
        raise ValueError(f"unknown request {what!r}")


_ENCODED_KEPT = 32
_encoded: collections.OrderedDict[int, tuple[list[Event], bytes]] = collections.OrderedDict()
_encoded_lock = threading.Lock()


def encoded_rows(events: list[Event]) -> bytes:
    """``events`` as the pickled ``(id, type, ts, attrs, ts_end)`` tuples a child's ``events`` message carries.

    Pickled once per batch, whatever the number of query processes it goes to: ingest hands every query that
    reads all of a batch's types the same list (:meth:`service.live.run.WorkerRun.offer`), and the last
    :data:`_ENCODED_KEPT` lists' bytes are kept (with the lists, so an ``id`` is not reused meanwhile). With ten
    queries, building and pickling the tuples per query was 11 % of the service's CPU (issue 25)."""
    with _encoded_lock:
        hit = _encoded.get(id(events))
        if hit is not None and hit[0] is events:
            return hit[1]
    data = pickle.dumps([(e.id, e.type, e.ts, e.attrs, e.ts_end) for e in events], protocol=pickle.HIGHEST_PROTOCOL)
    with _encoded_lock:
        _encoded[id(events)] = (events, data)
        while len(_encoded) > _ENCODED_KEPT:
            _encoded.popitem(last=False)
    return data


def _to_ipc(table: Any) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


# ---------------------------------------------------------------------------------------- child side


class RemoteSource:
    """The child's :class:`engine.live_archived.source.ArchiveSource`: requests answered by the service's Spark."""

    def __init__(self, chan: Channel, plan: LiveArchivedPlan) -> None:
        self.chan = chan
        self.plan = plan
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
            "extract", list(types), None if keys is None else list(keys), rs, key_attr, pattern is self.plan.archived
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
            self.chan.request("count", list(types), None if keys is None else list(keys), range, key_attr).result()
        )

    def selectivity(self, query: Any, range: Range) -> float:
        side = "live" if query is self.plan.live else "archived"
        return float(self.chan.request("selectivity", side, range).result())


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


def child_main(conn: Connection, spec: ChildSpec) -> None:
    """The child process: build the runner and a :class:`LiveArchivedWorker`, serve the pipe until it closes.

    It ignores SIGINT and SIGTERM: a terminal's Ctrl-C, ``kill -TERM -PGID`` or systemd signal the whole
    process group, and the service, shutting down cleanly, stops its children itself (``stop``), so they
    are not reported as gone. A service killed outright closes the pipe: the child exits then."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=spec.log_level, format=f"%(asctime)s lace-la-{spec.query_id} %(levelname)s %(message)s")
    from service.core.gc_tuning import tune

    tune()  # a large long-lived heap (the memo), many short-lived objects: fewer full collections
    warm_answers()
    from engine.detector import make_detector
    from service.live.live_archived import ArchiveLookups, LiveArchivedWorker

    chan = Channel(conn)
    plan = LiveArchivedPlan(spec.ast, spec.schemas)
    source = RemoteSource(chan, plan)
    pm_store = None
    if spec.pm_store_url is not None and spec.pm_capacity is not None:
        from service.db.pm_store import SqlPartialMatchStore

        pm_store = SqlPartialMatchStore(spec.pm_store_url, migrate=False)

    def make_runner(defer: Any) -> Any:
        return make_detector(
            plan,
            source=source,
            algorithm=spec.algorithm,
            tolerance_us=spec.tolerance_us,
            allowed_lateness_us=spec.allowed_lateness_us,
            defer=defer,
            pm_capacity=spec.pm_capacity,
            pm_policy=spec.pm_policy or "stpm",
            pm_store=pm_store,
            pm_query_id=spec.pm_query_id,
        )

    def record(_query_id: int, matches: list[Match]) -> None:
        chan.request("record", [m.to_json() for m in matches]).result()  # raises: the worker retries

    def ack(last_seq: int, need: int) -> None:
        try:
            chan.send(("ack", last_seq, need))
        except (OSError, ValueError):
            pass  # the service is gone

    lookups = ArchiveLookups(  # one thread per request in flight (module docstring)
        spec.requests_in_flight, mergeable_in_flight=spec.mergeable_in_flight
    )
    worker = LiveArchivedWorker(
        query_id=spec.query_id,
        name=spec.name,
        plan=plan,
        make_runner=make_runner,
        lookups=lookups,
        record=record,
        lateness_us=spec.lateness_us,
        on_ack=ack,
    )
    source.memo_of = lambda: getattr(worker.runner, "archived_memo", None)
    control = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lace-la-control")
    chan.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break  # the service is gone
        kind = msg[0]
        if kind == "events":
            _, rows, seqs, upto, wm, at, idle = msg
            worker.offer([Event(*r) for r in pickle.loads(rows)], wm, seqs=seqs, upto=upto, offered_at=at, idle=idle)
        elif kind == "reply":
            chan.resolve(msg[1], msg[2], msg[3])
        elif kind == "rpc":
            _, rid, what, args = msg
            if what == "settle":  # not on the control thread: stats are asked meanwhile
                threading.Thread(target=chan.reply, args=(rid, functools.partial(worker.settle, *args)),
                                 daemon=True).start()
                continue
            control.submit(chan.reply, rid, worker.stats)
        elif kind == "call":
            worker.call(functools.partial(chan.send, ("called", msg[1])))
        elif kind == "stop":
            break
    worker.stopped = True
    chan.fail_all()
    os._exit(0)  # daemon threads may wait on the pipe or the pool: leave at once


__all__ = ["ChildSpec", "ProcessWorker", "RemoteSource", "child_main", "warm_answers"]
