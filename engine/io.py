"""Event files in, match files out (docs/architecture.md sections 7.3 and 7.12).

Event files are CSV with a header ``id,type,ts,<attrs...>``, JSONL with the same fields, or
Parquet with those columns, read column by column (:mod:`engine.event_files`: one type per
column, one rule for missing values). ``ts`` is an ISO-8601 string with a UTC offset, or a
number; see :func:`open_event_file` for how numbers are read. Inside, every ts is int
microseconds UTC. Matches are written by :mod:`engine.match_files`.

Examples
--------
>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "ev.csv"
>>> _ = p.write_text("id,type,ts,price,ok\\n7,Stock,1500,12.5,true\\n")
>>> list(read_events(p))
[Event(id=7, type='Stock', ts=1500000, attrs={'price': 12.5, 'ok': True})]
"""
from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, TextIO

import orjson
import pyarrow as pa

from engine.event_files import (
    BATCH_ROWS,
    ColumnError,
    EventTable,
    HeaderError,
    ParseError,
    read_csv_table,
    read_json_table,
    read_parquet_table,
)
from engine.events import Event
from engine.match import Match
from engine.match_files import match_line

TsUnit = Literal["auto", "ms", "s", "us"]
FileFormat = Literal["auto", "csv", "jsonl", "parquet"]

BENCH_HEADER = ("type", "key", "ts", "price")
HEADER_FIELDS = ("id", "type", "ts")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)
_INT_RE = re.compile(r"[+-]?\d+\Z")
_DECIMAL_RE = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+)\Z")
_DIGITS_PER_UNIT = {"us": 0, "ms": 3, "s": 6}  # decimal digits from the unit down to microseconds
_POW10: tuple[int, ...] = (1, 10, 100, 1_000, 10_000, 100_000, 1_000_000)


class EventFileError(ValueError):
    """A bad row (or header) in an event file.

    Attributes
    ----------
    path : str
        The file, as the caller named it.
    line : int
        1-based line number in the file (the header is line 1 of a CSV file); for a
        Parquet file, the 1-based row.
    reason : str
        One line saying what is wrong.
    column : str | None
        The column (attribute) of the bad value, if one.
    position : int | None
        Its 1-based position in a CSV header.

    ``str(err)`` is ``"<path> line <line>: <reason>"``, or
    ``"<path> line <line>, column <position> '<column>': <reason>"`` for a bad value.
    """

    def __init__(
        self,
        path: str | Path,
        line: int,
        reason: str,
        *,
        column: str | None = None,
        position: int | None = None,
        where: str = "line",
    ) -> None:
        self.path = str(path)
        self.line = line
        self.reason = reason
        self.column = column
        self.position = position
        at = f"{where} {line}"
        if column is not None:
            at += f", column {position} {column!r}" if position is not None else f", column {column!r}"
        super().__init__(f"{self.path} {at}: {reason}")


def _scale(text: str, digits: int) -> int:
    """Exact ``int(Decimal(text) * 10**digits)`` for a plain decimal string; ValueError if not integral."""
    sign = -1 if text.startswith("-") else 1
    whole, _, frac = text.lstrip("+-").partition(".")
    if len(frac) > digits and frac[digits:].strip("0"):
        raise ValueError(f"ts {text!r} is finer than a microsecond")
    frac = frac[:digits].ljust(digits, "0")
    return sign * (int(whole or "0") * _POW10[digits] + int(frac or "0"))


def parse_iso_us(text: str) -> int:
    """ISO-8601 timestamp with a UTC offset -> int microseconds UTC.

    >>> parse_iso_us("1970-01-01T00:00:01.5+00:00"), parse_iso_us("1970-01-01T01:00:00+01:00")
    (1500000, 0)
    """
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"ts {text!r} is neither a number nor an ISO-8601 timestamp") from None
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise ValueError(f"ts {text!r} has no UTC offset (write e.g. 'Z' or '+02:00')")
    return (dt - _EPOCH) // _ONE_US


