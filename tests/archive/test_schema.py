"""Event type schemas: Arrow shapes, typed conversion, evolution, the catalog."""
from __future__ import annotations

import pyarrow as pa
import pytest

from archive.schema import (
    conform,
    events_to_record,
    load_catalog,
    normalize_record,
    output_to_events,
    record_schema,
    record_to_output,
    save_catalog,
    table_schema,
    with_date,
)
from engine.event_type import EventType, SchemaError
from engine.events import Event

T = EventType(
    "traffic", {"key": "string", "speed": "int", "avg": "float", "ok": "bool", "seen": "timestamp"}, partition_key="key"
)


def test_record_and_table_schemas_have_typed_columns_and_utc_timestamps():
    s = table_schema(T)
    assert s.names == ["id", "ts", "key", "speed", "avg", "ok", "seen", "ingested_at", "ingest_seq", "date"]
    assert s.field("ingest_seq").type == pa.int64() and s.field("ingest_seq").nullable
    assert s.field("id").type == pa.int64()
    assert s.field("ts").type == pa.timestamp("us", tz="UTC")
    assert s.field("seen").type == pa.timestamp("us", tz="UTC")
    assert s.field("ingested_at").type == pa.timestamp("us", tz="UTC")
    assert s.field("date").type == pa.string()
    types = [s.field(a).type for a in ("key", "speed", "avg", "ok")]
    assert types == [pa.string(), pa.int64(), pa.float64(), pa.bool_()]


def test_events_round_trip_through_record_and_output_shapes():
    events = [
        Event(1, "traffic", 1_000_000, {"key": "a", "speed": 3, "avg": 1.5, "ok": True, "seen": 999}),
        Event(2, "traffic", 86_400_000_000, {"key": "b"}),
    ]
    rec = events_to_record(T, events, ingested_at_us=5)
    assert rec.schema == record_schema(T)
    assert rec.column("ingested_at").cast(pa.int64()).to_pylist() == [5, 5]
    assert output_to_events(record_to_output(T, rec)) == events


def test_date_partition_is_the_utc_day_of_ts():
    times = (0, 86_399_999_999, 86_400_000_000, -1)
    rec = events_to_record(T, [Event(1, "traffic", t, {}) for t in times], ingested_at_us=0)
    assert with_date(rec).column("date").to_pylist() == ["1970-01-01", "1970-01-01", "1970-01-02", "1969-12-31"]


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (Event(1, "traffic", 0, {"nope": 1}), "unknown attribute(s) nope"),
        (Event(1, "traffic", 0, {"speed": "fast"}), "do not fit its schema"),
        (Event(1, "parking", 0, {}), "has type 'parking'"),
    ],
)
def test_events_that_do_not_fit_are_refused(event, message):
    with pytest.raises(SchemaError, match=message.replace("(", r"\(").replace(")", r"\)")):
        events_to_record(T, [event], ingested_at_us=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "bad name"}, "must match"),
        ({"name": "t", "attributes": {"ts": "int"}}, "reserved"),
        ({"name": "t", "attributes": {"a": "decimal"}}, "unknown type"),
        ({"name": "t", "attributes": {"a": "int"}, "partition_key": "b"}, "not an attribute"),
    ],
)
def test_invalid_event_types_are_refused(kwargs, message):
    with pytest.raises(SchemaError, match=message):
        EventType(**kwargs)


def test_evolution_adds_attributes_and_refuses_type_or_key_changes():
    newer = T.evolve(EventType("traffic", {"status": "string", "speed": "int"}))
    assert list(newer.attributes) == [*T.attributes, "status"]
    assert newer.partition_key == "key"
    with pytest.raises(SchemaError, match="cannot change it to float"):
        T.evolve(EventType("traffic", {"speed": "float"}))
    with pytest.raises(SchemaError, match="key"):
        T.evolve(EventType("traffic", {"speed": "int"}, partition_key="speed"))


def test_old_records_conform_to_an_evolved_schema_with_null_new_columns():
    old = events_to_record(T, [Event(1, "traffic", 0, {"key": "a"})], ingested_at_us=0)
    newer = T.evolve(EventType("traffic", {"status": "string"}))
    out = conform(old, record_schema(newer))
    assert out.schema == record_schema(newer)
    assert out.column("status").to_pylist() == [None]


def test_normalize_accepts_int_micros_and_fills_missing_attributes():
    table = pa.table({"id": [1, 2], "ts": [10, 20], "speed": [1, 2], "seen": [5, 6]})
    rec = normalize_record(T, table, ingested_at_us=7)
    assert rec.schema == record_schema(T)
    assert rec.column("ts").cast(pa.int64()).to_pylist() == [10, 20]
    assert rec.column("key").to_pylist() == [None, None]
    with pytest.raises(SchemaError, match="unknown column"):
        normalize_record(T, table.append_column("x", pa.array([1, 2])), ingested_at_us=7)


def test_catalog_round_trips(tmp_path):
    save_catalog(tmp_path, {"traffic": T})
    assert load_catalog(tmp_path) == {"traffic": T}
    assert load_catalog(tmp_path / "none") == {}


def test_date_of_timestamps_past_2_53_us_and_before_1970_is_exact() -> None:
    """Issue 13.1: past 2^53 us (year ~2255) the date went through float64 and the flush failed forever."""
    import pyarrow as pa

    from archive.schema import with_date

    us = [-62_135_596_800_000_000, -1, 0, 86_399_999_999, 253_402_300_799_999_999, (1 << 53) + 1]
    table = pa.table({"ts": pa.array(us, pa.timestamp("us", tz="UTC"))})
    assert with_date(table).column("date").to_pylist() == [
        "0001-01-01", "1969-12-31", "1970-01-01", "1970-01-01", "9999-12-31", "2255-06-05",
    ]


# ------------------------------------------------------------------ interval types (issue 15)

EPISODE = EventType("episode", {"key": "string", "low": "float"}, partition_key="key", interval=True)


def test_interval_types_store_ts_end_and_round_trip(tmp_path) -> None:
    assert record_schema(EPISODE).names == ["id", "ts", "ts_end", "key", "low", "ingested_at", "ingest_seq"]
    events = [Event(1, "episode", 0, {"key": "a", "low": 3.5}, 600_000_000), Event(2, "episode", 5, {"key": "b"}, 6)]
    rec = events_to_record(EPISODE, events, ingested_at_us=5)
    back = output_to_events(record_to_output(EPISODE, rec))
    assert back == events and [e.ts_end for e in back] == [600_000_000, 6]
    # a point type next to it in one extract: its events get a null ts_end, read back as point events
    points = record_to_output(T, events_to_record(T, [Event(3, "traffic", 7, {"key": "c"})], ingested_at_us=5))
    assert "ts_end" not in points.column_names
    save_catalog(tmp_path, {"episode": EPISODE, "traffic": T})
    assert load_catalog(tmp_path) == {"episode": EPISODE, "traffic": T}


def test_an_interval_type_cannot_become_a_point_type_and_needs_ts_end() -> None:
    with pytest.raises(SchemaError, match="interval type"):
        EPISODE.evolve(EventType("episode", {"extra": "int"}))
    with pytest.raises(SchemaError, match="ts_end"):
        normalize_record(EPISODE, pa.table({"id": [1], "ts": [0], "key": ["a"]}), ingested_at_us=1)
    with pytest.raises(SchemaError, match="reserved"):
        EventType("x", {"ts_end": "int"})
