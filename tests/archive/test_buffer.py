"""The recent buffer's reads (no Spark): a read after more chunks, a flush or a schema change gives what a buffer
holding only those chunks gives (its conformed chunks are kept between reads, issue 43)."""
from __future__ import annotations

from archive.buffer import RecentBuffer
from archive.ranges import make_request
from archive.schema import events_to_record
from engine.event_type import EventType
from engine.events import Event

S = EventType("s", {"key": "string", "v": "int"}, partition_key="key")
S2 = EventType("s", {"key": "string", "v": "int", "w": "float"}, partition_key="key")


def _chunk(etype: EventType, first: int, n: int) -> object:
    evs = [Event(i, "s", 1_000 * i, {"key": f"k{i % 3}", "v": i}) for i in range(first, first + n)]
    return events_to_record(etype, evs, ingested_at_us=0, ingest_seqs=list(range(first, first + n)))


def _fresh(chunks: list[tuple[EventType, int, object]], etype: EventType) -> RecentBuffer:
    b = RecentBuffer()
    for t, seq, table in chunks:
        b.add(t, seq, table)  # type: ignore[arg-type]
    b.set_type(etype)
    return b


def _ids(b: RecentBuffer, request: dict | None = None) -> list[int]:
    return b.query(["s"], request).column("id").to_pylist()


def test_reads_after_adds_flushes_and_an_evolved_type_equal_a_fresh_buffers():
    b = RecentBuffer()
    added: list[tuple[EventType, int, object]] = []
    for seq in range(1, 6):
        added.append((S, seq, _chunk(S, 10 * seq, 4)))
        b.add(S, seq, added[-1][2])  # type: ignore[arg-type]
        assert _ids(b) == _ids(_fresh(added, S))  # each read after one more chunk: only it is conformed
    assert _ids(b) == [i for seq in range(1, 6) for i in range(10 * seq, 10 * seq + 4)]
    b.drop_through(2)
    added = added[2:]
    assert _ids(b) == _ids(_fresh(added, S)) == [i for seq in range(3, 6) for i in range(10 * seq, 10 * seq + 4)]
    keyed = make_request(["k1"], [(30_000, 45_000)])
    assert _ids(b, keyed) == [31, 40, 43]
    b.set_type(S2)  # an evolved schema: the kept chunks are read again, the new column null
    t = b.query(["s"])
    assert t.column("w").null_count == t.num_rows == 12
    added.append((S2, 6, _chunk(S2, 60, 2)))
    b.add(S2, 6, added[-1][2])  # type: ignore[arg-type]
    assert _ids(b) == _ids(_fresh(added, S2))
    b.drop_through(6)
    assert _ids(b) == []
