"""The live-and-archived worker pool (service/live/la_process.py): one query in a worker process, what its stats say
while the worker is busy, its archive requests and acknowledgements; the batch's columnar encoding."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from engine.detector import compile, make_detector
from engine.events import Event
from engine.live_archived.plan import LiveArchivedPlan
from engine.live_archived.source import MemoryArchive
from service.live.archive_scheduler import ArchiveScheduler
from service.live.la_process import ChildSpec, PooledQuery, WorkerPool
from service.live.live_archived import ArchiveLookups, LiveArchivedWorker

TEXT = """NAME a_then_b
LIVE PATTERN SEQ(pass p) WHERE p.at = 'B'
ARCHIVED PATTERN SEQ(pass q) WHERE q.at = 'A'
LOOKBACK 1 hour
JOIN p.car = q.car
"""


class PoolQuery:
    """One query in a pool of one worker process, as these tests drive it: batches offered with its watermark."""

    def __init__(self, spec: ChildSpec, plan: LiveArchivedPlan, source: Any, scheduler: Any, submit: Any) -> None:
        self.spark = ThreadPoolExecutor(max_workers=1)
        self.pool = WorkerPool(
            workers=1, source=source, spark_pool=self.spark, scheduler=scheduler, submit=submit,
            lock=threading.RLock(), position=lambda: None, replay=lambda ids, upto: {},
        )
        self.q: PooledQuery = self.pool.start(spec, plan)
        self.slot = self.q.slot

    def offer(self, events: list[Event], watermark_us: int | None, *, seqs: list[int] | None = None) -> None:
        self.pool.offer(events, seqs if seqs is not None else [None] * len(events), None,
                        {self.q.query_id: (watermark_us, False)})

    @property
    def ready(self) -> threading.Event:
        assert self.slot.child is not None
        return self.slot.child.ready

    @property
    def unsent(self) -> int:
        return self.slot.unsent

    @property
    def acked(self) -> tuple[int, int] | None:
        return self.q.acked

    def stats(self) -> dict[str, Any]:
        return self.q.stats()

    def stop(self) -> None:
        self.pool.close()
        self.spark.shutdown()


def _done(_: Any = None) -> Future[None]:
    """A committed submission (what :meth:`service.live.results.Results.submit` gives once it committed)."""
    fut: Future[None] = Future()
    fut.set_result(None)
    return fut


def _sllaa_process_worker() -> tuple[PoolQuery, ThreadPoolExecutor]:
    """``a_then_b`` under SLLAA (T_L 1 hour) in a query process over an empty archive, and its Spark pool."""
    plan = compile(TEXT, {"pass": {"car": "int", "at": "string"}})
    assert isinstance(plan, LiveArchivedPlan)
    spec = ChildSpec(
        query_id=1, name="a_then_b", ast=plan.ast, schemas={"pass": {"car": "int", "at": "string"}},
        algorithm="sllaa", tolerance_us=3_600_000_000, allowed_lateness_us={}, lateness_us=0,
    )  # fmt: skip
    pool = ThreadPoolExecutor(max_workers=1)
    worker = PoolQuery(spec, plan, MemoryArchive(), ArchiveScheduler(MemoryArchive(), 1), lambda q, m: _done())
    return worker, pool


def test_events_sent_to_a_child_not_yet_answering_count_as_backlog() -> None:
    """Right after a (re)start the child is still spawning; the events already piped to it are not processed.
    Its stats must not read as idle then (they did: the piped events left the service's count, and the child's
    stats were the empty ones), or a caller that waits for idle (a restart's catch-up, a test) stops early."""
    worker, pool = _sllaa_process_worker()
    try:
        events = [Event(i, "pass", i * 1_000_000, {"car": i, "at": "C"}) for i in range(1, 51)]
        worker.offer(events, None)
        deadline = time.monotonic() + 5
        while worker.unsent and time.monotonic() < deadline:
            time.sleep(0.001)
        assert worker.unsent == 0  # piped to the child
        if not worker.ready.is_set():  # the child is still starting: nothing of the 50 is processed
            assert worker.stats()["backlog_events"] == 50
        deadline = time.monotonic() + 60
        while worker.stats()["backlog_events"] and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = worker.stats()
        assert worker.ready.is_set() and stats["backlog_events"] == 0 and stats["live_events"] == 50
    finally:
        worker.stop()
        pool.shutdown()


def test_the_child_names_the_archived_pattern_in_its_archive_requests() -> None:
    """The service's scheduler hands the source ``P_A`` with every ``extract`` of the child (it filters a one-event
    ``P_A``'s rows before they are sent, archive.pushdown); what the source returns is what the child matches."""
    from archive.schema import events_to_record, record_to_output
    from engine.event_type import EventType

    schemas = {"pass": {"car": "int", "at": "string"}}
    plan = compile(TEXT, schemas)
    assert isinstance(plan, LiveArchivedPlan)
    etype = EventType("pass", {"car": "int", "at": "string"}, partition_key="car")
    archived = Event(1, "pass", 1_000_000, {"car": 7, "at": "A"})

    class Source:
        def __init__(self) -> None:
            self.patterns: list[object] = []

        def extract_tables(self, requests):
            self.patterns += [r.pattern for r in requests]
            return [(record_to_output(etype, events_to_record(etype, [archived], ingested_at_us=0)), None)] * len(
                requests)

        def count(self, *args, **kw) -> int:
            return 0

        def selectivity(self, *args) -> float:
            return 0.0

    source, found = Source(), []
    spec = ChildSpec(
        query_id=2, name="a_then_b", ast=plan.ast, schemas=schemas,
        algorithm="llaa", tolerance_us=0, allowed_lateness_us={}, lateness_us=0,
    )  # fmt: skip
    pool = ThreadPoolExecutor(max_workers=1)
    scheduler = ArchiveScheduler(source, 1)
    worker = PoolQuery(spec, plan, source, scheduler, lambda q, m: _done(found.extend(m)))
    try:
        worker.offer([Event(2, "pass", 2_000_000, {"car": 7, "at": "B"})], 3_000_000)
        deadline = time.monotonic() + 60
        while not found and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [m.to_json()["events"] for m in found] == [{"p": [2], "q": [1]}]
        assert source.patterns and all(p is plan.archived for p in source.patterns)
    finally:
        worker.stop()
        pool.shutdown()


class GatedSource:
    """A real selection per request (the archived ``pass`` events of its keys whose end is in its ranges), as Arrow;
    the first read waits for :attr:`gate` (a Spark job that takes long), so the child's requests pile up behind it.
    Records each read's requests as it starts."""

    def __init__(self, archived: list[Event]) -> None:
        from engine.event_type import EventType

        self.etype = EventType("pass", {"car": "int", "at": "string"}, partition_key="car")
        self.archived = archived
        self.gate = threading.Event()
        self.reads: list[int] = []

    def extract_tables(self, requests):
        from archive.schema import events_to_record, record_to_output

        self.reads.append(len(requests))
        if len(self.reads) == 1:
            self.gate.wait(60)
        out = []
        for r in requests:
            rows = [e for e in self.archived if any(lo <= e.ts < hi for lo, hi in _ranges_of(r, e.attrs["car"]))]
            out.append((record_to_output(self.etype, events_to_record(self.etype, rows, ingested_at_us=0)), None))
        return out

    def count(self, *args, **kw) -> int:
        return 0

    def selectivity(self, *args) -> float:
        return 0.0


def _ranges_of(request: Any, key: int) -> list[tuple[int, int]]:
    """The ranges ``request`` (an ``Extract``) asks for events of ``key``: by key, or its ranges for its keys (all)."""
    if isinstance(request.ranges, dict):
        return list(request.ranges.get(key, ()))
    return list(request.ranges) if request.keys is None or key in request.keys else []


def _llaa_worker(source: GatedSource, in_flight: int, found: list) -> tuple[PoolQuery, ArchiveScheduler, Any]:
    schemas = {"pass": {"car": "int", "at": "string"}}
    plan = compile(TEXT, schemas)
    assert isinstance(plan, LiveArchivedPlan)
    spec = ChildSpec(
        query_id=3, name="a_then_b", ast=plan.ast, schemas=schemas,
        algorithm="llaa", tolerance_us=0, allowed_lateness_us={}, lateness_us=0, requests_in_flight=in_flight,
    )  # fmt: skip
    pool = ThreadPoolExecutor(max_workers=1)
    scheduler = ArchiveScheduler(source, 1)
    worker = PoolQuery(spec, plan, source, scheduler, lambda q, m: _done(found.extend(m)))
    return worker, scheduler, pool


def _cars(n: int) -> tuple[list[Event], list[Event], list[dict[str, list[int]]]]:
    """Car k passes A at k s (archived) and B at 100 s + k us (live): one result per car, LLAA one request each."""
    archived = [Event(k, "pass", k * 1_000_000, {"car": k, "at": "A"}) for k in range(1, n + 1)]
    live = [Event(1_000 + k, "pass", 100_000_000 + k, {"car": k, "at": "B"}) for k in range(1, n + 1)]
    return archived, live, [{"p": [1_000 + k], "q": [k]} for k in range(1, n + 1)]


def _wait(cond: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)
    return cond()


def test_the_waiting_requests_of_one_query_process_are_answered_by_few_reads() -> None:
    """Issue 25 (b): LLAA makes one request per live instance. While a read is busy, every request the query process
    has made waits at the scheduler (not 2, one per lookup thread of the child), so the next read answers them all;
    the results are those of each request answered alone."""
    n = 60
    archived, live, expected = _cars(n)
    source, found = GatedSource(archived), []
    worker, scheduler, pool = _llaa_worker(source, 256, found)
    try:
        worker.offer(live, 200_000_000)
        assert _wait(lambda: scheduler.stats()["waiting"] + sum(source.reads) >= n, 60), scheduler.stats()
        source.gate.set()
        assert _wait(lambda: len(found) >= n, 60)
        assert sorted((m.to_json()["events"] for m in found), key=lambda d: d["p"]) == expected
        stats = scheduler.stats()
        assert stats["requests"] == n and stats["reads"] <= 3, stats  # one blocked read, then one or two for the rest
        assert _wait(lambda: worker.stats()["requests_in_flight"] == 0, 10)
        assert worker.stats()["archive_requests"] == n  # the algorithm's logical requests: one per live instance
    finally:
        source.gate.set()
        worker.stop()
        pool.shutdown()
        scheduler.close()


def test_requests_beyond_the_limit_wait_in_the_query_process_and_none_is_dropped() -> None:
    """At most ``requests_in_flight`` requests of a query are at the scheduler; the others wait in the query process
    (``requests_waiting`` in its stats) and go when an answer comes back: every live instance gets its result."""
    n, limit = 20, 4
    archived, live, expected = _cars(n)
    source, found = GatedSource(archived), []
    worker, scheduler, pool = _llaa_worker(source, limit, found)
    try:
        worker.offer(live, 200_000_000)
        assert _wait(lambda: worker.ready.is_set() and worker.stats()["requests_waiting"] == n - limit, 60)
        time.sleep(0.3)  # more would have reached the scheduler by now
        assert scheduler.stats()["waiting"] + sum(source.reads) == limit
        source.gate.set()
        assert _wait(lambda: len(found) >= n, 60)
        assert sorted((m.to_json()["events"] for m in found), key=lambda d: d["p"]) == expected
        assert scheduler.stats()["requests"] == n
    finally:
        source.gate.set()
        worker.stop()
        pool.shutdown()
        scheduler.close()


def test_a_query_process_still_merges_the_subwindows_that_close_while_one_is_answered() -> None:
    """The child's pool has a thread per request in flight, but mergeable requests (SLLAA subwindows) keep their own
    bound: those that close while one is answered wait and become one request over their union (as with two
    threads); requests that are not mergeable go on meanwhile."""
    from engine.live_archived.base import ArchiveWork, LiveInstance
    from engine.match import Match
    from service.live.live_archived import ArchiveLookups

    gate, asked, done = threading.Event(), [], []

    def answer(insts: list[LiveInstance]) -> list[Match]:
        asked.append(sorted(i.match.start for i in insts))
        if len(asked) == 1:
            gate.wait(10)
        return []

    class Owner:  # what ArchiveLookups reads and calls of its LiveArchivedWorker
        stopped, merged, errors, name, failed = False, 0, 0, "q", None

        def finished(self, parts: list[ArchiveWork], results: list[Match]) -> None:
            done.extend(parts)

    def work(start: int, mergeable: bool = True) -> ArchiveWork:
        return ArchiveWork([LiveInstance(Match("q", {}, start, start), start, 0.0)], answer, mergeable)

    lookups, owner = ArchiveLookups(8, mergeable_in_flight=1), Owner()
    try:
        lookups.submit(owner, work(1))  # type: ignore[arg-type]
        assert _wait(lambda: len(asked) == 1, 10)
        for start in (2, 3, 4):
            lookups.submit(owner, work(start))  # type: ignore[arg-type]
        lookups.submit(owner, work(9, mergeable=False))  # type: ignore[arg-type]
        assert _wait(lambda: [9] in asked, 10)  # not held behind the subwindows
        assert lookups.waiting_for(owner) == 3  # type: ignore[arg-type]
        gate.set()
        assert _wait(lambda: len(done) == 5, 10)
        assert sorted(asked) == [[1], [2, 3, 4], [9]] and owner.merged == 2
    finally:
        gate.set()
        lookups.close()


def test_rows_a_request_brought_before_become_the_remembered_events() -> None:
    """A query process turns an answer's rows into events; the rows its memo knows (an earlier request of the query
    brought them) are the remembered events themselves, the others converted: the same events in row order."""
    import pyarrow as pa

    from archive.schema import output_to_events
    from engine.live_archived.memo import ArchivedMemo
    from service.live.la_process import rows_to_events

    table = pa.table({
        "id": [1, 2, 3, 4], "type": ["pass"] * 4, "ts": [10, 20, 20, 30], "ts_end": [10, 25, None, 30],
        "car": [7, 7, 8, None], "at": ["A", "B", "A", "A"],
    })
    plain = output_to_events(table)
    memo = ArchivedMemo()
    assert [e.id for e in rows_to_events(table, memo)] == [1, 2, 3, 4]  # nothing remembered yet
    memo.match([plain[0], plain[2]], lambda evs: [], None)  # an earlier request brought rows 1 and 3
    again = rows_to_events(table, memo)
    assert again[0] is plain[0] and again[2] is plain[2]
    assert [(e.id, e.type, e.ts, e.ts_end, e.attrs) for e in again] == [
        (e.id, e.type, e.ts, e.ts_end, e.attrs) for e in plain
    ]


def test_a_warmed_query_process_imports_nothing_at_its_first_answer() -> None:
    """After :func:`warm_answers` (a query process calls it while it starts), turning an archive answer (Arrow IPC
    bytes) into events, as :meth:`RemoteSource.extract` does, imports no module: the first answer of each of ten
    query processes no longer pays for pyarrow's and pandas' imports at the start of the stream (issue 25)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import sys
        from service.live.la_process import warm_answers
        warm_answers()
        before = set(sys.modules)
        import pyarrow as pa
        from archive.archived_source import keep_requested
        from archive.schema import output_to_events
        from engine.live_archived.memo import ArchivedMemo
        from service.live.la_process import rows_to_events
        table = pa.table({"id": [1, 2], "type": ["pass"] * 2, "ts": [10, 20], "ts_end": [10, 25], "car": [7, 8]})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        answer = pa.ipc.open_stream(sink.getvalue().to_pybytes()).read_all()
        memo = ArchivedMemo()
        memo.match(output_to_events(answer.slice(0, 1)), lambda evs: [], None)
        assert [e.id for e in rows_to_events(answer, memo)] == [1, 2]
        print(sorted(set(sys.modules) - before))
    """)
    repo = Path(__file__).resolve().parents[2]  # the script imports the project's modules, whatever pytest's cwd
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=repo)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", f"imported at the first answer: {done.stdout.strip()}"


