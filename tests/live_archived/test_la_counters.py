"""A live-and-archived runner's ``results`` counter counts every result, whatever is kept of the delay samples
(the service trims those to the latest ``MAX_DELAYS_KEPT``; ``results`` was their length, so it stopped at 10,000)."""
from __future__ import annotations

import pytest

from engine.events import Event
from engine.live_archived.plan import compile_live_archived
from engine.live_archived.runner import ALGORITHMS, make_runner, replay
from engine.live_archived.source import MemoryArchive

MIN = 60_000_000
TEXT = (
    "LIVE PATTERN Pass p WHERE p.at = 'B' ARCHIVED PATTERN Pass q WHERE q.at = 'A' PARTITION BY car "
    "LOOKBACK 20 min JOIN p.car = q.car RETURN p.car AS car"
)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_results_count_every_result_when_the_delay_samples_are_trimmed(algorithm: str) -> None:
    events = []
    for car in range(30):  # each car passes A, then B a minute later: one result each
        events += [Event(2 * car + 1, "Pass", car * 3 * MIN, {"car": car, "at": "A"}),
                   Event(2 * car + 2, "Pass", car * 3 * MIN + MIN, {"car": car, "at": "B"})]
    archive = MemoryArchive()
    runner = make_runner(algorithm, compile_live_archived(TEXT), archive, tolerance_us=0)
    out = []
    for m in replay(events, runner, archive.append):
        out.append(m)
        c = runner.counters
        del c.delay_event_us[:-1], c.delay_wall_s[:-1]  # what the service's stats do beyond MAX_DELAYS_KEPT
    assert len(out) == 30
    assert runner.counters.results == 30
