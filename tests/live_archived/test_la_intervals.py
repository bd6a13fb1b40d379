"""Issue 15: live-and-archived over interval events: the JOIN relates a live interval to archived ones
("the same segment jammed now and within the last 14 days" with a relation on their times)."""
from __future__ import annotations

import pytest

from engine.events import Event
from engine.live_archived import ALGORITHMS, compile_live_archived, make_runner, replay
from engine.live_archived.source import MemoryArchive

H = 3_600_000_000
D = 24 * H
QUERY = """LIVE PATTERN SEQ(episode e)
ARCHIVED PATTERN SEQ(episode p)
LOOKBACK 14 d
JOIN e.key = p.key AND p BEFORE(1 d) e AND p.duration >= 1 h
RETURN e.key AS key, p.ts AS before_ts"""


def episode(i: int, key: int, start_h: float, hours: float) -> Event:
    return Event(i, "episode", int(start_h * H), {"key": key}, int((start_h + hours) * H))


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_a_live_interval_joins_archived_intervals_by_relation(algorithm: str) -> None:
    plan = compile_live_archived(QUERY)
    past = [
        episode(1, 7, 0, 2),  # key 7, ends at 2 h, 198 h before the live one -> BEFORE(1 d) holds
        episode(2, 7, 100, 0.5),  # too short (30 min)
        episode(3, 8, 10, 3),  # another key
        episode(4, 7, 180, 2),  # ends at 182 h, 18 h before the live one: under the 1 d minimum gap
    ]
    live = [episode(5, 7, 200, 1), episode(6, 8, 201, 1)]  # access ranges [start - 14 d, start)
    archive = MemoryArchive()
    for e in past:
        archive.append(e)
    options = {"alaa": {"window_us": 20 * D}}.get(algorithm, {})
    runner = make_runner(algorithm, plan, archive, **options)
    results = list(replay(live, runner, archive.append))
    got = sorted((m.fields["key"], m.fields["before_ts"] // H) for m in results)
    assert got == [(7, 0), (8, 10)]