def test_a_child_not_yet_answering_holds_the_position_it_never_acknowledged() -> None:
    """The crash suite lost a live-and-archived result (CI, SQLite, ``iv_la``), and so did issue 43's reproduction:
    the position was read from the child at checkpoint time, and a child still spawning, busy, or between two
    places an instance may be read as "nothing pending". Positions now come only from the child's
    acknowledgements: before it has matched anything it has acknowledged nothing (the checkpoint holds the query's
    position), and once it has, its open subwindow's instances hold the position at their first event's."""
    worker, pool = _sllaa_process_worker()
    try:
        assert worker.acked is None
        events = [Event(i, "pass", i * 1_000_000, {"car": i, "at": "B"}) for i in range(5, 51)]
        worker.offer(events, None, seqs=list(range(105, 151)))
        assert not worker.ready.is_set(), "the child answered before the test asked: it proves nothing"
        assert worker.acked is None  # nothing matched, nothing acknowledged: no guess
        assert _wait(lambda: worker.acked is not None and worker.acked[0] == 150, 60)
        assert worker.acked == (150, 105)  # its instances wait in an open subwindow (T_L 1 hour)
    finally:
        worker.stop()
        pool.shutdown()


def test_an_in_thread_worker_busy_before_its_first_event_acknowledges_nothing() -> None:
    """The same rule for :class:`~service.live.live_archived.LiveArchivedWorker` (the query in the service's
    process): offered events its runner has not matched are not acknowledged, and then their instances hold the
    position until their results are committed."""
    plan = compile(TEXT, {"pass": {"car": "int", "at": "string"}})
    assert isinstance(plan, LiveArchivedPlan)
    lookups = ArchiveLookups(1)
    acks: list[tuple[int, int]] = []
    worker = LiveArchivedWorker(
        query_id=1, name="a_then_b", plan=plan, lookups=lookups, record=lambda q, m: None, lateness_us=0,
        make_runner=lambda defer: make_detector(plan, source=MemoryArchive(), algorithm="sllaa", defer=defer,
                                                tolerance_us=3_600_000_000),
        on_ack=lambda last, need: acks.append((last, need)),
    )  # fmt: skip
    gate = threading.Event()
    try:
        worker.call(gate.wait)  # the worker's thread waits: what is offered next is not matched
        worker.offer([Event(i, "pass", i * 1_000_000, {"car": i, "at": "B"}) for i in range(7, 30)], None,
                     seqs=list(range(7, 30)))
        time.sleep(0.1)
        assert worker.acked is None and not acks
        gate.set()
        assert _wait(lambda: worker.acked is not None, 10)
        assert worker.acked == (29, 7)  # the open subwindow's first instance
        worker.offer([], 7_200_000_000, seqs=[])  # the watermark closes the subwindow: answered, committed
        assert _wait(lambda: worker.acked is not None and worker.acked[1] == 30, 10), worker.acked
        assert acks == sorted(acks)  # acknowledgements only move forward
    finally:
        gate.set()
        worker.stop()
        lookups.close()


