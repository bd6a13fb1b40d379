"""Typed event files: one type per column, one rule for missing values, CSV = JSONL = Parquet."""
from __future__ import annotations

import io
import json
import math
import random
import subprocess
import sys

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.compiler import compile_query
from engine.events import Event
from engine.io import EventFileError, open_event_file, read_events
from engine.match import Match
from engine.match_files import MatchWriter, match_line
from engine.matcher import Matcher

HEX = ["060030", "3964e8", "86e430", "3e4082", "4ca7b5"]


def _matches(path, query, **kw):
    m = Matcher(compile_query(query))
    out = []
    for e in read_events(path, **kw):
        out.extend(match_line(x) for x in m.push(e))
    out.extend(match_line(x) for x in m.flush())
    return out


def _rows(n=300, seed=7):
    """Flight-like rows with hex ids, missing altitudes (as None) and NaN speeds."""
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        alt = rnd.choice([None, 5000, 5000.0, 6000.5, float("nan")])
        speed = rnd.choice([None, rnd.uniform(100, 300), float("nan")])
        rows.append({"type": rnd.choice("ABC"), "ts": 1_000 * (i + 1), "icao": rnd.choice(HEX), "alt": alt,
                     "speed": speed, "ok": rnd.choice([True, False, None])})
    return rows


def _write_all(tmp_path, rows, csv_nan="NaN", json_nan="NaN"):
    """The same rows as CSV (empty cells / NaN text), JSONL (null / NaN) and Parquet (null / NaN)."""
    def cell(v):
        if v is None:
            return ""
        if isinstance(v, float) and math.isnan(v):
            return csv_nan
        if isinstance(v, bool):
            return "true" if v else "false"
        return str(v)

    names = list(rows[0])
    csv_path = tmp_path / "ev.csv"
    csv_path.write_text(",".join(names) + "\n" + "".join(",".join(cell(r[n]) for n in names) + "\n" for r in rows))
    jsonl = tmp_path / "ev.jsonl"
    jsonl.write_text("".join(json.dumps(r).replace("NaN", json_nan) + "\n" for r in rows))
    parquet = tmp_path / "ev.parquet"
    pq.write_table(pa.table({
        "type": pa.array([r["type"] for r in rows]),
        "ts": pa.array([r["ts"] for r in rows], pa.int64()),
        "icao": pa.array([r["icao"] for r in rows]),
        "alt": pa.array([r["alt"] for r in rows], pa.float64()),
        "speed": pa.array([r["speed"] for r in rows], pa.float64()),
        "ok": pa.array([r["ok"] for r in rows], pa.bool_()),
    }), parquet)
    return csv_path, jsonl, parquet


QUERIES = [
    "PATTERN SEQ(A a, B b, C c) WHERE a.alt != 5000 AND b.speed > 150 PARTITION BY icao WITHIN 20 s",
    "PATTERN SEQ(A a, B+ b[], C c) WHERE b[i].speed > b[i-1].speed AND NOT (c.alt = 5000) "
    "PARTITION BY icao WITHIN 10 s",
    "PATTERN SEQ(A a, !B n, C c) WHERE n.ok = true AND c.alt >= a.alt WITHIN 5 s",
]


@pytest.mark.parametrize("query", QUERIES)
def test_csv_jsonl_and_parquet_copies_give_the_same_matches(tmp_path, query):
    csv_path, jsonl, parquet = _write_all(tmp_path, _rows())
    # Parquet ts integers are ms like the others (auto unit)
    expected = _matches(csv_path, query)
    assert expected, "the query should find something"
    assert _matches(jsonl, query) == expected
    assert _matches(parquet, query) == expected