class TimestampParser:
    """Reads the ``ts`` values of one file as int microseconds UTC.

    Parameters
    ----------
    unit : {"auto", "ms", "s", "us"}
        Unit of numeric ts values. ``"auto"``: integers are epoch milliseconds and
        decimals (with a ``.``) are epoch seconds; one file must not mix the two.
        ISO-8601 strings are accepted whatever the unit.
    """

    def __init__(self, unit: TsUnit = "auto") -> None:
        if unit not in ("auto", "ms", "s", "us"):
            raise ValueError(f"unknown ts unit {unit!r} (auto, ms, s or us)")
        self.unit = unit
        self._auto_kind: str | None = None  # "ms" or "s", fixed by the first numeric ts in auto mode

    def __call__(self, raw: object) -> int:
        """Parse one ts (str from CSV; str, int or float from JSON). Raises ValueError."""
        if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
            raise ValueError(f"ts must be a number or an ISO-8601 string, got {json.dumps(raw)}")
        text = repr(raw) if isinstance(raw, float) else str(raw).strip()
        if _INT_RE.match(text):
            unit = self._unit_for("ms", text)
            return int(text) * _POW10[_DIGITS_PER_UNIT[unit]]
        if _DECIMAL_RE.match(text):
            unit = self._unit_for("s", text)
            return _scale(text, _DIGITS_PER_UNIT[unit])
        if not text:
            raise ValueError("empty ts")
        return parse_iso_us(text)

    def _unit_for(self, auto_kind: str, text: str) -> str:
        if self.unit != "auto":
            if self.unit == "us" and auto_kind == "s":
                raise ValueError(f"ts {text!r} is not a whole number of microseconds")
            return self.unit
        if self._auto_kind is None:
            self._auto_kind = auto_kind
        elif self._auto_kind != auto_kind:
            seen = "epoch milliseconds (integers)" if self._auto_kind == "ms" else "epoch seconds (decimals)"
            raise ValueError(f"ts {text!r} does not match the earlier rows' {seen}; pass an explicit ts unit")
        return auto_kind


def detect_format(path: str | Path) -> Literal["csv", "jsonl", "parquet"]:
    """By suffix (``.jsonl``/``.ndjson``/``.json``, ``.parquet``/``.pq``, ``.csv``), else by the first bytes."""
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix == ".csv":
        return "csv"
    with open(path, "rb") as f:
        head = f.read(4096)
    if head.startswith(b"PAR1"):
        return "parquet"
    return "jsonl" if head.decode("utf-8", "replace").lstrip("\ufeff \t\r\n").startswith("{") else "csv"


class EventFile:
    """An event file read whole into typed columns (:mod:`engine.event_files`).

    Use :func:`open_event_file`. ``batches()`` yields lists of events in file order (or in
    ``(ts, id)`` order after ``sort()``); ``line(row)`` is the file line of a 0-based row.
    """

    def __init__(self, path: str | Path, fmt: str, table: EventTable) -> None:
        self.path = path
        self.format = fmt
        self.table = table
        self.rows: Any = None  # after sort(): original row of each position
        self._lines: list[int] | None = None
        self.string_fallbacks = table.string_fallbacks  # of the file's rows: sort() keeps them

    def __len__(self) -> int:
        return len(self.table)

    @property
    def column_types(self) -> dict[str, str]:
        """Attribute -> its type (one of ``engine.event_files.COLUMN_TYPES``)."""
        return self.table.column_types

    def sort(self) -> None:
        """Order the events by ``(ts_end, id)``, the matcher's order (``(ts, id)`` for point events; a
        stable sort; ids default to row numbers)."""
        import numpy as np
        import pyarrow as pa

        t = self.table
        ids = t.ids if t.ids is not None else pa.array(np.arange(1, len(t) + 1, dtype=np.int64))
        ends = t.ts if t.ts_end is None else t.ts_end
        order = np.lexsort((ids.to_numpy(), ends.to_numpy()))
        take = pa.array(order)
        self.rows = order
        self.table = EventTable(
            ids.take(take), t.types.take(take), t.ts.take(take),
            {n: a.take(take) for n, a in t.attrs.items()}, t.column_types,
            None if t.ts_end is None else t.ts_end.take(take),
        )

    def batches(self, rows: int = BATCH_ROWS) -> Iterator[list[Event]]:
        """Events, ``rows`` at a time."""
        return self.table.batches(rows)

    def events(self) -> Iterator[Event]:
        """Events one by one."""
        for batch in self.batches():
            yield from batch

    def line(self, position: int) -> int:
        """1-based file line of the event at ``position`` (its row in a Parquet file)."""
        row = int(self.rows[position]) if self.rows is not None else position
        if self._lines is None:
            self._lines = _row_lines(self.path, self.format)
        return self._lines[row] if row < len(self._lines) else row + 1

    def warnings(self) -> list[str]:
        """What a reader should know about how the file was read, one message per column (none: all clear).

        Returns
        -------
        list[str]
            For every CSV column inferred as string because of a minority of its values
            (:func:`engine.event_columns.string_fallback`): the file, the line and column of its first value
            that is not of the type of most of them, and how to declare its type (``--schema`` or a typed header).
        """
        if not self.string_fallbacks:
            return []
        if self._lines is None:
            self._lines = _row_lines(self.path, self.format)
        names = _csv_names(self.path) if self.format == "csv" else []
        out = []
        for f in self.string_fallbacks:
            line = self._lines[f.row] if f.row < len(self._lines) else f.row + 1
            position = f", column {names.index(f.column) + 1}" if f.column in names else ""
            out.append(
                f"{self.path} line {line}{position} {f.column!r}: {f.value!r} is not {_A[f.majority]} like most of "
                f"its values, so the whole column is read as strings (a numeric or boolean comparison on it matches "
                f"nothing); declare its type with --schema (e.g. {{\"{f.column}\": \"{f.majority}\"}}) or a typed "
                f"header ({f.column}:{f.majority}), or fix the value"
            )
        return out

    def where(self, position: int) -> str:
        """``line N`` (CSV, JSONL) or ``row N`` (Parquet) of the event at ``position``."""
        return f"{'row' if self.format == 'parquet' else 'line'} {self.line(position)}"