def test_a_batch_crosses_in_columns_and_comes_back_the_same_events() -> None:
    """:func:`encode_batch` / :func:`decode_batch`: one Arrow stream per event type, the events back in batch order
    with their positions and the batch's index by type; values Arrow would change (an int among floats, mixed kinds,
    events of one type with different attributes) come back exactly too."""
    from service.live.la_process import decode_batch, encode_batch

    events = [
        Event(1, "pass", 10, {"car": 7, "at": "A"}),
        Event(2, "speed", 11, {"v": 1.5, "w": 3}),
        Event(3, "pass", 12, {"car": 8, "at": None}),
        Event(4, "speed", 13, {"v": 2, "w": "x"}),
        Event(5, "odd", 14, {"a": 1}),
        Event(6, "odd", 15, {"b": True}, 20),
    ]
    seqs = [100, 101, None, 103, 104, 105]
    got, got_seqs, index = decode_batch(encode_batch(events, seqs))
    assert [(e.id, e.type, e.ts, e.ts_end, e.attrs) for e in got] == [
        (e.id, e.type, e.ts, e.ts_end, e.attrs) for e in events
    ]
    assert [type(e.attrs["v"]) for e in got if e.type == "speed"] == [float, int]
    assert got_seqs == seqs and index == {"pass": [0, 2], "speed": [1, 3], "odd": [4, 5]}


