"""Helpers of the archive tests: event generators, delta-rs read-back, the reference filter."""
from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from engine.event_type import EventType
from engine.events import Event

T0_US = 1_407_000_000_000_000  # 2014-08-02T17:20:00Z
MINUTE_US = 60_000_000
DAY_US = 86_400_000_000

TRAFFIC = EventType("traffic", {"key": "string", "speed": "int", "ok": "bool"}, partition_key="key")
PARKING = EventType("parking", {"key": "string", "free": "float", "seen": "timestamp"}, partition_key="key")
KEYS = [f"s{i}" for i in range(12)]


def make_events(
    n: int, *, seed: int = 0, first_id: int = 1, t0_us: int = T0_US, span_us: int = 3 * DAY_US, types=(TRAFFIC, PARKING)
) -> list[Event]:
    """``n`` events with ids ``first_id..``, random types, keys and ts over ``span_us`` (crossing UTC days)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        etype = rng.choice(types)
        ts = t0_us + rng.randrange(span_us)
        if etype.name == "traffic":
            attrs = {"key": rng.choice(KEYS), "speed": rng.randrange(120), "ok": rng.random() < 0.9}
        else:
            attrs = {"key": rng.choice(KEYS), "free": round(rng.random() * 100, 3), "seen": ts - rng.randrange(10**9)}
        out.append(Event(first_id + i, etype.name, ts, attrs))
    return out


def read_ids(root: str | Path, type_name: str, *, version: int | None = None) -> list[int]:
    """Ids in a Delta table's snapshot, read with delta-rs's file list and plain Parquet (no Spark)."""
    from deltalake import DeltaTable

    uri = Path(root) / type_name
    if not DeltaTable.is_deltatable(str(uri)):
        return []
    files = DeltaTable(str(uri), version=version).file_uris()
    if not files:
        return []
    return pa.concat_tables([pq.read_table(f, columns=["id"]) for f in files]).column("id").to_pylist()


def python_filter(events, types, keys, ranges) -> list[tuple[int, str]]:
    """The reference answer of an archive request: (ts, id)-ordered ``(id, type)`` pairs."""
    hit = []
    for e in events:
        if e.type not in types:
            continue
        if isinstance(ranges, dict):
            rs = ranges.get(e.attrs.get("key"), [])
        else:
            rs = ranges
            if keys is not None and e.attrs.get("key") not in keys:
                continue
        if any(lo <= e.ts < hi for lo, hi in rs):
            hit.append(e)
    hit.sort(key=lambda e: (e.ts, e.id))
    return [(e.id, e.type) for e in hit]
