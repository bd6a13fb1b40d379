"""Event files in, match files out (DESIGN.md sections 3 and 12).

Event files are CSV with a header ``id,type,ts,<attrs...>`` or JSONL with the same
fields. ``ts`` is an ISO-8601 string with a UTC offset, or a number; see
:func:`read_events` for how numbers are read. Inside, every ts is int microseconds UTC.

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

from engine.events import Event
from engine.match import Match

TsUnit = Literal["auto", "ms", "s", "us"]
FileFormat = Literal["auto", "csv", "jsonl"]

BENCH_HEADER = ("type", "key", "ts", "price")
HEADER_FIELDS = ("id", "type", "ts")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)
_INT_RE = re.compile(r"[+-]?\d+\Z")
_DECIMAL_RE = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+)\Z")
_FLOAT_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\Z")
_DIGITS_PER_UNIT = {"us": 0, "ms": 3, "s": 6}  # decimal digits from the unit down to microseconds
_POW10: tuple[int, ...] = (1, 10, 100, 1_000, 10_000, 100_000, 1_000_000)


class EventFileError(ValueError):
    """A bad row (or header) in an event file.

    Attributes
    ----------
    path : str
        The file, as the caller named it.
    line : int
        1-based line number in the file (the header is line 1 of a CSV file).
    reason : str
        One line saying what is wrong.

    ``str(err)`` is ``"<path> line <line>: <reason>"``.
    """

    def __init__(self, path: str | Path, line: int, reason: str) -> None:
        self.path = str(path)
        self.line = line
        self.reason = reason
        super().__init__(f"{self.path} line {line}: {reason}")


def parse_value(text: str) -> Any:
    """Type one CSV cell: int, float, bool (``true``/``false``, any case), else the string.

    >>> parse_value("42"), parse_value("-1.5e3"), parse_value("TRUE"), parse_value("IBM")
    (42, -1500.0, True, 'IBM')
    """
    if not text:
        return text
    if text.isascii() and text.isdigit():
        return int(text)
    if text[0].isalpha() and text[0] not in "iInN":  # not a number (inf/nan are floats to the regex)
        lowered = text.lower()
        return True if lowered == "true" else False if lowered == "false" else text
    if _INT_RE.match(text):
        return int(text)
    if _FLOAT_RE.match(text):
        return float(text)
    lowered = text.lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    return text


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


def detect_format(path: str | Path) -> Literal["csv", "jsonl"]:
    """``jsonl`` for ``.jsonl``/``.ndjson``/``.json`` or a file starting with ``{``, else ``csv``."""
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffix == ".csv":
        return "csv"
    with open(path, encoding="utf-8-sig") as f:
        head = f.read(4096).lstrip()
    return "jsonl" if head.startswith("{") else "csv"


def iter_event_rows(
    path: str | Path, *, ts_unit: TsUnit = "auto", format: FileFormat = "auto"
) -> Iterator[tuple[int, Event]]:
    """Like :func:`read_events`, yielding ``(line number, event)`` pairs."""
    fmt = detect_format(path) if format == "auto" else format
    parse_ts = TimestampParser(ts_unit)
    if fmt == "csv":
        return _csv_rows(path, parse_ts)
    if fmt == "jsonl":
        return _jsonl_rows(path, parse_ts)
    raise ValueError(f"unknown event file format {format!r} (auto, csv or jsonl)")


def read_events(path: str | Path, *, ts_unit: TsUnit = "auto", format: FileFormat = "auto") -> Iterator[Event]:
    """Read an event file, in file order.

    Parameters
    ----------
    path : str or Path
        A CSV file with a header naming ``type``, ``ts``, optionally ``id``, then
        attributes; or a JSONL file, one object per line with the same fields
        (flat, or attributes under an ``"attrs"`` object).
    ts_unit : {"auto", "ms", "s", "us"}
        Unit of numeric ts values; ``"auto"``: integers are epoch milliseconds,
        decimals such as ``12.345`` are epoch seconds. ISO-8601 strings need an offset.
    format : {"auto", "csv", "jsonl"}
        ``"auto"`` decides by suffix, then by the first character.

    Returns
    -------
    Iterator[Event]
        ts in int microseconds UTC. Without an ``id`` field, id = 1-based row number
        (blank lines and the header do not count). CSV cells are typed by
        :func:`parse_value`; an empty cell or a JSON ``null`` leaves the attribute out.

    Raises
    ------
    EventFileError
        A malformed header or row, with its line number.
    OSError
        The file cannot be read.
    """
    for _, event in iter_event_rows(path, ts_unit=ts_unit, format=format):
        yield event


def _csv_rows(path: str | Path, parse_ts: TimestampParser) -> Iterator[tuple[int, Event]]:
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f, skipinitialspace=True)
        header = next(reader, None)
        if header is None:
            raise EventFileError(path, 1, "empty file: expected a header such as 'id,type,ts,...'")
        names = [h.strip() for h in header]
        _check_header(path, names)
        i_id = names.index("id") if "id" in names else None
        i_type, i_ts = names.index("type"), names.index("ts")
        attr_cols = [(i, n) for i, n in enumerate(names) if n not in HEADER_FIELDS]
        row_no = 0
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            line = reader.line_num
            row_no += 1
            if len(row) != len(names):
                raise EventFileError(path, line, f"expected {len(names)} fields, got {len(row)}")
            try:
                etype = row[i_type].strip()
                if not etype:
                    raise ValueError("empty type")
                event_id = _parse_id(row[i_id].strip()) if i_id is not None else row_no
                ts = parse_ts(row[i_ts])
            except ValueError as e:
                raise EventFileError(path, line, str(e)) from None
            attrs = {n: parse_value(v) for i, n in attr_cols if (v := row[i].strip())}
            yield line, Event(event_id, etype, ts, attrs)


def _check_header(path: str | Path, names: list[str]) -> None:
    missing = [n for n in ("type", "ts") if n not in names]
    if missing:
        raise EventFileError(path, 1, f"header lacks {', '.join(repr(m) for m in missing)} (got {','.join(names)})")
    if "" in names:
        raise EventFileError(path, 1, f"empty column name in header (column {names.index('') + 1})")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise EventFileError(path, 1, f"duplicate column {dupes[0]!r} in header")


def _parse_id(raw: object) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and _INT_RE.match(raw):
        return int(raw)
    raise ValueError(f"id must be an integer, got {json.dumps(raw)}")


def _jsonl_rows(path: str | Path, parse_ts: TimestampParser) -> Iterator[tuple[int, Event]]:
    with open(path, encoding="utf-8-sig") as f:
        row_no = 0
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            row_no += 1
            try:
                yield line, _json_event(json.loads(text), row_no, parse_ts)
            except json.JSONDecodeError as e:
                raise EventFileError(path, line, f"invalid JSON: {e.msg} at column {e.colno}") from None
            except ValueError as e:
                raise EventFileError(path, line, str(e)) from None


def _json_event(obj: object, row_no: int, parse_ts: TimestampParser) -> Event:
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    etype = obj.get("type")
    if not isinstance(etype, str) or not etype:
        raise ValueError("missing or empty 'type'")
    if "ts" not in obj:
        raise ValueError("missing 'ts'")
    event_id = _parse_id(obj["id"]) if obj.get("id") is not None else row_no
    ts = parse_ts(obj["ts"])
    flat = {k: v for k, v in obj.items() if k not in HEADER_FIELDS and k != "attrs"}
    nested = obj.get("attrs")
    if nested is not None and not isinstance(nested, dict):
        raise ValueError("'attrs' must be a JSON object")
    attrs: dict[str, Any] = {}
    for name, value in (flat | (nested or {})).items():
        if value is None:
            continue
        if not isinstance(value, (str, int, float, bool)):
            raise ValueError(f"attribute {name!r}: nested objects and arrays are not supported")
        attrs[name] = value
    return Event(event_id, etype, ts, attrs)


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


def match_line(match: Match) -> str:
    """One match as a compact JSON line (no newline): ``Match.to_json()``.

    Values JSON cannot hold natively (e.g. a Decimal in a RETURN field) are written as strings.
    """
    return orjson.dumps(match.to_json(), default=str, option=orjson.OPT_NON_STR_KEYS).decode()


def write_matches(matches: Iterable[Match], out: TextIO) -> int:
    """Write matches as JSONL, one object per line; returns how many were written."""
    n = 0
    for m in matches:
        out.write(match_line(m))
        out.write("\n")
        n += 1
    return n


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
        "v": {var: [[e.id, e.type, e.ts, e.attrs] for e in evs] for var, evs in match.events.items()},
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
        events = {var: tuple(Event(i, t, ts, attrs) for i, t, ts, attrs in evs) for var, evs in doc["v"].items()}
        return Match(doc["q"], events, doc["s"], doc["e"], doc["f"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"not a match document: {e}") from None
