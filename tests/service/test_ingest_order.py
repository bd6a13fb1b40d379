"""The durable ingest order (service/live/ingest_order.py): positions, stamps, and the index that maps a
statement's event-time horizon to the position its restart replays from."""
from __future__ import annotations

from engine.events import Event
from service.live.ingest_order import BUCKET_EVENTS, MAX_BUCKETS, IngestOrder


def ev(ts: int, ts_end: int | None = None) -> Event:
    return Event(1, "T", ts, {}, ts if ts_end is None else ts_end)


def test_positions_follow_each_other_across_requests_and_a_restart() -> None:
    order = IngestOrder()
    assert order.take([ev(10), ev(20)]) == [1, 2]
    assert order.take([ev(30)]) == [3]
    again = IngestOrder()
    again.resume_after(3, 1_000)
    assert again.take([ev(40)]) == [4]


def test_stamps_strictly_increase_when_the_clock_stands_still_or_goes_back() -> None:
    order = IngestOrder()
    assert order.stamp(1_000) == 1_000
    assert order.stamp(1_000) == 1_001
    assert order.stamp(500) == 1_002  # the wall clock went back: the order does not
    restarted = IngestOrder()
    restarted.resume_after(None, 1_002)
    assert restarted.stamp(900) == 1_003


def test_a_horizon_maps_to_the_first_position_that_may_hold_an_event_at_or_after_it() -> None:
    order = IngestOrder()
    for k in range(3 * BUCKET_EVENTS):  # three full buckets: event times 0 .. 3 * BUCKET_EVENTS - 1 (us)
        order.take([ev(k)])
    assert order.position_of(0, known_from=1) == 1
    assert order.position_of(BUCKET_EVENTS + 5, known_from=1) == BUCKET_EVENTS + 1
    assert order.position_of(10**12, known_from=1) == order.next_seq  # nothing so late: nothing to replay
    assert order.position_of(0, known_from=BUCKET_EVENTS * 2) == BUCKET_EVENTS * 2  # positions never go back


def test_a_late_event_keeps_the_position_of_its_bucket() -> None:
    order = IngestOrder()
    order.take([ev(100)] * BUCKET_EVENTS)
    order.take([ev(1_000)] * BUCKET_EVENTS)
    order.take([ev(150)])  # late but within lateness: a third bucket whose newest event is older
    assert order.position_of(120, known_from=1) == BUCKET_EVENTS + 1
    assert order.position_of(100, known_from=1) == 1


def test_before_the_index_the_previous_position_is_kept() -> None:
    order = IngestOrder()
    order.resume_after(500, 0)  # a restart: the index starts at 501
    order.take([ev(7)])
    assert order.position_of(0, known_from=200) == 200


def test_the_index_stays_bounded_and_merging_only_moves_positions_earlier() -> None:
    order = IngestOrder()
    for k in range(MAX_BUCKETS + 10):
        order.take([ev(k)] * BUCKET_EVENTS)
    assert len(order._buckets) == MAX_BUCKETS
    exact = 11 * BUCKET_EVENTS + 1  # the bucket of event time 11 before any merge
    assert order.position_of(11, known_from=1) <= exact
    order.forget_before(exact)
    assert order.floor <= exact


def test_a_bucket_covers_the_wall_seconds_it_is_given() -> None:
    """``LACE_INGEST_ORDER_BUCKET_S``: requests further apart than a bucket's wall seconds start a new bucket, so a
    horizon between them maps to the later request's first position; within one bucket, to the bucket's first."""
    import time

    import pytest

    fine, coarse = IngestOrder(bucket_s=0.05), IngestOrder(bucket_s=3_600)
    for order in (fine, coarse):
        order.take([ev(100)])
    time.sleep(0.06)
    for order in (fine, coarse):
        order.take([ev(200)])
    assert fine.position_of(150, known_from=1) == 2
    assert coarse.position_of(150, known_from=1) == 1
    with pytest.raises(ValueError, match="bucket_s"):
        IngestOrder(bucket_s=0)