_A = {"int": "an int", "float": "a float", "bool": "a bool"}


def open_event_file(
    path: str | Path,
    *,
    ts_unit: TsUnit = "auto",
    format: FileFormat = "auto",
    schema: dict[str, str] | None = None,
) -> EventFile:
    """Read an event file into typed columns.

    Parameters
    ----------
    path : str or Path
        CSV with a header naming ``type``, ``ts``, optionally ``id``, then attributes (typed
        headers ``name:type`` declare a column's type); JSONL, one object per line with the same
        fields (flat, or attributes under ``"attrs"``); or Parquet with those columns.
    ts_unit : {"auto", "ms", "s", "us"}
        Unit of numeric ts (and timestamp attribute) values; ``"auto"``: integers are epoch
        milliseconds, decimals such as ``12.345`` epoch seconds. ISO-8601 strings need an offset.
    format : {"auto", "csv", "jsonl", "parquet"}
        ``"auto"`` decides by suffix, then by the first bytes.
    schema : dict, optional
        Attribute -> declared type (``string``, ``int``, ``float``, ``bool``, ``timestamp``); see
        :func:`engine.event_files.load_schema`. Undeclared columns are inferred from all their values.

    Returns
    -------
    EventFile
        Without an ``id`` column, id = 1-based row number. Missing values (empty cell, null,
        NaN) leave the attribute out of the event.

    Raises
    ------
    EventFileError
        A malformed header or a value that does not fit its column, with line and column.
    OSError
        The file cannot be read.
    """
    fmt = detect_format(path) if format == "auto" else format
    if ts_unit not in ("auto", "ms", "s", "us"):
        raise ValueError(f"unknown ts unit {ts_unit!r} (auto, ms, s or us)")
    try:
        if fmt == "csv":
            table = read_csv_table(path, ts_unit=ts_unit, schema=schema)
        elif fmt == "jsonl":
            table = read_json_table(path, ts_unit=ts_unit, schema=schema)
        elif fmt == "parquet":
            table = read_parquet_table(path, ts_unit=ts_unit, schema=schema)
        else:
            raise ValueError(f"unknown event file format {format!r} (auto, csv, jsonl or parquet)")
    except HeaderError as e:
        raise EventFileError(path, 1, str(e)) from None
    except ParseError as e:
        raise _diagnose(path, fmt, schema, str(e)) from None
    except ColumnError as e:
        line = _row_lines(path, fmt)[e.row] if fmt != "parquet" else e.row + 1
        names = _csv_names(path) if fmt == "csv" else []
        position = names.index(e.column) + 1 if e.column in names else None
        raise EventFileError(path, line, e.reason, column=e.column, position=position,
                             where="row" if fmt == "parquet" else "line") from None
    pa.default_memory_pool().release_unused()  # the text columns are gone: give their memory back
    return EventFile(path, fmt, table)