def test_missing_values_behave_the_same_in_every_format(tmp_path):
    rows = [{"type": "A", "ts": 1, "icao": "x", "alt": a, "speed": 1.0, "ok": True} for a in (None, float("nan"))]
    rows.append({"type": "A", "ts": 3, "icao": "x", "alt": 7000.0, "speed": 1.0, "ok": True})
    for csv_nan, json_nan in (("NaN", "NaN"), ("nan", "null"), ("null", "NaN"), ("NULL", "null")):
        sub = tmp_path / f"{csv_nan}-{json_nan}"
        sub.mkdir()
        for path in _write_all(sub, rows, csv_nan, json_nan):
            events = list(read_events(path))
            assert ["alt" in e.attrs for e in events] == [False, False, True], path
    # a comparison with a missing value is false, whichever way it was written
    csv_path, jsonl, parquet = _write_all(tmp_path, rows)
    q = "PATTERN SEQ(A a) WHERE a.alt != 5000"
    assert len(_matches(csv_path, q)) == len(_matches(jsonl, q)) == len(_matches(parquet, q)) == 1


def test_hex_identifiers_stay_strings_in_every_row(write_file):
    path = write_file("ev.csv", "type,ts,icao\n" + "".join(f"A,{i + 1},{h}\n" for i, h in enumerate(HEX)))
    source = open_event_file(path)
    assert source.column_types == {"icao": "string"}
    assert [e.attrs["icao"] for e in source.events()] == HEX
    # '86e430' and '3e4082' are two keys, not one 'inf'
    m = Matcher(compile_query("PATTERN SEQ(A a) PARTITION BY icao"))
    for e in read_events(path):
        m.push(e)
    assert m.stats()["keys"] == len(HEX)


@pytest.mark.parametrize(
    ("values", "kind", "first"),
    [
        (["1", "2", "-3"], "int", 1),
        (["1", "2.5", "1e3"], "float", 1.0),
        (["007", "8"], "string", "007"),  # a leading zero: an identifier
        (["1e400", "2"], "string", "1e400"),  # not a finite float
        (["99999999999999999999", "1"], "string", "99999999999999999999"),
        (["true", "False"], "bool", True),
        (["true", "1"], "string", "true"),
        (["x", ""], "string", "x"),
    ],
)
def test_a_column_is_typed_from_all_its_values(write_file, values, kind, first):
    path = write_file("ev.csv", "type,ts,v\n" + "".join(f"A,{i + 1},{v}\n" for i, v in enumerate(values)))
    source = open_event_file(path)
    assert source.column_types == {"v": kind}
    assert next(source.events()).attrs["v"] == first


def test_typed_header_declares_column_types(write_file):
    path = write_file("ev.csv", "type,ts:timestamp,key:string,speed:float,n:int,ok:bool,seen:timestamp\n"
                                "A,1.5,0042,3,7,TRUE,2024-01-01T00:00:00Z\n")
    [e] = list(read_events(path))
    assert e == Event(1, "A", 1_500_000, {"key": "0042", "speed": 3.0, "n": 7, "ok": True,
                                          "seen": 1_704_067_200_000_000})
    assert type(e.attrs["speed"]) is float


@pytest.mark.parametrize(
    ("header", "cell", "col", "reason"),
    [
        ("n:int", "1.5", 3, "'1.5' is not an int"),
        ("n:int", "99999999999999999999", 3, "out of the int64 range"),
        ("n:float", "fast", 3, "'fast' is not a float"),
        ("n:bool", "yes", 3, "is not a bool"),
        ("n:timestamp", "noon", 3, "neither a number nor an ISO-8601"),
    ],
)
def test_a_value_that_does_not_fit_its_declared_column_is_an_error_with_line_and_column(
    write_file, header, cell, col, reason
):
    good = "true" if header.endswith("bool") else "1"
    path = write_file("ev.csv", f"type,ts,{header}\nA,1,{good}\n\nA,2,{cell}\n")
    with pytest.raises(EventFileError, match=reason) as err:
        open_event_file(path)
    assert (err.value.line, err.value.column, err.value.position) == (4, "n", col)
    assert str(err.value).startswith(f"{path} line 4, column {col} 'n': ")


def test_unknown_type_in_header_is_an_error(write_file):
    path = write_file("ev.csv", "type,ts,n:integer\nA,1,1\n")
    with pytest.raises(EventFileError, match=r"line 1: column 'n': unknown type 'integer'"):
        open_event_file(path)


