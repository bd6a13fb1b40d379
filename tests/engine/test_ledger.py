"""The ledger of a live-and-archived query's unfinished work (engine/live_archived/ledger.py, issue 43): every live
instance enters when the runner creates it and leaves once its results are committed, whatever the algorithm, and
the position it needs is the smallest ingest position of what is still open."""
from __future__ import annotations

import pytest

from engine.detector import compile, make_detector
from engine.events import Event
from engine.live_archived.base import ArchiveWork, Runner
from engine.live_archived.ledger import Ledger
from engine.live_archived.plan import LiveArchivedPlan
from engine.live_archived.source import MemoryArchive
from engine.match import Match

TEXT = """NAME la
LIVE PATTERN s a WHERE a.v > 50
ARCHIVED PATTERN s b WHERE b.v < 10
LOOKBACK 10 days
JOIN a.key = b.key"""
DAY = 86_400_000_000
ALGORITHMS = ("sllaa", "ollaa", "llaa", "alaa")


def runner(algorithm: str, archive: MemoryArchive, deferred: list[ArchiveWork] | None) -> Runner:
    plan = compile(TEXT, {"s": {"key": "string", "v": "int"}})
    assert isinstance(plan, LiveArchivedPlan)
    r = make_detector(plan, source=archive, algorithm=algorithm, tolerance_us=DAY,
                      defer=None if deferred is None else deferred.append)  # fmt: skip
    assert isinstance(r, Runner)
    r.ledger = Ledger()
    return r


def feed(r: Runner, archive: MemoryArchive, event: Event, seq: int) -> list[Match]:
    """One batch of one event, as the worker matches it: noted in the ledger, archived, pushed."""
    assert r.ledger is not None
    r.ledger.offered([event], [seq])
    archive.extend([event])
    out = list(r.push(event))
    r.ledger.matched()
    r.ledger.settle_live(r.live_clock)  # a one-event live pattern: no partial match
    return out


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("deferred", [False, True])
def test_every_live_instance_leaves_the_ledger_once_its_results_are_committed(algorithm: str, deferred: bool) -> None:
    archive = MemoryArchive()
    archive.extend([Event(1, "s", 0, {"key": "k", "v": 1})])
    works: list[ArchiveWork] | None = [] if deferred else None
    r = runner(algorithm, archive, works)
    ledger = r.ledger
    assert ledger is not None
    out = feed(r, archive, Event(2, "s", DAY, {"key": "k", "v": 99}), 2)
    assert ledger.open_instances() == 1
    ledger.committed()
    if not out:  # waiting (a subwindow, a live window) or deferred: it still needs position 2
        assert ledger.need() == 2
    out += feed(r, archive, Event(3, "s", 40 * DAY, {"key": "z", "v": 50}), 3)
    out += r.flush()
    for work in works or []:  # the worker runs them on its pool, commits, then takes them out
        out += work.run()
        assert ledger.need() == 2  # not committed yet: held
        ledger.leave(work.instances)
    ledger.committed()
    assert len(out) == 1
    assert ledger.open_instances() == 0
    # nothing open; the partial matches' bound (live clock minus WITHIN, here 0) keeps the event at the live clock
    assert ledger.need() == 3


def test_the_need_is_the_smallest_open_position_and_only_moves_forward() -> None:
    ledger = Ledger()
    assert ledger.need() is None  # nothing offered: nothing acknowledged
    ledger.offered([Event(1, "s", 100), Event(2, "s", 90)], [10, 11])
    ledger.matched()
    assert ledger.need() is None  # the partial matches' part not settled: no answer
    ledger.settle_live(90)
    assert ledger.need() == 10
    ledger.offered([Event(3, "s", 200)], [12])
    assert ledger.need() == 10  # the second batch is being matched: not counted yet
    ledger.matched()

    class Inst:
        def __init__(self, start: int) -> None:
            self.match = type("M", (), {"start": start})()

    late = Inst(95)  # its events end at or after 95: the first batch holds one (ts 100)
    ledger.enter(late)
    ledger.settle_live(150)  # partial matches hold nothing ending before 150: position 12
    assert ledger.need() == 10
    ledger.answered([late])
    assert ledger.need() == 10  # answered, not committed
    ledger.committed()
    assert ledger.need() == 12
    ledger.settle_live(50)  # an earlier horizon cannot take the position back
    assert ledger.need() == 12
    ledger.settle_live(500)
    assert ledger.need() == 13


def test_a_batch_offered_up_to_a_later_position_moves_the_need_past_other_types_events() -> None:
    """``upto``: the service's last position when it offered the batch; the events of other types up to it do not
    concern the query, so a query with nothing open needs only what comes after it (its position does not stay
    behind a quiet type's last event)."""
    ledger = Ledger()
    ledger.offered([], None, upto=40)
    ledger.matched()
    assert ledger.need() is None  # nothing of its own offered yet: nothing acknowledged
    ledger.offered([Event(1, "s", 100)], [41], upto=41)
    ledger.matched()
    ledger.settle_live(500)
    assert ledger.need() == 42
    ledger.offered([], [], upto=90)  # a watermark or an idle notice, later
    ledger.matched()
    ledger.settle_live(500)  # the worker settles after every batch
    assert ledger.need() == 91
