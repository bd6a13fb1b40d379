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
In JSON, ints and floats in one column make it float; a string and a number in one column is an error.

Missing values, one rule for every format: an empty cell, ``null``, ``NULL``, ``NaN``/``nan`` (CSV
text), a JSON ``null`` or ``NaN``, and a Parquet null or NaN all mean *missing*: the attribute is
left out of the event, so every comparison with it is false (docs/semantics.md, section 3).
CSV cells are trimmed of surrounding white space first.
"""
from __future__ import annotations

import csv
import gc
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.events import Event

ColumnType = Literal["string", "int", "float", "bool", "timestamp"]
COLUMN_TYPES: tuple[str, ...] = ("string", "int", "float", "bool", "timestamp")
HEADER_FIELDS = ("id", "type", "ts", "ts_end")
HEADER_TYPES = {"id": "int", "type": "string", "ts": "timestamp", "ts_end": "timestamp"}
"""``ts_end`` (optional, issue 15): the end of an interval event, ``> ts``; empty = a point event."""
NULL_TEXT = ("", "null", "NULL", "NaN", "nan", "NAN")
"""CSV spellings of a missing value (after trimming)."""
BATCH_ROWS = 65_536

_INT_ANY = r"^[+-]?\d+$"
_INT_CANON = r"^[+-]?(0|[1-9]\d*)$"
_FLOAT_ANY = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$|^[+-]?([iI][nN][fF]|[iI]nfinity)$"
_FLOAT_CANON = r"^[+-]?((0|[1-9]\d*)(\.\d*)?|\.\d+)([eE][+-]?\d+)?$"
_DECIMAL = r"^[+-]?(\d+\.\d*|\.\d+)$"
_BOOL = r"^(?i)(true|false)$"
_DIGITS_PER_UNIT = {"us": 0, "ms": 3, "s": 6}


def _strings(words: tuple[str, ...]) -> pa.Array:
    """A string array from its buffers (``pa.array`` of Python strings would import pandas: see below)."""
    data = "".join(words).encode()
    offsets = np.cumsum([0, *(len(w.encode()) for w in words)], dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), len(words), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


_NULL_SPELLINGS = _strings(NULL_TEXT)


class ColumnError(ValueError):
    """A value of one column that does not fit (``row`` 0-based within the file's rows)."""

    def __init__(self, row: int, column: str, reason: str) -> None:
        super().__init__(reason)
        self.row = row
        self.column = column
        self.reason = reason


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


# ---------------------------------------------------------------- values of one column


# Kept free of Python-object conversions (pa.array/pa.scalar of Python values, to_numpy of bitmaps): pyarrow
# imports pandas for those on first use, 0.2 s of every `lace match` run.


def _null(t: pa.DataType) -> pa.Scalar:
    return pa.nulls(1, t)[0]


def _int64(value: int) -> pa.Scalar:
    return pa.Array.from_buffers(pa.int64(), 1, [None, pa.py_buffer(np.array([value], dtype=np.int64))])[0]


def _first(mask: pa.Array) -> int:
    """Index of the first true value of a boolean array (nulls are false); -1 if none."""
    hits = pc.indices_nonzero(mask)
    return int(hits[0].as_py()) if len(hits) else -1


def _all_match(values: pa.Array, pattern: str) -> tuple[bool, int]:
    """(every non-null value matches, index of the first that does not)."""
    first = _first(values.is_valid())
    if first >= 0 and not pc.match_substring_regex(values.slice(first, 1), pattern)[0].as_py():
        return False, first  # the first value decides it: no pass over the column (type inference tries many)
    ok = pc.match_substring_regex(values, pattern)
    bad = _first(pc.invert(ok))
    return bad < 0, bad


def _nan_to_null(values: pa.Array) -> pa.Array:
    if pa.types.is_floating(values.type):
        nan = pc.is_nan(values)
        if pc.any(nan).as_py():
            return pc.if_else(nan, _null(values.type), values)
    return values


def text_column(values: pa.Array) -> pa.Array:
    """CSV text: trimmed, with the missing spellings (``NULL_TEXT``) as nulls."""
    trimmed = pc.utf8_trim_whitespace(values)
    missing = pc.is_in(trimmed, value_set=_NULL_SPELLINGS)  # a hash lookup: cheaper than the regex
    if pc.any(missing).as_py():
        return pc.if_else(missing, _null(pa.string()), trimmed)
    return trimmed


def _cast_text(values: pa.Array, kind: str, column: str) -> pa.Array:
    """Text values to a declared type; ColumnError at the first that does not fit."""
    if kind == "string":
        return values
    if kind == "int":
        ok, bad = _all_match(values, _INT_ANY)
        if ok:
            try:
                return pc.cast(pc.replace_substring_regex(values, r"^\+", ""), pa.int64())
            except pa.ArrowInvalid:
                bad = next(i for i, v in enumerate(values.to_pylist()) if v is not None and not _fits_int64(int(v)))
                raise ColumnError(bad, column, f"{values[bad].as_py()!r} is out of the int64 range") from None
        raise ColumnError(bad, column, f"{values[bad].as_py()!r} is not an int")
    if kind == "float":
        ok, bad = _all_match(values, _FLOAT_ANY)
        if ok:
            return pc.cast(values, pa.float64())
        raise ColumnError(bad, column, f"{values[bad].as_py()!r} is not a float")
    if kind == "bool":
        ok, bad = _all_match(values, _BOOL)
        if ok:
            return pc.match_substring_regex(values, r"^(?i)true$")
        raise ColumnError(bad, column, f"{values[bad].as_py()!r} is not a bool (true or false)")
    raise AssertionError(kind)  # timestamps go through timestamp_column


def _fits_int64(v: int) -> bool:
    return -(1 << 63) <= v < (1 << 63)


def infer_text(values: pa.Array) -> str:
    """The type of a CSV column from all of its values (module docstring); ``string`` when in doubt."""
    if values.null_count == len(values):
        return "string"
    if _all_match(values, _BOOL)[0]:
        return "bool"
    if _all_match(values, _INT_CANON)[0]:
        try:
            pc.cast(pc.replace_substring_regex(values, r"^\+", ""), pa.int64())
            return "int"
        except pa.ArrowInvalid:
            return "string"  # beyond int64: an identifier, not a number
    if _all_match(values, _FLOAT_CANON)[0]:
        if not pc.any(pc.is_inf(pc.cast(values, pa.float64()))).as_py():
            return "float"
    return "string"


def value_column(values: pa.Array, kind: str | None, column: str, ts_unit: str) -> tuple[pa.Array, str]:
    """A JSON or Parquet column (already typed by the reader) as one of ``COLUMN_TYPES``.

    Returns ``(values, type)``; NaN becomes null; ColumnError when a value does not fit ``kind``.
    """
    t = values.type
    if pa.types.is_dictionary(t):
        values = values.cast(t.value_type)
        t = values.type
    if kind == "timestamp":
        return timestamp_column(values, ts_unit, column), "timestamp"
    if pa.types.is_null(t):
        return pa.nulls(len(values), pa.string()), kind or "string"
    if pa.types.is_timestamp(t):
        if kind is not None:
            raise ColumnError(_first(values.is_valid()), column, f"a timestamp, but the column is {kind}")
        return timestamp_column(values, ts_unit, column), "timestamp"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        have = "string"
    elif pa.types.is_boolean(t):
        have = "bool"
    elif pa.types.is_integer(t):
        have = "int"
    elif pa.types.is_floating(t):
        have = "float"
    else:
        raise ColumnError(_first(values.is_valid()), column, f"nested objects and arrays are not supported ({t})")
    want = kind or have
    if want == have or (want == "float" and have == "int"):
        target = {"string": pa.string(), "bool": pa.bool_(), "int": pa.int64(), "float": pa.float64()}[want]
        try:
            return _nan_to_null(values.cast(target)), want
        except pa.ArrowInvalid as e:
            raise ColumnError(_first(values.is_valid()), column, str(e)) from None
    raise ColumnError(_first(values.is_valid()), column, f"a {have}, but the column is {want}")


# ---------------------------------------------------------------- timestamps


def timestamp_column(values: pa.Array, unit: str, column: str) -> pa.Array:
    """Timestamps (ISO-8601 text with offset, numbers in ``unit``, or Arrow timestamps) -> int64 microseconds.

    Follows :class:`engine.io.TimestampParser` exactly (``auto``: integers are epoch milliseconds,
    decimals epoch seconds, one file does not mix them); the vectorised paths cover whole columns
    of one kind and anything else goes value by value through the parser, which names the bad row.
    Nulls stay null (the caller decides whether a missing timestamp is allowed).
    """
    t = values.type
    if pa.types.is_timestamp(t):
        if t.tz is None:
            raise ColumnError(_first(values.is_valid()), column, "a timestamp without time zone (UTC offset)")
        return values.cast(pa.timestamp("us", "UTC")).cast(pa.int64())
    if pa.types.is_integer(t) and not pa.types.is_boolean(t):
        kind = "ms" if unit == "auto" else unit
        try:
            return pc.multiply_checked(values.cast(pa.int64()), _int64(10 ** _DIGITS_PER_UNIT[kind]))
        except pa.ArrowInvalid:
            return _timestamps_slow(values, unit, column)
    if pa.types.is_floating(t):
        values = _nan_to_null(values)
        # the shortest text that reads back as the same double, as repr() gives
        return _timestamps_text(values.cast(pa.string()), unit, column, numeric_only=True)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _timestamps_text(values.cast(pa.string()), unit, column)
    raise ColumnError(_first(values.is_valid()), column, f"a {t} is not a timestamp")


def _timestamps_text(values: pa.Array, unit: str, column: str, numeric_only: bool = False) -> pa.Array:
    try:
        if _all_match(values, _INT_ANY)[0]:
            kind = "ms" if unit == "auto" else unit
            ints = pc.cast(pc.replace_substring_regex(values, r"^\+", ""), pa.int64())
            return pc.multiply_checked(ints, _int64(10 ** _DIGITS_PER_UNIT[kind]))
        if _all_match(values, _DECIMAL)[0] and unit != "us":
            digits = _DIGITS_PER_UNIT["s" if unit == "auto" else unit]
            return _decimal_units(values, digits)
        if not numeric_only and not pc.any(pc.match_substring_regex(values, r"^[+-]?[\d.]+$")).as_py():
            return pc.cast(values, pa.timestamp("us", "UTC")).cast(pa.int64())
    except (pa.ArrowInvalid, OverflowError):
        pass
    return _timestamps_slow(values, unit, column)


def _decimal_units(values: pa.Array, digits: int) -> pa.Array:
    """Decimal text -> exact int64 of ``10**-digits`` units (ArrowInvalid if finer or out of range)."""
    dec = pc.cast(values, pa.decimal128(38, digits))
    words = np.frombuffer(dec.buffers()[1], dtype=np.int64)[2 * dec.offset : 2 * (dec.offset + len(dec))]
    low, high = words[0::2], words[1::2]
    if not np.array_equal(high, low >> 63):
        raise OverflowError("timestamp out of the int64 range")
    validity = dec.buffers()[0] if dec.null_count and dec.offset == 0 else None
    if dec.null_count and validity is None:
        return pc.if_else(dec.is_null(), _null(pa.int64()), pa.array(low, pa.int64()))
    return pa.Array.from_buffers(
        pa.int64(), len(dec), [validity, pa.py_buffer(np.ascontiguousarray(low))], null_count=dec.null_count
    )


def _timestamps_slow(values: pa.Array, unit: str, column: str) -> pa.Array:
    from engine.io import TimestampParser

    parse = TimestampParser(unit)  # type: ignore[arg-type]
    out: list[int | None] = []
    for i, v in enumerate(values.to_pylist()):
        if v is None:
            out.append(None)
            continue
        try:
            out.append(parse(v))
        except ValueError as e:
            raise ColumnError(i, column, str(e)) from None
    try:
        return pa.array(out, type=pa.int64())
    except (pa.ArrowInvalid, OverflowError):
        bad = next(i for i, v in enumerate(out) if v is not None and not _fits_int64(v))
        raise ColumnError(bad, column, "timestamp out of the int64 range") from None


# ---------------------------------------------------------------- the typed table


class EventTable:
    """The events of one file as typed columns; :meth:`batches` makes :class:`Event` objects.

    Attributes
    ----------
    ids : pa.Array | None
        int64 ids, or None: id = 1-based row number.
    types : pa.Array
        Event types (string, no nulls).
    ts : pa.Array
        int64 microseconds UTC, no nulls.
    attrs : dict[str, pa.Array]
        Attribute -> typed values, null = missing.
    column_types : dict[str, str]
        Attribute -> one of ``COLUMN_TYPES``.
    ts_end : pa.Array | None
        int64 microseconds UTC, the end of each interval event (null: a point event), or None when
        the file has no ``ts_end`` column; checked ``> ts`` by :func:`interval_ends`.
    """

    def __init__(
        self,
        ids: pa.Array | None,
        types: pa.Array,
        ts: pa.Array,
        attrs: dict[str, pa.Array],
        column_types: dict[str, str],
        ts_end: pa.Array | None = None,
    ) -> None:
        self.ids = ids
        self.types = types
        self.ts = ts
        self.ts_end = ts_end
        self.attrs = {n: a for n, a in attrs.items() if a.null_count < len(a)}  # all-missing: never set
        self.column_types = column_types

    def __len__(self) -> int:
        return len(self.types)

    def batches(self, rows: int = BATCH_ROWS) -> Iterator[list[Event]]:
        """Events in file order, ``rows`` at a time."""
        # strings as one str object per distinct value (hashed once: cheap dict lookups by type and key)
        types = _Interned(self.types)
        columns = [_Interned(a) if _is_text(a.type) else _Plain(a) for a in self.attrs.values()]
        for lo in range(0, len(self), rows):
            with _gc_paused():
                batch = self._batch(types, columns, lo, min(rows, len(self) - lo))
            yield batch

    def _batch(self, types: _Interned, columns: list[_Plain], lo: int, n: int) -> list[Event]:
        names = tuple(self.attrs)
        ids = range(lo + 1, lo + n + 1) if self.ids is None else _py_values(self.ids.slice(lo, n))
        cols = [c.values(lo, n) for c in columns]
        if not cols:
            attrs: list[dict[str, Any]] = [{} for _ in range(n)]
        elif len(cols) in _ATTR_ROWS:
            attrs = _ATTR_ROWS[len(cols)](names, cols)
        else:
            attrs = [dict(zip(names, row)) for row in zip(*cols)]
        for name, c in zip(names, self.attrs.values()):
            part = c.slice(lo, n)
            if part.null_count:
                for i in _py_values(pc.indices_nonzero(part.is_null())):
                    del attrs[i][name]
        ts = _py_values(self.ts.slice(lo, n))
        if self.ts_end is None:
            return list(map(Event, ids, types.values(lo, n), ts, attrs))
        ends = _py_values(self.ts_end.slice(lo, n))
        return list(map(Event, ids, types.values(lo, n), ts, attrs, ends))


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a batch of events is built: they hold no cycles, and each of the
    collections their allocations would start walks the half-built lists of the batch again (more than half
    of the time of building 7.1M Aarhus events, 10.3 -> 4.5 CPU s). Restored as it was (off stays off)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _rows1(k: tuple[str, ...], c: list[list[Any]]) -> list[dict[str, Any]]:
    (k0,) = k
    return [{k0: a} for a in c[0]]


def _rows2(k: tuple[str, ...], c: list[list[Any]]) -> list[dict[str, Any]]:
    k0, k1 = k
    return [{k0: a, k1: b} for a, b in zip(*c)]


def _rows3(k: tuple[str, ...], c: list[list[Any]]) -> list[dict[str, Any]]:
    k0, k1, k2 = k
    return [{k0: a, k1: b, k2: d} for a, b, d in zip(*c)]


def _rows4(k: tuple[str, ...], c: list[list[Any]]) -> list[dict[str, Any]]:
    k0, k1, k2, k3 = k
    return [{k0: a, k1: b, k2: d, k3: e} for a, b, d, e in zip(*c)]


def _rows5(k: tuple[str, ...], c: list[list[Any]]) -> list[dict[str, Any]]:
    k0, k1, k2, k3, k4 = k
    return [{k0: a, k1: b, k2: d, k3: e, k4: f} for a, b, d, e, f in zip(*c)]


def _rows6(k: tuple[str, ...], c: list[list[Any]]) -> list[dict[str, Any]]:
    k0, k1, k2, k3, k4, k5 = k
    return [{k0: a, k1: b, k2: d, k3: e, k4: f, k5: g} for a, b, d, e, f, g in zip(*c)]


# attribute dicts as dict displays (4x faster than dict(zip(names, row)) per row), by column count
_ATTR_ROWS = {1: _rows1, 2: _rows2, 3: _rows3, 4: _rows4, 5: _rows5, 6: _rows6}


_NUMPY_TYPES: dict[pa.DataType, np.dtype[Any]] = {
    pa.int8(): np.dtype(np.int8), pa.int16(): np.dtype(np.int16), pa.int32(): np.dtype(np.int32),
    pa.int64(): np.dtype(np.int64), pa.uint8(): np.dtype(np.uint8), pa.uint16(): np.dtype(np.uint16),
    pa.uint32(): np.dtype(np.uint32), pa.uint64(): np.dtype(np.uint64), pa.float32(): np.dtype(np.float32),
    pa.float64(): np.dtype(np.float64),
}
"""Arrow number types whose values buffer numpy reads as is (little-endian, as Arrow's)."""


def _numpy_view(part: pa.Array) -> np.ndarray[Any, Any] | None:
    """A numpy view of a number array without nulls (None for other arrays): pyarrow's ``to_numpy`` would
    import pandas, 0.2 s of every run."""
    dtype = _NUMPY_TYPES.get(part.type)
    if dtype is None or part.null_count:
        return None
    return np.frombuffer(part.buffers()[1], dtype, len(part), part.offset * dtype.itemsize)


def _py_values(part: pa.Array) -> list[Any]:
    """Python values of an array: numbers without nulls through numpy's ``tolist()`` (a C loop), the rest through
    pyarrow (which keeps ints ints where there are nulls)."""
    view = _numpy_view(part)
    return list(part.to_pylist() if view is None else view.tolist())


class _Plain:
    """A column's Python values, a slice at a time (numbers without a null in the slice through numpy, a C loop:
    ``tolist()`` gives Python ints and floats; the rest through pyarrow)."""

    def __init__(self, values: pa.Array) -> None:
        self.array = values

    def values(self, lo: int, n: int) -> list[Any]:
        part = self.array.slice(lo, n)
        return _py_values(part)


def _is_text(t: pa.DataType) -> bool:
    """A string column, plain or dictionary-encoded (as a Parquet reader with ``read_dictionary`` gives)."""
    return pa.types.is_string(t) or (pa.types.is_dictionary(t) and pa.types.is_string(t.value_type))


class _Interned(_Plain):
    """A string column dictionary-encoded once (or as given, already encoded): one str object per distinct
    value (hashed once, so the matcher's dict lookups by type and partition key are cheap)."""

    def __init__(self, values: pa.Array) -> None:
        enc = values if pa.types.is_dictionary(values.type) else pc.dictionary_encode(values)
        words = np.empty(len(enc.dictionary) + 1, dtype=object)
        words[:-1] = enc.dictionary.to_pylist()  # the last: None, for the nulls
        self.words = words
        super().__init__(enc.indices.fill_null(len(words) - 1) if enc.null_count else enc.indices)

    def values(self, lo: int, n: int) -> list[Any]:
        part = self.array.slice(lo, n)
        view = _numpy_view(part)
        return list(self.words[part.to_pylist() if view is None else view].tolist())


# ---------------------------------------------------------------- readers


def read_csv_table(path: str | Path, *, ts_unit: str = "auto", schema: dict[str, str] | None = None) -> EventTable:
    """Read a CSV event file (every cell as text, then each column typed as a whole).

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
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(column_names=[f"c{i}" for i in range(len(names))], skip_rows=1),
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
    for n, values in cols.items():
        if n in HEADER_FIELDS:
            continue
        kind = declared.get(n) or infer_text(values)
        attrs[n] = timestamp_column(values, ts_unit, n) if kind == "timestamp" else _cast_text(values, kind, n)
        kinds[n] = kind
    return EventTable(ids, types, ts_values, attrs, kinds, interval_ends(cols.get("ts_end"), ts_values, ts_unit))


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