def test_jsonl_schema_declares_types_and_mismatch_is_an_error_with_line(write_file):
    schema = write_file("schema.json", '{"key": "string", "n": "int"}')
    from engine.event_files import load_schema

    types = load_schema(schema)
    first = '{"type": "A", "ts": 1, "key": "060030", "n": 1}\n'
    path = write_file("ev.jsonl", first + '{"type": "A", "ts": 2, "key": "x", "n": 2.5}\n')
    with pytest.raises(EventFileError, match=r"line 2, column 'n': 2.5 is not an int"):
        open_event_file(path, schema=types)
    path = write_file("ok.jsonl", first + '{"type": "A", "ts": 2, "key": "x"}\n')
    assert [e.attrs for e in read_events(path, schema=types)] == [{"key": "060030", "n": 1}, {"key": "x"}]


def test_jsonl_column_changing_type_is_an_error_with_line(write_file):
    path = write_file("ev.jsonl", '{"type": "A", "ts": 1, "k": 60030}\n\n{"type": "A", "ts": 2, "k": "3964e8"}\n')
    with pytest.raises(EventFileError, match=r"line 3, column 'k': a string, but line 1 has a number"):
        open_event_file(path)


def test_jsonl_ints_and_floats_make_a_float_column(write_file):
    path = write_file("ev.jsonl", '{"type": "A", "ts": 1, "x": 1}\n{"type": "A", "ts": 2, "x": 2.5}\n')
    assert [e.attrs["x"] for e in read_events(path)] == [1.0, 2.5]


def test_parquet_timestamps_and_row_errors(tmp_path):
    path = tmp_path / "ev.parquet"
    ts = pa.array([1_000_000, 2_000_000], pa.timestamp("us", "UTC"))
    pq.write_table(pa.table({"type": ["A", "B"], "ts": ts, "id": [5, 9], "x": [1.5, None]}), path)
    assert list(read_events(path)) == [Event(5, "A", 1_000_000, {"x": 1.5}), Event(9, "B", 2_000_000, {})]
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"type": ["A", ""], "ts": [1, 2]}), bad)
    with pytest.raises(EventFileError, match=r"row 2, column 'type': empty type"):
        open_event_file(bad)


def test_sort_orders_by_ts_then_id_and_keeps_lines(write_file):
    path = write_file("ev.csv", "id,type,ts\n3,A,2\n1,A,2\n2,A,1\n")
    source = open_event_file(path)
    source.sort()
    assert [e.id for e in source.events()] == [2, 1, 3]
    assert [source.line(i) for i in range(3)] == [4, 3, 2]


def test_match_line_equals_orjson_of_to_json():
    a, b1, b2, c = (Event(i, t, i * 10, {}) for i, t in [(1, "A"), (2, "B"), (3, "B"), (4, "C")])
    layouts = [
        (("a", "b", "c"), ("a", "b", "c"), (False, True, False)),
        (("a", "b", "c", "d"), ("a", "c"), (False, False)),
        (("x%d", 'q"'), ("x%d", 'q"'), (False, False)),
    ]
    envs = [(a, (b1, b2), c), (a, c), (a, c)]
    for layout, env in zip(layouts, envs):
        for name, fields in [(None, None), ("q%s", {"k": 1.5, "s": "é"}), ("n", {})]:
            m = Match(name, None, 10, 40, fields, layout, env)
            expected = orjson.dumps(m.to_json(), option=orjson.OPT_NON_STR_KEYS).decode()
            assert match_line(m) == expected


