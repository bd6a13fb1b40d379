"""The live-and-archived worker process (service/live/la_process.py): what its stats say while the child is busy."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from engine.detector import compile
from engine.events import Event
from engine.live_archived.plan import LiveArchivedPlan
from engine.live_archived.source import MemoryArchive
from service.live.archive_scheduler import ArchiveScheduler
from service.live.la_process import ChildSpec, ProcessWorker

TEXT = """NAME a_then_b
LIVE PATTERN SEQ(pass p) WHERE p.at = 'B'
ARCHIVED PATTERN SEQ(pass q) WHERE q.at = 'A'
LOOKBACK 1 hour
JOIN p.car = q.car
"""


def test_events_sent_to_a_child_not_yet_answering_count_as_backlog() -> None:
    """Right after a (re)start the child is still spawning; the events already piped to it are not processed.
    Its stats must not read as idle then (they did: the piped events left the service's count, and the child's
    stats were the empty ones), or a caller that waits for idle (a restart's catch-up, a test) stops early."""
    plan = compile(TEXT, {"pass": {"car": "int", "at": "string"}})
    assert isinstance(plan, LiveArchivedPlan)
    spec = ChildSpec(
        query_id=1, name="a_then_b", ast=plan.ast, schemas={"pass": {"car": "int", "at": "string"}},
        algorithm="sllaa", tolerance_us=3_600_000_000, allowed_lateness_us={}, lateness_us=0,
    )  # fmt: skip
    pool = ThreadPoolExecutor(max_workers=1)
    worker = ProcessWorker(spec=spec, plan=plan, source=MemoryArchive(), spark_pool=pool,
                           scheduler=ArchiveScheduler(MemoryArchive(), 1),  # type: ignore[arg-type]
                           record=lambda q, m: None)
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
    worker = ProcessWorker(spec=spec, plan=plan, source=source, spark_pool=pool, scheduler=scheduler,
                           record=lambda q, m: found.extend(m))
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
