"""engine.io: event files in (CSV, JSONL, bench), matches out."""
from __future__ import annotations

import io
import itertools
import json

import pytest

from bench.streams import bench_csv, generate_events
from engine.events import Event
from engine.io import (
    EventFileError,
    TimestampParser,
    load_bench_stream,
    read_events,
    write_matches,
)
from engine.match import Match


def test_csv_header_fields_and_typed_attributes(write_file):
    text = "id,type,ts,sym,price,qty,ok\n10,Stock,1500,IBM,12.5,3,true\n11,Stock,1501,X,-1e2,-4,False\n"
    path = write_file("ev.csv", text)
    assert list(read_events(path)) == [
        Event(10, "Stock", 1_500_000, {"sym": "IBM", "price": 12.5, "qty": 3, "ok": True}),
        Event(11, "Stock", 1_501_000, {"sym": "X", "price": -100.0, "qty": -4, "ok": False}),
    ]


def test_csv_columns_in_any_order_and_empty_cell_omits_attribute(write_file):
    path = write_file("ev.csv", "ts,price,type,id\n1000,,A,1\n")
    assert list(read_events(path)) == [Event(1, "A", 1_000_000, {})]


def test_csv_without_id_numbers_rows_from_one_skipping_blank_lines(write_file):
    path = write_file("ev.csv", "type,ts\nA,1\n\nB,2\n")
    assert [(e.id, e.type) for e in read_events(path)] == [(1, "A"), (2, "B")]


def test_iso_timestamps_with_offsets_are_converted_to_utc_micros(write_file):
    path = write_file(
        "ev.csv", "type,ts\nA,1970-01-01T00:00:01.000250Z\nA,1970-01-01T02:00:00+02:00\nA,2024-03-01T12:00:00-05:00\n"
    )
    assert [e.ts for e in read_events(path)] == [1_000_250, 0, 1_709_312_400_000_000]


def test_iso_timestamp_without_offset_is_rejected_with_line(write_file):
    path = write_file("ev.csv", "type,ts\nA,1\nA,2024-01-01T00:00:00\n")
    with pytest.raises(EventFileError, match=r"line 3, column 2 'ts': ts .* has no UTC offset") as err:
        list(read_events(path))
    assert err.value.line == 3


def test_auto_unit_reads_integers_as_epoch_ms_and_decimals_as_seconds(write_file):
    ms = write_file("ms.csv", "type,ts\nA,1700000000123\n")
    s = write_file("s.csv", "type,ts\nA,12.345\nA,13.5\n")
    assert [e.ts for e in read_events(ms)] == [1_700_000_000_123_000]
    assert [e.ts for e in read_events(s)] == [12_345_000, 13_500_000]


def test_auto_unit_refuses_a_file_mixing_ms_and_seconds(write_file):
    path = write_file("ev.csv", "type,ts\nA,12.345\nA,13\n")
    with pytest.raises(EventFileError, match=r"line 3, column 2 'ts': .*earlier rows' epoch seconds"):
        list(read_events(path))


@pytest.mark.parametrize(
    ("unit", "raw", "expected"),
    [("ms", "1500", 1_500_000), ("ms", "1.5", 1_500), ("s", "2", 2_000_000), ("s", "0.000001", 1), ("us", "7", 7)],
)
def test_explicit_ts_unit(unit, raw, expected):
    assert TimestampParser(unit)(raw) == expected


@pytest.mark.parametrize("raw", ["1.0000001", ""])
def test_ts_finer_than_a_microsecond_or_empty_is_rejected(raw):
    with pytest.raises(ValueError):
        TimestampParser("s")(raw)


def test_jsonl_flat_and_nested_attributes(write_file):
    path = write_file(
        "ev.jsonl",
        '{"id": 3, "type": "Pass", "ts": "1970-01-01T00:00:01Z", "car": "X1", "speed": 80.5}\n'
        "\n"
        '{"type": "Pass", "ts": "1970-01-01T00:00:02Z", "attrs": {"car": "X2", "ok": true, "gone": null}}\n',
    )
    assert list(read_events(path)) == [
        Event(3, "Pass", 1_000_000, {"car": "X1", "speed": 80.5}),
        Event(2, "Pass", 2_000_000, {"car": "X2", "ok": True}),
    ]