def iter_event_rows(
    path: str | Path, *, ts_unit: TsUnit = "auto", format: FileFormat = "auto", schema: dict[str, str] | None = None
) -> Iterator[tuple[int, Event]]:
    """Like :func:`read_events`, yielding ``(line number, event)`` pairs (row number for Parquet)."""
    source = open_event_file(path, ts_unit=ts_unit, format=format, schema=schema)
    return ((source.line(i), e) for i, e in enumerate(source.events()))


def read_events(
    path: str | Path, *, ts_unit: TsUnit = "auto", format: FileFormat = "auto", schema: dict[str, str] | None = None
) -> Iterator[Event]:
    """Read an event file, in file order (see :func:`open_event_file` for the parameters and errors)."""
    return open_event_file(path, ts_unit=ts_unit, format=format, schema=schema).events()


def _csv_names(path: str | Path) -> list[str]:
    with open(path, newline="", encoding="utf-8-sig") as f:
        header = next(csv.reader(f, skipinitialspace=True), [])
    return [h.strip().rpartition(":")[0].strip() or h.strip() if ":" in h else h.strip() for h in header]


def _row_lines(path: str | Path, fmt: str) -> list[int]:
    """1-based line of every data row, as the readers count rows (blank lines skipped)."""
    if fmt == "parquet":
        return []
    with open(path, "rb") as f:
        data = f.read()
    if fmt == "jsonl" or b'"' not in data:
        lines = data.split(b"\n")
        first = 0 if fmt == "jsonl" else 1
        blank = (lambda t: not t.strip()) if fmt == "jsonl" else (lambda t: t in (b"", b"\r"))
        return [n for n, text in enumerate(lines[first:], start=first + 1) if not blank(text)]
    out = []
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        next(reader, None)
        for row in reader:
            if row:
                out.append(reader.line_num)
    return out


def _diagnose(path: str | Path, fmt: str, schema: dict[str, str] | None, message: str) -> EventFileError:
    """The first bad line of a file the columnar reader refused (read again line by line)."""
    if fmt == "csv":
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = next(reader, [])
            for row in reader:
                if row and len(row) != len(header):
                    return EventFileError(path, reader.line_num, f"expected {len(header)} fields, got {len(row)}")
        return EventFileError(path, 1, message)
    kinds: dict[str, tuple[str, int]] = {}
    declared = {
        n: ("number" if k in ("int", "float") else "boolean" if k == "bool" else k)
        for n, k in (schema or {}).items()
        if k != "timestamp"
    }
    parse_ts = TimestampParser("auto")
    with open(path, encoding="utf-8-sig") as f:
        row_no = 0
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            row_no += 1
            try:
                obj = json.loads(text)
                _json_event(obj, row_no, parse_ts)
            except json.JSONDecodeError as e:
                return EventFileError(path, line, f"invalid JSON: {e.msg} at column {e.colno}")
            except ValueError as e:
                if "ts" in str(e) and "does not match the earlier rows" in str(e):
                    parse_ts = TimestampParser("auto")
                    continue  # unit mixing is reported by the columnar pass
                return EventFileError(path, line, str(e))
            flat = {k: v for k, v in obj.items() if k != "attrs"}
            for name, value in (flat | (obj.get("attrs") or {})).items():
                if value is None:
                    continue
                kind = _json_kind(value)
                want = declared.get(name)
                if want is not None and kind != want:
                    return EventFileError(path, line, f"a {kind}, but the column is {schema[name]}", column=name)  # type: ignore[index]
                if want == "number" and (schema or {}).get(name) == "int" and isinstance(value, float):
                    return EventFileError(path, line, f"{value!r} is not an int", column=name)
                seen = kinds.setdefault(name, (kind, line))
                if seen[0] != kind:
                    return EventFileError(
                        path, line, f"a {kind}, but line {seen[1]} has a {seen[0]} (one type per column)", column=name
                    )
    return EventFileError(path, 1, message)


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return "string" if isinstance(value, str) else "nested value"