@pytest.mark.parametrize("seed", range(4))
def test_match_writer_jsonl_equals_orjson_lines_across_layouts_runs_and_batches(seed):
    """Matches of an all-single layout are formatted by one literal ``bytes %`` each (engine.match_files, natively
    in the compiled build): the bytes equal one orjson line per match, whatever the mix of layouts, arities (1-6),
    names, fields, call sizes and int64s (negative, at the compiled build's 62-bit boundary and int64's)."""
    rnd = random.Random(seed)
    edges = [0, 9, 10, 99, 100, -1, -10, (1 << 62) - 1, 1 << 62, -(1 << 62), -(1 << 62) - 1, (1 << 63) - 1,
             -(1 << 63)]
    events = [Event(i, "A", i, {}) for i in [*range(50), *edges]]
    layouts = []
    for k in range(1, 7):
        names = tuple(f"v{i}" for i in range(k))
        layouts.append((names, names, (False,) * k))
    layouts += [(("a", "b"), ("a", "b"), (False, True)), (("x%d", 'q"'), ("x%d", 'q"'), (False, False)),
                (("a", "b", "c"), ("a", "c"), (False, False)), (("é", "b"), ("é", "b"), (False, False))]
    ms = []
    while len(ms) < 6_000:
        layout = rnd.choice(layouts)
        name = rnd.choice([None, "q", "q%s", "qü"])  # non-ASCII names: the templates are UTF-8 bytes
        fields = rnd.choice([None, None, None, {"f": rnd.random()}])
        for _ in range(rnd.choice([1, 3, 1_500])):  # long runs cross the 1,024-line blocks
            env = tuple((rnd.choice(events), rnd.choice(events)) if kl else rnd.choice(events) for kl in layout[2])
            start, end = (rnd.choice(edges) if rnd.random() < 0.05 else rnd.randrange(10**12) for _ in "se")
            ms.append(Match(name, None, start, end, fields, layout, env))
    out = io.BytesIO()
    w = MatchWriter(out, batch=rnd.choice([1, 100, 5_000, 65_536]))
    i = 0
    while i < len(ms):
        n = rnd.choice([1, 7, 300, 2_000, len(ms)])  # len(ms): the whole rest in one call (lace stream)
        w.write(ms[i:i + n] if rnd.random() < 0.8 else iter(ms[i:i + n]))
        i += n
    w.flush()
    # after writing: to_json() builds and keeps a match's events, which takes it off the fast path
    expected = b"".join(orjson.dumps(m.to_json(), option=orjson.OPT_NON_STR_KEYS) + b"\n" for m in ms)
    assert out.getvalue() == expected
    assert w.written == len(ms)


def test_match_writer_parquet_holds_the_jsonl_content(tmp_path):
    a, b, c = (Event(i, t, i, {}) for i, t in [(1, "A"), (2, "B"), (3, "C")])
    layout = (("a", "b"), ("a", "b"), (False, True))
    ms = [Match("q", None, 1, 3, {"f": 1}, layout, (a, (b, c))), Match("q", None, 2, 3, {"f": 2}, layout, (b, (c,)))]
    with MatchWriter(tmp_path / "m.parquet", "parquet", batch=1) as w:
        w.write(ms)
    assert pq.read_table(tmp_path / "m.parquet").to_pylist() == [m.to_json() for m in ms]


