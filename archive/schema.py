"""Event type schemas and their Arrow / Delta forms (docs/architecture.md sections 7.3 and 7.8).

Three Arrow shapes of the events of one type:

* **record** (WAL and recent buffer): ``id`` int64, ``ts`` timestamp[us, UTC], ``ts_end``
  timestamp[us, UTC] for an interval type only (issue 15), the attributes, ``ingested_at``
  timestamp[us, UTC];
* **table** (the Delta table): the record columns plus ``date``, the UTC date of ``ts``
  as ``YYYY-MM-DD`` (the partition column);
* **output** (what the extractor returns): ``id`` int64, ``type`` string, ``ts`` int64
  microseconds UTC, ``ts_end`` int64 when one of the types is an interval type (null for the
  events of point types), the attributes with timestamps as int64 microseconds, like
  :class:`engine.events.Event`.

``ts`` is written tz-aware (UTC): a tz-less Arrow timestamp would become a Delta
``timestamp_ntz`` column, a table feature that needs reader version 3.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.event_type import EventType, SchemaError
from engine.events import Event

TS_TYPE = pa.timestamp("us", tz="UTC")
ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "int": pa.int64(),
    "float": pa.float64(),
    "bool": pa.bool_(),
    "timestamp": TS_TYPE,
}
US_PER_DAY = 86_400_000_000
CATALOG_FILE = "_lace/types.json"


def record_schema(etype: EventType) -> pa.Schema:
    """WAL / recent-buffer schema of ``etype``: ``id``, ``ts``, ``ts_end`` (interval types), the attributes,
    ``ingested_at``, ``ingest_seq``.

    ``ingest_seq`` (nullable int64) is the event's position in the service's durable ingest order
    (docs/architecture.md section 4): the restart replay reads from a statement's checkpointed position
    and feeds events in this order. Null for events that were not ingested by the live runtime (derived
    events, tables appended directly, rows written before the column existed).

    >>> record_schema(EventType("traffic", {"key": "string", "speed": "int"}, "key")).names
    ['id', 'ts', 'key', 'speed', 'ingested_at', 'ingest_seq']
    """
    cols = [pa.field("id", pa.int64(), nullable=False), pa.field("ts", TS_TYPE, nullable=False)]
    if etype.interval:
        cols.append(pa.field("ts_end", TS_TYPE, nullable=False))
    cols += [pa.field(a, ARROW_TYPES[k]) for a, k in etype.attributes.items()]
    cols.append(pa.field("ingested_at", TS_TYPE, nullable=False))
    cols.append(pa.field("ingest_seq", pa.int64()))
    return pa.schema(cols)


def table_schema(etype: EventType) -> pa.Schema:
    """Delta table schema of ``etype``: :func:`record_schema` plus the ``date`` partition column."""
    return record_schema(etype).append(pa.field("date", pa.string(), nullable=False))


def output_schema(types: Sequence[EventType]) -> pa.Schema:
    """The extractor's output schema over several types: the union of their attributes.

    Raises
    ------
    SchemaError
        When two types give one attribute name different types.
    """
    attrs: dict[str, str] = {}
    for t in types:
        for a, k in t.attributes.items():
            if attrs.setdefault(a, k) != k:
                raise SchemaError(f"attribute {a!r} is {attrs[a]} in one type and {k} in {t.name}: extract them apart")
    cols = [pa.field("id", pa.int64()), pa.field("type", pa.string()), pa.field("ts", pa.int64())]
    if any(t.interval for t in types):
        cols.append(pa.field("ts_end", pa.int64()))
    cols += [pa.field(a, pa.int64() if k == "timestamp" else ARROW_TYPES[k]) for a, k in attrs.items()]
    return pa.schema(cols)


def events_to_record(
    etype: EventType, events: Sequence[Event], *, ingested_at_us: int, ingest_seqs: Sequence[int] | None = None
) -> pa.Table:
    """Events of ``etype`` -> a record-shaped Arrow table (column by column: no per-row dicts).

    Parameters
    ----------
    ingested_at_us : int
        Wall-clock ingest time, int microseconds UTC, stored with every event.
    ingest_seqs : sequence of int, optional
        Each event's position in the durable ingest order (``ingest_seq``; None: nulls).

    Raises
    ------
    SchemaError
        For an event of another type, an attribute the type lacks, or a mistyped value.
    """
    known = etype.attributes
    for e in events:
        if e.type != etype.name:
            raise SchemaError(f"event {e.id} has type {e.type!r}, not {etype.name!r}")
        if not known.keys() >= e.attrs.keys():
            extra = sorted(set(e.attrs) - set(known))
            raise SchemaError(
                f"event {e.id} ({etype.name}): unknown attribute(s) {', '.join(extra)}; register them first"
            )
    schema = record_schema(etype)
    try:
        cols = [
            pa.array([e.id for e in events], pa.int64()),
            pa.array([e.ts for e in events], pa.int64()).cast(TS_TYPE),
        ]
        if etype.interval:
            cols.append(pa.array([e.ts_end for e in events], pa.int64()).cast(TS_TYPE))
        for attr, kind in known.items():
            values = [e.attrs.get(attr) for e in events]
            if kind == "timestamp":
                cols.append(pa.array(values, pa.int64()).cast(TS_TYPE))
            else:
                cols.append(pa.array(values, ARROW_TYPES[kind]))
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        raise SchemaError(f"events of type {etype.name} do not fit its schema: {exc}") from exc
    cols.append(pa.array([ingested_at_us] * len(events), pa.int64()).cast(TS_TYPE))
    if ingest_seqs is not None and len(ingest_seqs) != len(events):
        raise ValueError(f"{len(ingest_seqs)} ingest_seqs for {len(events)} events")
    cols.append(pa.array(ingest_seqs if ingest_seqs is not None else [None] * len(events), pa.int64()))
    return pa.Table.from_arrays(cols, schema=schema)


def normalize_record(etype: EventType, table: pa.Table, *, ingested_at_us: int) -> pa.Table:
    """A caller's Arrow table -> record shape: ``ts`` (and timestamp attributes) may be int64 microseconds.

    Missing attributes become nulls; ``ingested_at`` is added when absent.

    Raises
    ------
    SchemaError
        For a missing ``id``/``ts``, an unknown column, or a value that cannot be cast.
    """
    names = set(table.column_names)
    for required in ("id", "ts"):
        if required not in names:
            raise SchemaError(f"type {etype.name}: column {required!r} is required")
    if etype.interval and "ts_end" not in names:
        raise SchemaError(f"type {etype.name}: column 'ts_end' is required (an interval type)")
    extra = names - set(etype.attributes) - {"id", "ts", "ingested_at", "ingest_seq"}
    extra -= {"ts_end"} if etype.interval else set()
    if extra:
        raise SchemaError(f"type {etype.name}: unknown column(s) {', '.join(sorted(extra))}; register them first")
    n = table.num_rows
    if "ingested_at" not in names:
        table = table.append_column("ingested_at", pa.array([ingested_at_us] * n, pa.int64()).cast(TS_TYPE))
    try:
        return conform(table, record_schema(etype))
    except SchemaError as exc:
        raise SchemaError(f"type {etype.name}: {exc}") from exc


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns in its order: missing columns are nulls, values are cast.

    Used to replay WAL records written before a schema evolution.
    """
    cols = []
    for f in schema:
        if f.name in table.column_names:
            col = table.column(f.name)
            try:
                if pa.types.is_timestamp(f.type) and pa.types.is_integer(col.type):
                    col = col.cast(pa.int64()).cast(f.type)
                elif col.type != f.type:
                    col = col.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaError(f"column {f.name!r}: cannot cast {col.type} to {f.type}: {exc}") from exc
            cols.append(col)
        else:
            cols.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=schema.remove_metadata())