def _parse_id(raw: object) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and _INT_RE.match(raw):
        return int(raw)
    raise ValueError(f"id must be an integer, got {json.dumps(raw)}")


def _json_event(obj: object, row_no: int, parse_ts: TimestampParser) -> None:
    """Check one JSONL object's header fields and attribute shapes (ValueError with the reason)."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    etype = obj.get("type")
    if not isinstance(etype, str) or not etype:
        raise ValueError("missing or empty 'type'")
    if "ts" not in obj:
        raise ValueError("missing 'ts'")
    if obj.get("id") is not None:
        _parse_id(obj["id"])
    parse_ts(obj["ts"])
    nested = obj.get("attrs")
    if nested is not None and not isinstance(nested, dict):
        raise ValueError("'attrs' must be a JSON object")
    flat = {k: v for k, v in obj.items() if k not in HEADER_FIELDS and k != "attrs"}
    for name, value in (flat | (nested or {})).items():
        if isinstance(value, (dict, list)):
            raise ValueError(f"attribute {name!r}: nested objects and arrays are not supported")


def load_bench_stream(path: str | Path) -> list[Event]:
    """Load a peer-benchmark stream (``bench/gen_stream.py``: ``type,key,ts,price``).

    Parameters
    ----------
    path : str or Path
        The CSV; ts in epoch seconds with 3 decimals.

    Returns
    -------
    list[Event]
        id = 1-based row number, ts in int microseconds, attrs ``{"key": int, "price": float}``.

    Raises
    ------
    EventFileError
        Wrong header or a malformed row.
    """
    events: list[Event] = []
    append = events.append
    with open(path, newline="", encoding="utf-8") as f:
        header = f.readline().strip()
        if tuple(header.split(",")) != BENCH_HEADER:
            raise EventFileError(path, 1, f"expected the bench header {','.join(BENCH_HEADER)!r}, got {header!r}")
        for line, text in enumerate(f, start=2):
            try:
                etype, key, ts, price = text.rstrip("\r\n").split(",")
                append(Event(len(events) + 1, etype, _scale(ts, 6), {"key": int(key), "price": float(price)}))
            except ValueError as e:
                if not text.strip():
                    continue
                raise EventFileError(path, line, f"bad bench row {text.strip()!r}: {e}") from None
    return events


def write_matches(matches: Iterable[Match], out: TextIO) -> int:
    """Write matches as JSONL, one object per line; returns how many were written."""
    lines = [match_line(m) for m in matches]
    if lines:
        out.write("\n".join(lines))
        out.write("\n")
    return len(lines)


def match_wire(match: Match) -> str:
    """One match with its whole events as a compact JSON string (for shipping matches between processes).

    Unlike :func:`match_line` (event ids only), this keeps every bound event's header and attributes,
    so :func:`match_from_wire` rebuilds a :class:`Match` that a JOIN or RETURN can be evaluated on::

        {"q": query, "s": start_us, "e": end_us, "f": fields, "v": {var: [[id, type, ts_us, attrs], ...]}}

    >>> m = Match("q", {"a": (Event(1, "T", 5, {"x": 1.5}),), "b": ()}, 5, 5, {"k": 1})
    >>> match_from_wire(match_wire(m)) == m
    True
    """
    doc = {
        "q": match.query,
        "s": match.start,
        "e": match.end,
        "f": match.fields,
        "v": {
            var: [[e.id, e.type, e.ts, e.attrs] + ([e.ts_end] if e.ts_end != e.ts else []) for e in evs]
            for var, evs in match.events.items()
        },
    }
    return orjson.dumps(doc, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


def match_from_wire(text: str | bytes) -> Match:
    """Inverse of :func:`match_wire` (events are new objects equal to the originals).

    Raises
    ------
    ValueError
        When ``text`` is not a :func:`match_wire` document.
    """
    try:
        doc = orjson.loads(text)
        events = {var: tuple(Event(*row) for row in evs) for var, evs in doc["v"].items()}
        return Match(doc["q"], events, doc["s"], doc["e"], doc["f"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"not a match document: {e}") from None