def test_a_worker_feeds_each_query_only_the_events_of_its_types() -> None:
    """The index by event type (:class:`service.live.feeds.Feeds`): a batch of two types gives a query of one type
    its events only, in order, with their positions; a query of both the batch as it is; a query whose types the
    batch lacks only a watermark that moved."""
    from service.live.feeds import Feeds

    class Got:
        def __init__(self) -> None:
            self.calls: list[tuple[list[int], int | None, list[int | None]]] = []

        def offer(self, events, watermark_us, *, seqs=None, upto=None, offered_at=None, idle=False) -> None:
            self.calls.append(([e.id for e in events], watermark_us, list(seqs or [])))

    a, both, other = Got(), Got(), Got()
    feeds = Feeds()
    feeds.add(1, frozenset({"a"}), a)
    feeds.add(2, frozenset({"a", "b"}), both)
    feeds.add(3, frozenset({"c"}), other)
    batch = [Event(1, "a", 1, {}), Event(2, "b", 2, {}), Event(3, "a", 3, {})]
    marks = {1: (5, False), 2: (5, False), 3: (None, False)}
    feeds.offer(batch, [11, 12, 13], 13, marks)
    feeds.offer([], [], 13, marks)  # nothing moved: nothing offered
    assert a.calls == [([1, 3], 5, [11, 13])]
    assert both.calls == [([1, 2, 3], 5, [11, 12, 13])]
    assert other.calls == []


def test_queries_go_to_the_least_loaded_worker_ties_to_the_lowest_index() -> None:
    """:meth:`WorkerPool.assign`: deterministic, balanced by the number of queries hosted."""
    pool = WorkerPool(workers=3, source=None, spark_pool=None, scheduler=None, submit=None,  # type: ignore[arg-type]
                      lock=threading.RLock(), position=lambda: None, replay=lambda ids, upto: {})
    placed = []
    for qid in range(1, 6):
        slot = pool.assign()
        slot.queries[qid] = None  # type: ignore[assignment]
        pool.slot_of[qid] = slot
        placed.append(slot.index)
    assert placed == [0, 1, 2, 0, 1]
    pool.remove(2)  # worker 1 now hosts one query
    assert pool.assign().index == 1
