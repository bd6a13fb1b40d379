"""The shared scheduler of archive requests (issue 25): one read per set of event types for the requests waiting
at one moment, oldest first, each answered with its own rows; the exactness of the split is tested on a real
archive in tests/archive/test_extractor.py (``test_requests_read_together_each_get_what_they_get_alone``)."""
from __future__ import annotations

import threading

import pytest

from archive.archived_source import Extract
from service.live.archive_scheduler import ArchiveScheduler


class Source:
    """Answers each request with its own ranges (so a caller can tell its answer) and records each read."""

    def __init__(self) -> None:
        self.reads: list[list[Extract]] = []
        self.gate = threading.Event()
        self.fail = False

    def extract_tables(self, requests):
        self.gate.wait(10)
        self.reads.append(list(requests))
        if self.fail:
            raise RuntimeError("executor lost")
        return [(r.ranges, None) for r in requests]


def test_requests_waiting_together_are_one_read_per_set_of_types_oldest_first() -> None:
    source = Source()
    scheduler = ArchiveScheduler(source, workers=1)
    try:
        blocker = scheduler.submit(Extract(("x",), None, [(0, 1)]))  # holds the one worker until the gate opens
        futures = []
        for q in range(10):  # ten queries: traffic by key, parking by time
            futures.append(scheduler.submit(Extract(("traffic",), (f"k{q}",), [(q, q + 10)], "key")))
            futures.append(scheduler.submit(Extract(("parking",), None, [(q, q + 5)])))
        source.gate.set()
        assert blocker.result(10) == ([(0, 1)], None)
        for q in range(10):
            assert futures[2 * q].result(10) == ([(q, q + 10)], None)
            assert futures[2 * q + 1].result(10) == ([(q, q + 5)], None)
        sizes = [[r.types for r in read] for read in source.reads]
        assert sizes[0] == [("x",)]
        assert sorted(len(s) for s in sizes[1:]) == [10, 10] and all(len(set(s)) == 1 for s in sizes[1:])
        assert source.reads[1][0].types == ("traffic",)  # the oldest waiting request's set goes first
        assert scheduler.stats() == {"reads": 3, "requests": 21, "largest_batch": 10, "waiting": 0}
    finally:
        scheduler.close()


def test_a_failed_read_fails_each_request_it_covers_and_the_next_read_works() -> None:
    source = Source()
    source.gate.set()
    source.fail = True
    scheduler = ArchiveScheduler(source, workers=2)
    try:
        with pytest.raises(RuntimeError, match="executor lost"):
            scheduler.submit(Extract(("traffic",), ("a",), [(0, 1)], "key")).result(10)
        source.fail = False
        assert scheduler.submit(Extract(("traffic",), ("a",), [(0, 1)], "key")).result(10) == ([(0, 1)], None)
    finally:
        scheduler.close()
