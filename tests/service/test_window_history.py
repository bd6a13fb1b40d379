"""What a plan switch and ``state=warm`` rebuild a statement from (:func:`service.live.warm.window_history`): every
event of the window, whenever the archive flush runs (session 18's rehearsal: a switch under load lost 4 alerts).

A real :class:`archive.writer.ArchiveWriter` (WAL, recent buffer, Delta on disk) and the runtime's real event clock;
the rest of the runtime is the few attributes ``window_history`` reads.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from archive.writer import ArchiveWriter
from engine.events import Event
from service.live.event_time import EventTime
from service.live.warm import window_history
from tests.archive.archive_data import TRAFFIC, make_events

pytestmark = pytest.mark.integration  # real Delta tables on disk

MINUTE_US = 60_000_000


def runtime_and_query(writer: ArchiveWriter, events: list[Event]) -> tuple[SimpleNamespace, SimpleNamespace]:
    clock = EventTime(lambda _t: 0)
    for e in events:
        clock.observe(e.type, e.ts_end)
    rt = SimpleNamespace(
        archive=writer, types=writer.types, event_time=clock, emitters={}, replay_max_us=10**15
    )
    lq = SimpleNamespace(
        compiled=SimpleNamespace(stream_types=frozenset({"traffic"})), state_span_us=lambda: 10**12,
        max_lateness_us=0,
    )
    return rt, lq


@pytest.mark.parametrize("flushed_before", ["nothing", "some", "all"])
def test_a_flush_between_the_two_reads_loses_no_event(tmp_path: Path, flushed_before: str) -> None:
    """The flush runs right before the buffer is read (after Delta would have been, in the old order): every event
    written is in the window's history, once, in (ts_end, id) order. Reading Delta first lost every buffered one."""
    events = make_events(400, seed=3, types=(TRAFFIC,), span_us=30 * MINUTE_US)
    with ArchiveWriter(tmp_path / "archive", types=[TRAFFIC], flush_rows=10**6, flush_age_s=3600, fsync=False) as w:
        seqs = range(1_001, 1_001 + len(events))  # positions in the service's ingest order
        if flushed_before == "all":
            w.append(events, ingest_seqs=seqs)
            w.flush()
        else:
            cut = 150 if flushed_before == "some" else 0
            w.append(events[:cut], ingest_seqs=seqs[:cut])
            w.flush()
            w.append(events[cut:], ingest_seqs=seqs[cut:])
        assert w.buffer.events(["traffic"]) or flushed_before == "all"
        read_buffer = w.buffer.events
        flushes = []

        def flush_then_read(*args, **kwargs):  # the archive's flush thread wins the race, every time
            flushes.append(w.flush())
            return read_buffer(*args, **kwargs)

        w.buffer.events = flush_then_read  # type: ignore[method-assign]
        rt, lq = runtime_and_query(w, events)
        history, wm, start = window_history(rt, lq)  # type: ignore[arg-type]
        assert flushes == [0 if flushed_before == "all" else len(events) - (150 if flushed_before == "some" else 0)]
    assert [e.id for e in history] == [e.id for e in sorted(events, key=Event.order_key)]
    assert wm is not None and wm < max(e.ts_end for e in events)  # the clock's: no event at or before it comes
    # where the history starts (a warm start's checkpoint): every event was read from Delta, the first position too
    assert start.since_us is not None and start.since_us <= min(e.ts_end for e in events) and start.first_seq == 1_001
