"""Where a restart continues the ingest order (service/live/recovery.py): the newest archived ``ingest_seq``
and ``ingested_at`` come from Delta statistics, or from the column itself when Delta keeps no statistics for it
(it indexes only a table's first 32 columns)."""
from __future__ import annotations

from pathlib import Path

import pytest

from archive.writer import ArchiveWriter
from engine.event_type import EventType
from engine.events import Event
from service.live.recovery import archived_tops, read_rows


@pytest.mark.parametrize("width", [3, 40])
def test_a_restart_continues_after_the_newest_archived_position(tmp_path: Path, width: int) -> None:
    attrs = {f"a{i}": "int" for i in range(width)}
    etype = EventType("wide", attrs)
    events = [Event(10 + k, "wide", 1_000_000 * (k + 1), {"a0": k}) for k in range(5)]
    with ArchiveWriter(tmp_path, types=[etype], flush_rows=2) as w:
        w.append(events[:3], ingested_at_us=5_000, ingest_seqs=[7, 8, 9])
        w.append(events[3:], ingested_at_us=6_000, ingest_seqs=[10, 11])
        w.flush()
    tops, seq, stamp = archived_tops(tmp_path, ["wide"])
    assert seq == 11
    assert stamp is not None and stamp >= 6_000
    assert tops["wide"] >= 5_000_000
    spec = EventType("wide", attrs)
    rows = read_rows(tmp_path, spec, from_seq=9, since=None)
    assert [(r.seq, r.event.id, r.ingested_at) for r in rows] == [(9, 12, 5_000), (10, 13, 6_000), (11, 14, 6_000)]
