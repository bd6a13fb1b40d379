"""Typed event files: CSV, JSONL and Parquet read column by column with pyarrow.

Every attribute column has one type for the whole file: declared, or inferred from all of
its values. A value that does not fit its column's type is an :class:`~engine.io.EventFileError`
with the line and the column; nothing changes type from row to row.

Column types (``COLUMN_TYPES``): ``string``, ``int`` (int64), ``float`` (float64), ``bool`` and
``timestamp`` (an ISO-8601 string with a UTC offset, or a number in the file's ts unit; inside,
int microseconds UTC). Declared by:

- CSV: a typed header, ``key:string,speed:float,n:int,ok:bool,seen:timestamp`` (``ts:timestamp``,
  ``id:int`` and ``type:string`` are accepted for the header fields);
- any format: a schema, ``{"key": "string", "speed": "float"}`` (``lace match --schema FILE``);
- Parquet: the file's own column types.

Inference (CSV text; JSON and Parquet values already have a type): a column whose values are all
``true``/``false`` (any case) is bool; all integers written without leading zeros and within int64
is int; all decimal numbers (with ``.`` or an exponent, no leading zeros, finite) is float; anything
else is string. So ``060030``, ``3964e8`` or ``86e430`` in a column keep the whole column a string.
When most of a column's values are numbers (or booleans) and a few keep it a string, the table says so
(``EventTable.string_fallbacks``, :func:`engine.event_columns.string_fallback`; ``EventFile.warnings``).
In JSON, ints and floats in one column make it float; a string and a number in one column is an error.

Missing values, one rule for every format: an empty cell, ``null``, ``NULL``, ``NaN``/``nan`` (CSV
text), a JSON ``null`` or ``NaN``, and a Parquet null or NaN all mean *missing*: the attribute is
left out of the event, so every comparison with it is false (docs/semantics.md, section 3).
CSV cells are trimmed of surrounding white space first.

This module reads whole files (:func:`read_csv_table`, :func:`read_json_table`, :func:`read_parquet_table`) and
their headers and schemas; one column's values are typed by :mod:`engine.event_columns`, and the typed columns
make events in :mod:`engine.event_table`.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.event_columns import (
    _INT_ANY,
    NULL_TEXT,
    ColumnError,
    StringFallback,
    _all_match,
    _cast_text,
    _first,
    _null,
    infer_column,
    infer_text,
    string_fallback,
    text_column,
    timestamp_column,
    value_column,
)
from engine.event_table import BATCH_ROWS, EventTable

__all__ = [
    "BATCH_ROWS",
    "COLUMN_TYPES",
    "HEADER_FIELDS",
    "HEADER_TYPES",
    "NULL_TEXT",
    "ColumnError",
    "ColumnType",
    "EventTable",
    "HeaderError",
    "ParseError",
    "StringFallback",
    "infer_text",
    "interval_ends",
    "load_schema",
    "parse_header",
    "parse_type",
    "read_csv_table",
    "read_json_table",
    "read_parquet_table",
    "text_column",
    "timestamp_column",
    "value_column",
]

ColumnType = Literal["string", "int", "float", "bool", "timestamp"]
COLUMN_TYPES: tuple[str, ...] = ("string", "int", "float", "bool", "timestamp")
HEADER_FIELDS = ("id", "type", "ts", "ts_end")
HEADER_TYPES = {"id": "int", "type": "string", "ts": "timestamp", "ts_end": "timestamp"}
"""``ts_end`` (optional, issue 15): the end of an interval event, ``> ts``; empty = a point event."""


def parse_type(name: str, text: str) -> str:
    """Check a declared column type name; returns it. ValueError for an unknown one."""
    t = text.strip().lower()
    if t not in COLUMN_TYPES:
        raise ValueError(f"column {name!r}: unknown type {text!r} (one of {', '.join(COLUMN_TYPES)})")
    if name in HEADER_TYPES and t != HEADER_TYPES[name]:
        raise ValueError(f"column {name!r} is always {HEADER_TYPES[name]}, not {t}")
    return t


def load_schema(path: str | Path) -> dict[str, str]:
    """Read a schema file: a JSON object ``{"attribute": "string|int|float|bool|timestamp", ...}``.

    Raises
    ------
    ValueError
        Not a JSON object of type names.
    OSError
        The file cannot be read.
    """
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON: {e}") from None
    if not isinstance(doc, dict) or not all(isinstance(v, str) for v in doc.values()):
        raise ValueError(f'{path}: expected a JSON object of column types, e.g. {{"key": "string"}}')
    try:
        return {k: parse_type(k, v) for k, v in doc.items()}
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


# ---------------------------------------------------------------- readers


def read_csv_table(path: str | Path, *, ts_unit: str = "auto", schema: dict[str, str] | None = None) -> EventTable:
    """Read a CSV event file (every cell as text, then each column typed as a whole).

    The table's ``string_fallbacks`` lists the undeclared columns inferred as string because of a minority of
    their values (:func:`engine.event_columns.string_fallback`).

    Raises
    ------
    HeaderError
        A bad header.
    ParseError
        Rows the reader cannot split (the caller finds the line).
    ColumnError
        A value that does not fit its column.
    """
    import pyarrow.csv as pacsv

    with open(path, newline="", encoding="utf-8-sig") as f:
        header = next(csv.reader(f, skipinitialspace=True), None)
    if header is None:
        raise HeaderError("empty file: expected a header such as 'id,type,ts,...'")
    names, declared = parse_header(header, schema)
    try:
        # on one thread: Arrow's pool read the 1M-row bench file in 0.06-0.13 CPU s instead of 0.06 (more under load),
        # and its chunks made the combining, trimming and ts passes after it up to 0.15 CPU s dearer (issue 45)
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(
                column_names=[f"c{i}" for i in range(len(names))], skip_rows=1, use_threads=False
            ),
            convert_options=pacsv.ConvertOptions(
                column_types={f"c{i}": pa.string() for i in range(len(names))},
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
    except pa.ArrowInvalid as e:
        raise ParseError(str(e)) from None
    cols = {n: text_column(table.column(i).combine_chunks()) for i, n in enumerate(names)}
    ids = _header_ids(cols.get("id"))
    types = _header_types(cols["type"])
    ts_values = timestamp_column(cols["ts"], ts_unit, "ts")
    _no_nulls(ts_values, "ts", "empty ts")
    attrs: dict[str, pa.Array] = {}
    kinds: dict[str, str] = {}
    fallbacks: list[StringFallback] = []
    for n, values in cols.items():
        if n in HEADER_FIELDS:
            continue
        kind = declared.get(n)
        if kind is None:
            kind, attrs[n] = infer_column(values)  # typed as it was inferred: the same values as _cast_text's
            if kind == "string" and (why := string_fallback(values, n)) is not None:
                fallbacks.append(why)
        else:
            attrs[n] = timestamp_column(values, ts_unit, n) if kind == "timestamp" else _cast_text(values, kind, n)
        kinds[n] = kind
    table = EventTable(ids, types, ts_values, attrs, kinds, interval_ends(cols.get("ts_end"), ts_values, ts_unit))
    table.string_fallbacks = fallbacks
    return table


class HeaderError(ValueError):
    """A bad CSV header (line 1)."""


class ParseError(ValueError):
    """The reader could not split the file into rows (the caller finds the line)."""


def parse_header(header: list[str], schema: dict[str, str] | None) -> tuple[list[str], dict[str, str]]:
    """Column names and declared types of a CSV header (``name`` or ``name:type``)."""
    names: list[str] = []
    declared = dict(schema or {})
    for raw in header:
        name, sep, kind = raw.strip().rpartition(":")
        if not sep or not name:
            name, kind = raw.strip(), ""
        names.append(name.strip())
        if kind:
            try:
                declared[name.strip()] = parse_type(name.strip(), kind)
            except ValueError as e:
                raise HeaderError(str(e)) from None
    missing = [n for n in ("type", "ts") if n not in names]
    if missing:
        raise HeaderError(f"header lacks {', '.join(repr(m) for m in missing)} (got {','.join(names)})")
    if "" in names:
        raise HeaderError(f"empty column name in header (column {names.index('') + 1})")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise HeaderError(f"duplicate column {dupes[0]!r} in header")
    return names, declared


def interval_ends(values: pa.Array | None, ts: pa.Array, ts_unit: str) -> pa.Array | None:
    """The typed ``ts_end`` column of an event file (issue 15), or None when the file has none.

    Empty cells are point events (``ts_end`` = ``ts``); a given ``ts_end`` must be after ``ts``.

    Raises
    ------
    ColumnError
        At the first row whose ``ts_end`` is not a timestamp or is at or before its ``ts``.
    """
    if values is None:
        return None
    ends = timestamp_column(values, ts_unit, "ts_end")
    bad = pc.fill_null(pc.less_equal(ends, ts), False)
    row = _first(bad)
    if row >= 0:
        end, start = ends[row].as_py(), ts[row].as_py()
        raise ColumnError(row, "ts_end", f"ts_end {end} is not after ts {start}: an interval event needs ts_end > ts")
    return pc.coalesce(ends, ts)


def _no_nulls(values: pa.Array, column: str, reason: str) -> None:
    if values.null_count:
        raise ColumnError(_first(values.is_null()), column, reason)


def _header_ids(values: pa.Array | None) -> pa.Array | None:
    if values is None:
        return None
    _no_nulls(values, "id", "empty id")
    ok, bad = _all_match(values, _INT_ANY)
    if not ok:
        raise ColumnError(bad, "id", f"id must be an integer, got {json.dumps(values[bad].as_py())}")
    return _cast_text(values, "int", "id")


def _header_types(values: pa.Array) -> pa.Array:
    _no_nulls(values, "type", "empty type")
    return values


def read_json_table(path: str | Path, *, ts_unit: str = "auto", schema: dict[str, str] | None = None) -> EventTable:
    """Read a JSONL event file (flat attributes, or under ``"attrs"``) with pyarrow's JSON reader.

    Raises
    ------
    ParseError
        The reader refused the file (invalid JSON, a column that changes type); the caller
        finds the line with :func:`engine.io` 's line-by-line diagnosis.
    ColumnError
        A value that does not fit its column.
    """
    import pyarrow.json as pajson

    declared = dict(schema or {})
    arrow_types = {"string": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}
    fixed = {n: arrow_types[k] for n, k in declared.items() if k in arrow_types and n not in HEADER_FIELDS}
    table = _read_json(pajson, path, fixed)
    # the reader guesses timestamps from strings: read such columns again as the strings they are
    guessed = [f.name for f in table.schema if pa.types.is_timestamp(f.type)]
    nested = table.schema.get_field_index("attrs")
    if nested >= 0 and pa.types.is_struct(table.schema.field(nested).type):
        guessed += [f"attrs.{f.name}" for f in table.schema.field(nested).type if pa.types.is_timestamp(f.type)]
    if guessed:
        for g in guessed:
            fixed[g.removeprefix("attrs.")] = pa.string()
        table = _read_json(pajson, path, fixed)
    n_rows = table.num_rows
    columns: dict[str, pa.Array] = {}
    for f in sorted(table.schema, key=lambda f: f.name == "attrs"):  # flat fields first, nested ones win
        col = table.column(f.name).combine_chunks()
        if f.name == "attrs" and pa.types.is_struct(f.type):
            for i, sub in enumerate(f.type):
                inner = col.field(i)
                if col.null_count:
                    inner = pc.if_else(col.is_valid(), inner, _null(inner.type))
                prev = columns.get(sub.name)
                columns[sub.name] = inner if prev is None else pc.coalesce(inner, prev.cast(inner.type))
        elif f.name == "attrs" and not pa.types.is_null(f.type):
            raise ColumnError(_first(col.is_valid()), "attrs", "'attrs' must be a JSON object")
        else:
            columns[f.name] = col
    if "type" not in columns or columns["type"].null_count or not pa.types.is_string(columns["type"].type):
        col = columns.get("type")
        bad = 0 if col is None else _first(col.is_null()) if col.null_count else 0
        raise ColumnError(bad, "type", "missing or empty 'type'")
    types = columns["type"]
    empty = _first(pc.equal(types, ""))
    if empty >= 0:
        raise ColumnError(empty, "type", "missing or empty 'type'")
    if "ts" not in columns or columns["ts"].null_count:
        col = columns.get("ts")
        raise ColumnError(0 if col is None else _first(col.is_null()), "ts", "missing 'ts'")
    ts_raw = columns["ts"]
    if pa.types.is_boolean(ts_raw.type):
        raise ColumnError(0, "ts", "ts must be a number or an ISO-8601 string, got a boolean")
    ts_values = timestamp_column(ts_raw, ts_unit, "ts")
    ids = None
    if "id" in columns:
        col = columns["id"]
        if not pa.types.is_integer(col.type):
            raise ColumnError(_first(col.is_valid()), "id", f"id must be an integer, not a {col.type}")
        if col.null_count:  # an event without an id takes its row number, as in a file without ids
            col = pc.coalesce(col, pa.array(np.arange(1, len(col) + 1, dtype=np.int64)))
        ids = col.cast(pa.int64())
    attrs: dict[str, pa.Array] = {}
    kinds: dict[str, str] = {}
    for name, col in columns.items():
        if name in HEADER_FIELDS or name == "attrs":
            continue
        attrs[name], kinds[name] = value_column(col, declared.get(name), name, ts_unit)
    assert all(len(a) == n_rows for a in attrs.values())
    return EventTable(ids, types, ts_values, attrs, kinds, interval_ends(columns.get("ts_end"), ts_values, ts_unit))


def _read_json(pajson: Any, path: str | Path, fixed: dict[str, pa.DataType]) -> pa.Table:
    schema = None
    if fixed:
        top = [pa.field(n, t) for n, t in fixed.items()]
        schema = pa.schema([*top, pa.field("attrs", pa.struct(top))])
    try:
        return pajson.read_json(
            path,
            parse_options=pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer"),
        )
    except pa.ArrowInvalid as e:
        if "Empty JSON file" in str(e):
            return pa.table({"type": pa.array([], pa.string()), "ts": pa.array([], pa.int64())})
        raise ParseError(str(e)) from None


def read_parquet_table(path: str | Path, *, ts_unit: str = "auto", schema: dict[str, str] | None = None) -> EventTable:
    """Read a Parquet event file: columns ``type``, ``ts``, optionally ``id``, then attributes.

    ``ts`` is an Arrow timestamp with a time zone, an integer (in ``ts_unit``; ``auto`` = ms)
    or ISO-8601 text. ColumnError for a value that does not fit; HeaderError for a missing column.
    """
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    names = table.column_names
    missing = [n for n in ("type", "ts") if n not in names]
    if missing:
        raise HeaderError(f"columns lack {', '.join(repr(m) for m in missing)} (got {','.join(names)})")
    declared = dict(schema or {})
    cols = {n: table.column(n).combine_chunks() for n in names}
    types, _ = value_column(cols["type"], "string", "type", ts_unit)
    _no_nulls(types, "type", "empty type")
    empty = _first(pc.equal(types, ""))
    if empty >= 0:
        raise ColumnError(empty, "type", "empty type")
    ts_values = timestamp_column(cols["ts"], ts_unit, "ts")
    _no_nulls(ts_values, "ts", "empty ts")
    ids = None
    if "id" in cols:
        ids, _ = value_column(cols["id"], "int", "id", ts_unit)
        _no_nulls(ids, "id", "empty id")
    attrs: dict[str, pa.Array] = {}
    kinds: dict[str, str] = {}
    for name, col in cols.items():
        if name not in HEADER_FIELDS:
            attrs[name], kinds[name] = value_column(col, declared.get(name), name, ts_unit)
    return EventTable(ids, types, ts_values, attrs, kinds, interval_ends(cols.get("ts_end"), ts_values, ts_unit))