def test_lace_match_formats_and_schema(tmp_path):
    ev = tmp_path / "ev.jsonl"
    ev.write_text('{"type": "A", "ts": 1, "k": "007"}\n{"type": "B", "ts": 2, "k": "007"}\n')
    q = tmp_path / "q.lql"
    q.write_text("PATTERN SEQ(A a, B b) PARTITION BY k")
    schema = tmp_path / "s.json"
    schema.write_text('{"k": "string"}')
    base = [sys.executable, "-m", "cli", "match", "-q", str(q), "-e", str(ev), "--schema", str(schema)]
    out = subprocess.run(base, capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == {"query": None, "events": {"a": [1], "b": [2]}, "start": 1000, "end": 2000, "fields": {}}
    pq_out = tmp_path / "m.parquet"
    subprocess.run([*base, "--format", "parquet", "--out", str(pq_out)], check=True)
    expected = json.loads(out)
    del expected["fields"]  # no RETURN: no fields column
    assert pq.read_table(pq_out).to_pylist() == [expected]
    schema.write_text('{"k": "int"}')
    r = subprocess.run(base, capture_output=True, text=True)
    assert r.returncode == 2 and "line 1, column 'k': a string, but the column is int" in r.stderr


@pytest.mark.parametrize("k", range(1, 9))
def test_every_attribute_count_builds_the_same_events(write_file, k):
    names = [f"x{i}" for i in range(k)]
    rows = [[str(r * 10 + i) if (r + i) % 3 else "" for i in range(k)] for r in range(4)]
    body = "".join(f"A,{r + 1}," + ",".join(row) + "\n" for r, row in enumerate(rows))
    text = "type,ts," + ",".join(names) + "\n" + body
    got = [e.attrs for e in read_events(write_file("ev.csv", text))]
    assert got == [{n: int(v) for n, v in zip(names, row) if v} for row in rows]


def test_match_writer_parquet_fast_columns_equal_the_general_ones(tmp_path):
    evs = [Event(i, "T", i, {}) for i in range(1, 7)]
    layout = (("a", "b", "c"), ("a", "b", "c"), (False, False, False))
    ms = [Match("q", None, i, i + 2, None, layout, tuple(evs[i : i + 3])) for i in range(4)]
    with MatchWriter(tmp_path / "fast.parquet", "parquet", batch=3) as w:
        w.write(ms)
    got = pq.read_table(tmp_path / "fast.parquet")
    expected = [{k: v for k, v in m.to_json().items() if k != "fields"} for m in ms]
    assert got.to_pylist() == expected
    assert got.schema.field("events").type == pa.struct([(v, pa.list_(pa.int64())) for v in "abc"])


def test_dictionary_encoded_string_columns_give_the_same_events_and_gc_is_restored() -> None:
    """An EventTable may hold string columns dictionary-encoded (a Parquet read with ``read_dictionary``):
    the same events, each distinct string one object; building a batch pauses the cyclic GC and restores
    it as it was (on stays on, off stays off)."""
    import gc

    from engine.event_files import EventTable

    keys = pa.array(["x7", "y", None, "x7", "y"])
    types = pa.array(["A", "B", "A", "A", "B"])
    ts = pa.array([1, 2, 3, 4, 5], pa.int64())
    plain = EventTable(None, types, ts, {"key": keys}, {"key": "string"})
    encoded = EventTable(None, types.dictionary_encode(), ts, {"key": keys.dictionary_encode()}, {"key": "string"})
    (want,) = plain.batches()
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            gc.enable() if enabled else gc.disable()
            (got,) = encoded.batches()
            assert gc.isenabled() is enabled
            assert got == want and [e.attrs for e in got] == [e.attrs for e in want]
            assert "key" not in got[2].attrs and got[0].attrs["key"] is got[3].attrs["key"]
    finally:
        gc.enable() if was else gc.disable()


def test_reading_an_event_file_does_not_import_pandas(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """pyarrow imports pandas (0.2 s, 45 MB) for conversions of Python objects and for ``to_numpy``; reading a
    CSV with string, int, float and missing values into events must not take that path (issue 17)."""
    csv = tmp_path / "e.csv"
    csv.write_text("type,ts,key,n,x\nA,1,k1,5,1.5\nB,2,k2,,2.5\nA,3,k1,7,\n")
    code = (
        "import sys; from engine.io import open_event_file; "
        f"events = [e for b in open_event_file({str(csv)!r}).batches() for e in b]; "
        "assert [e.attrs for e in events] == [{'key': 'k1', 'n': 5, 'x': 1.5}, {'key': 'k2', 'x': 2.5}, "
        "{'key': 'k1', 'n': 7}], events; "
        "print('pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_column_kept_a_string_by_a_minority_of_values_is_reported(tmp_path):
    path = tmp_path / "ev.csv"
    path.write_text("type,ts,icao,alt,ok\nA,1,060030,100,true\n\nA,2,3964e8,200.5,false\nA,3,4ca7b5,high,maybe\n"
                    "A,4,86e430,,true\n")
    source = open_event_file(path)
    source.sort()
    assert source.column_types == {"icao": "string", "alt": "string", "ok": "string"}
    alt, ok = source.warnings()  # the hex identifiers (mostly not numbers) stay a string without a word
    assert alt.startswith(f"{path} line 5, column 4 'alt': 'high' is not a float like most of its values, so the "
                          "whole column is read as strings")
    assert '--schema (e.g. {"alt": "float"}) or a typed header (alt:float)' in alt
    assert ok.startswith(f"{path} line 5, column 5 'ok': 'maybe' is not a bool")
    typed = tmp_path / "typed.csv"
    typed.write_text("type,ts,alt:string\nA,1,100\nA,2,high\nA,3,300\n")
    assert open_event_file(typed).warnings() == []
    assert open_event_file(path, schema={"alt": "string", "ok": "string"}).warnings() == []
    with pytest.raises(EventFileError, match="line 5, column 4 'alt'"):
        open_event_file(path, schema={"alt": "float"})


def test_csv_ints_with_a_plus_sign(tmp_path):
    """A leading ``+`` on ids, ts and int attributes is read as the number (the cast needs it removed); a column
    without one reads the same (the removal only runs when some value has one)."""
    p = tmp_path / "ev.csv"
    p.write_text("id,type,ts,k,n\n+1,A,+1500,+7,3\n2,B,2500,-8,+4\n")
    assert list(read_events(p)) == [
        Event(1, "A", 1_500_000, {"k": 7, "n": 3}),
        Event(2, "B", 2_500_000, {"k": -8, "n": 4}),
    ]
    p.write_text("type,ts,k\nA,1500,7\nB,2500,-8\n")
    assert list(read_events(p)) == [Event(1, "A", 1_500_000, {"k": 7}), Event(2, "B", 2_500_000, {"k": -8})]


def test_decimal_timestamps_through_doubles_equal_the_decimal_cast(monkeypatch):
    """engine.event_columns reads decimal ts text through doubles where that is certainly exact (at most ``digits``
    digits after the point, below 2**50 units): the same int64 units, or the same error, as Arrow's decimal cast,
    for signs, empty integer parts, leading zeros, more digits than the unit holds and values near 2**50 units."""
    from engine import event_columns

    def units(values, digits, *, by_float):
        if not by_float:
            monkeypatch.setattr(event_columns, "_decimal_units_by_float", lambda v, d: None)
        try:
            return event_columns._decimal_units(values, digits).to_pylist()
        except (pa.ArrowInvalid, OverflowError) as e:
            return type(e).__name__
        finally:
            monkeypatch.undo()

    rnd = random.Random(7)
    whole = ["", "0", "7", "00012", "1125899906", "9007199254", "1125899906842624", "1351"]

    def word():
        fraction = "".join(rnd.choice("0123456789") for _ in range(rnd.randrange(9)))
        integer = rnd.choice([*whole, str(rnd.randrange(10 ** rnd.randrange(1, 19)))])
        return rnd.choice(["", "", "-", "+"]) + integer + "." + (fraction or ("" if integer else "5"))

    taken = 0
    for _ in range(1_500):
        values = pa.array([word() for _ in range(rnd.choice([1, 2, 5, 50]))])
        if rnd.random() < 0.3:
            values = pa.concat_arrays([pa.array(["9.9"]), values]).slice(1)  # an offset into the buffers
        digits = rnd.choice([0, 3, 6])
        taken += event_columns._decimal_units_by_float(values, digits) is not None
        assert units(values, digits, by_float=True) == units(values, digits, by_float=False)
    assert taken > 100  # the fast path was tried, not only the fallback


def test_plain_int_spelling_accepts_only_what_the_int_pattern_matches():
    """engine.event_columns checks an int column's plain spelling (digits, no leading zero) with Arrow's string kernels
    before its regex: where that check accepts a column, the regex accepts it too; its no decides nothing."""
    from engine import event_columns as ec

    rnd = random.Random(11)
    pieces = ["0", "0", "1", "7", "00", "12", ".", "-", "+", "e", "5", "x", " ", "\u0663", "\uff11", ""]
    taken = 0
    for _ in range(3_000):
        words = ["".join(rnd.choice(pieces) for _ in range(rnd.randrange(1, 4))) for _ in range(rnd.choice([1, 2, 4]))]
        words = [w or "1" for w in words]
        if rnd.random() < 0.2:
            words.append(None)
        values = pa.array(words, pa.string())
        if ec._canonical_ints(values):
            taken += 1
            assert ec._all_match(values, ec._INT_CANON) == (True, -1), words
        assert ec._all_match(values, ec._INT_CANON, ec._canonical_ints) == ec._all_match(values, ec._INT_CANON)
    assert taken > 100, taken
