"""The data and queries of ``lace demo`` (:mod:`cli.demo`; docs/architecture.md section 7.13): the two bundled
real streams (``cli/demo_data``, attribution in its README.md), merged in (ts, id) order with unique ids; the
split of each event type into the part archived up front and the part posted live (:data:`SPLITS`); the demo
queries (``queries/*.lql``), compiled; the order in which the streams are posted, each with the queries
registered after its archived part (the demo ends each stream with ``POST /event-types/{name}/end``, which
closes its last windows: no sentinel event). Timestamps are int microseconds UTC.
"""
from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from engine.detector import Statement
from engine.detector import compile as compile_statement
from engine.events import Event
from engine.io import read_events

DATA = Path(__file__).resolve().parent / "demo_data"
STREAMS = ("bars_1m.csv", "traffic_slice.csv")
HOUR_US = 3_600_000_000
DAY_US = 24 * HOUR_US
KEY = "key"
"""The partition key attribute of every demo event type."""


def _utc_us(year: int, month: int, day: int) -> int:
    return int(datetime(year, month, day, tzinfo=UTC).timestamp()) * 1_000_000


SPLITS: dict[str, int] = {
    "bar": _utc_us(2013, 10, 9),  # Monday and Tuesday archived; Wednesday to Friday live
    "traffic": _utc_us(2014, 8, 11),  # 2014-08-01 .. 10 archived; 11 .. 14 live
}
"""Per event type: events before this time (int microseconds UTC) are archived up front, the rest posted live."""


class DemoError(RuntimeError):
    """The demo cannot go on (the service refused a request, stopped, or did not finish in time)."""


@dataclass(frozen=True)
class DemoQuery:
    """A demo query: its name, LQL text and compiled statement."""

    name: str
    text: str
    statement: Statement

    @property
    def reads_archive(self) -> bool:
        """Whether its statement reads the archive (a live-and-archived query): what its class declares."""
        return self.statement.reads_archive

    @property
    def types(self) -> frozenset[str]:
        return frozenset(self.statement.stream_types)

    @property
    def window_us(self) -> int | None:
        """WITHIN, int us (a live-and-archived query's live side's): what its statement declares."""
        return self.statement.window_us


@dataclass
class Stream:
    """The events of one type: the archived part, the live part, and the queries registered after its archived part."""

    type: str
    archived: list[Event]
    live: list[Event]
    queries: list[DemoQuery] = field(default_factory=list)

    @property
    def first_ts(self) -> int:
        return (self.archived or self.live)[0].ts

    @property
    def last_ts(self) -> int:
        return (self.live or self.archived)[-1].ts


def load_stream(data_dir: Path = DATA) -> list[Event]:
    """Both bundled streams merged in (ts, id) order; ids renumbered to stay unique."""
    streams = [list(read_events(data_dir / name)) for name in STREAMS]
    merged = list(heapq.merge(*streams, key=lambda e: (e.ts, e.type)))
    return [Event(i, e.type, e.ts, e.attrs) for i, e in enumerate(merged, start=1)]


def split_stream(events: list[Event], splits: dict[str, int] = SPLITS) -> tuple[list[Event], list[Event]]:
    """``(archived, live)``: each event goes to the archive when it is before its type's split time."""
    archived: list[Event] = []
    live: list[Event] = []
    for e in events:
        (archived if e.ts < splits.get(e.type, 0) else live).append(e)
    return archived, live


def load_demo_queries(data_dir: Path = DATA) -> list[DemoQuery]:
    """The demo queries (``queries/*.lql``), by file name, compiled (named by their NAME, else the file)."""
    out: list[DemoQuery] = []
    for p in sorted((data_dir / "queries").glob("*.lql")):
        text = p.read_text(encoding="utf-8")
        statement = compile_statement(text)
        out.append(DemoQuery(str(statement.name or p.stem), text, statement))
    return out


def load_queries(data_dir: Path = DATA) -> list[Statement]:
    """The demo queries compiled: a CompiledQuery (live-only) or a LiveArchivedPlan each."""
    return [q.statement for q in load_demo_queries(data_dir)]


def plan_streams(archived: list[Event], live: list[Event], queries: Sequence[DemoQuery]) -> list[Stream]:
    """The streams in posting order (by first event time), each with the queries registered after its
    archived part (a query goes with the last-posted stream of its types).

    Raises
    ------
    DemoError
        When two streams overlap in event time (posting one after the other would make events late),
        or a query reads a type the data does not have.
    """
    by_type: dict[str, Stream] = {}
    for part, events in (("archived", archived), ("live", live)):
        for e in events:
            s = by_type.get(e.type) or by_type.setdefault(e.type, Stream(e.type, [], []))
            getattr(s, part).append(e)
    streams = sorted(by_type.values(), key=lambda s: s.first_ts)
    for a, b in zip(streams, streams[1:]):
        if b.first_ts <= a.last_ts:
            raise DemoError(f"streams {a.type} and {b.type} overlap in event time; the demo posts one after the other")
    order = {s.type: i for i, s in enumerate(streams)}
    for q in queries:
        missing = sorted(q.types - set(order))
        if missing:
            raise DemoError(f"query {q.name} reads {', '.join(missing)}, which the data does not have")
        streams[max(order[t] for t in q.types)].queries.append(q)
    return streams