def test_format_is_sniffed_when_the_suffix_says_nothing(write_file):
    path = write_file("events.txt", '{"type": "A", "ts": 5}\n')
    assert list(read_events(path)) == [Event(1, "A", 5_000, {})]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"type": "A", "ts": 1}\n{"type": "A", "ts": 2,}\n', "invalid JSON"),
        ('{"type": "A", "ts": 1}\n[1, 2]\n', "expected a JSON object"),
        ('{"type": "A", "ts": 1}\n{"ts": 2}\n', "missing or empty 'type'"),
        ('{"type": "A", "ts": 1}\n{"type": "A"}\n', "missing 'ts'"),
        ('{"type": "A", "ts": 1}\n{"type": "A", "ts": true}\n', "ts must be a number"),
        ('{"type": "A", "ts": 1}\n{"type": "A", "ts": 2, "id": "x"}\n', "id must be an integer"),
        ('{"type": "A", "ts": 1}\n{"type": "A", "ts": 2, "v": [1]}\n', "nested objects and arrays"),
    ],
)
def test_bad_jsonl_rows_report_their_line(write_file, text, reason):
    path = write_file("ev.jsonl", text)
    with pytest.raises(EventFileError, match=f"ev.jsonl line 2(, column '[a-z]+')?: {reason}"):
        list(read_events(path))


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("", 1, "empty file"),
        ("id,type,price\n1,A,3\n", 1, "header lacks 'ts'"),
        ("type,ts,a,a\n", 1, "duplicate column 'a'"),
        ("type,ts\nA,1\nA,2,3\n", 3, "expected 2 fields, got 3"),
        ("type,ts\nA,1\n,2\n", 3, "empty type"),
        ("id,type,ts\n1,A,1\nx,A,2\n", 3, "id must be an integer"),
        ("type,ts\nA,1\nA,yesterday\n", 3, "neither a number nor an ISO-8601"),
    ],
)
def test_bad_csv_rows_report_their_line(write_file, text, line, reason):
    path = write_file("ev.csv", text)
    with pytest.raises(EventFileError, match=reason) as err:
        list(read_events(path))
    assert err.value.line == line
    assert str(err.value).startswith(f"{path} line {line}")


def test_event_file_error_is_a_value_error():
    assert issubclass(EventFileError, ValueError)


def test_bench_stream_ids_are_row_numbers_and_ts_are_micros(write_file):
    path = write_file("s.csv", "type,key,ts,price\nA,7,0.001,12.30\nC,0,1.250,99.99\n")
    assert load_bench_stream(path) == [
        Event(1, "A", 1_000, {"key": 7, "price": 12.3}),
        Event(2, "C", 1_250_000, {"key": 0, "price": 99.99}),
    ]


def test_bench_stream_rejects_other_headers_and_bad_rows(write_file):
    with pytest.raises(EventFileError, match="line 1: expected the bench header"):
        load_bench_stream(write_file("a.csv", "id,type,ts\n"))
    with pytest.raises(EventFileError, match="line 3: bad bench row"):
        load_bench_stream(write_file("b.csv", "type,key,ts,price\nA,1,0.001,1.00\nA,x,0.002,1.00\n"))


def test_generated_bench_events_equal_the_loaded_csv(tmp_path):
    path = bench_csv(500, seed=42, cache_dir=tmp_path)
    assert load_bench_stream(path) == generate_events(500, seed=42)
    assert bench_csv(500, seed=42, cache_dir=tmp_path) == path  # cached


def test_generic_reader_agrees_with_bench_loader(tmp_path):
    path = bench_csv(200, seed=7, cache_dir=tmp_path)
    assert list(read_events(path)) == load_bench_stream(path)


def test_generated_bench_events_are_strictly_increasing_and_deterministic():
    events = generate_events(1_000, types=4, keys=10, seed=3)
    assert [e.id for e in events] == list(range(1, 1_001))
    assert all(a.ts < b.ts for a, b in itertools.pairwise(events))
    assert {e.type for e in events} <= {"A", "B", "C", "D"}
    assert events == generate_events(1_000, types=4, keys=10, seed=3)


def test_write_matches_writes_one_json_object_per_line():
    a, b = Event(1, "A", 10, {}), Event(2, "B", 20, {})
    matches = [Match("q", {"a": (a,), "b": (b,)}, 10, 20, {"n": 1}), Match(None, {"a": (a,), "b": ()}, 10, 10)]
    out = io.StringIO()
    assert write_matches(matches, out) == 2
    lines = out.getvalue().splitlines()
    assert [json.loads(s) for s in lines] == [
        {"query": "q", "events": {"a": [1], "b": [2]}, "start": 10, "end": 20, "fields": {"n": 1}},
        {"query": None, "events": {"a": [1], "b": []}, "start": 10, "end": 10, "fields": {}},
    ]