def with_date(table: pa.Table) -> pa.Table:
    """Append the ``date`` partition column: the UTC date of ``ts`` as ``YYYY-MM-DD``."""
    us = table.column("ts").cast(pa.int64())
    # integer floor division (no float64: past 2^53 us, about year 2255, floats lose the microseconds and
    # Arrow refuses the cast back); pc.divide truncates toward zero, so step back one day for negatives
    q = pc.divide(us, US_PER_DAY)
    days = pc.if_else(pc.less(pc.subtract(us, pc.multiply(q, US_PER_DAY)), 0), pc.subtract(q, 1), q).cast(pa.int32())
    return table.append_column("date", days.cast(pa.date32()).cast(pa.string()))


def record_to_output(etype: EventType, table: pa.Table) -> pa.Table:
    """A record-shaped table -> output shape (see the module docstring)."""
    n = table.num_rows
    cols = [table.column("id"), pa.repeat(pa.scalar(etype.name, pa.string()), n), table.column("ts").cast(pa.int64())]
    if etype.interval:
        cols.append(table.column("ts_end").cast(pa.int64()))
    for attr, kind in etype.attributes.items():
        col = table.column(attr) if attr in table.column_names else pa.nulls(n, ARROW_TYPES[kind])
        cols.append(col.cast(pa.int64()) if kind == "timestamp" else col)
    return pa.Table.from_arrays(cols, schema=output_schema([etype]))


def output_to_events(table: pa.Table) -> list[Event]:
    """Output-shaped rows -> :class:`engine.events.Event` objects (null attributes left out)."""
    cols = table.to_pydict()
    attrs = [c for c in table.column_names if c not in ("id", "type", "ts", "ts_end")]
    if not attrs:
        dicts: list[dict[str, Any]] = [{} for _ in range(table.num_rows)]
    elif any(table.column(a).null_count for a in attrs):
        dicts = [{a: v for a, v in zip(attrs, row) if v is not None} for row in zip(*(cols[a] for a in attrs))]
    else:  # one dict per row straight from zip (no test per value): archives without nulls convert ~2x faster
        dicts = [dict(zip(attrs, row)) for row in zip(*(cols[a] for a in attrs))]
    ends = cols.get("ts_end")  # null for the point events of a mixed extract
    if ends is None:
        return [Event(i, t, ts, d) for i, t, ts, d in zip(cols["id"], cols["type"], cols["ts"], dicts)]
    return [Event(i, t, ts, d, e) for i, t, ts, d, e in zip(cols["id"], cols["type"], cols["ts"], dicts, ends)]


def load_catalog(root: str | Path) -> dict[str, EventType]:
    """The event types registered under an archive root (empty when none)."""
    path = Path(root) / CATALOG_FILE
    if not path.exists():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return {name: EventType.from_catalog(name, spec) for name, spec in data.items()}


def save_catalog(root: str | Path, types: Mapping[str, EventType]) -> None:
    """Write the catalog atomically (temp file, fsync, rename)."""
    path = Path(root) / CATALOG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({n: t.catalog_json() for n, t in sorted(types.items())}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def merge_types(known: Mapping[str, EventType], new: Iterable[EventType]) -> dict[str, EventType]:
    """``known`` with each of ``new`` registered or evolved into it."""
    out = dict(known)
    for t in new:
        out[t.name] = out[t.name].evolve(t) if t.name in out else t
    return out
