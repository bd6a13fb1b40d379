"""Ingest input: request bodies (JSON array or NDJSON) and per-event validation.

An event on the wire is ``{"type": T, "ts": TS, "id"?: int, "attrs": {...}}`` or the flat
form ``{"type": T, "ts": TS, "id"?: int, "<attr>": value, ...}`` (the ``lace match`` JSONL
form). ``ts`` and ``timestamp`` attributes are ISO-8601 strings with a UTC offset or epoch
milliseconds (a number); inside they become int microseconds UTC. Every attribute of the
type is required; unknown attributes are refused.

Missing values follow the rule of event files (engine/event_files.py): an attribute given as
``null`` (and without a default) is missing: left out of the event, so every comparison with it is
false. ``NaN`` is not JSON and is refused with the body.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from engine.event_type import EventType
from engine.events import MAX_TS_US, MIN_TS_US
from engine.io import parse_iso_us
from engine.rules.derived import DERIVED_ID_MIN

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
HEADER_KEYS = frozenset({"id", "type", "ts", "attrs", "ts_end"})
_MISSING = object()


class BodyError(ValueError):
    """A body that is not JSON / NDJSON (``column`` set: malformed, at ``line``/``column``): nothing is taken."""

    def __init__(self, reason: str, line: int | None = None, column: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.line = line
        self.column = column


class EventInvalid(ValueError):
    """One event that does not fit (``field`` relative to the event, e.g. ``attrs.price``)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason


def parse_body(body: bytes, content_type: str) -> list[tuple[Any, int | None]]:
    """Decode a ``POST /events`` body into ``(raw event, NDJSON line or None)`` pairs.

    JSON: an array of events or a single event object. NDJSON (``application/x-ndjson``,
    ``application/jsonl`` or any body whose JSON decoding fails after the first line):
    one event per non-blank line.

    Raises
    ------
    BodyError
        Malformed JSON (with the NDJSON line), or JSON that is neither an array nor an object.
    """
    ct = content_type.split(";", 1)[0].strip().lower()
    ndjson = ct in ("application/x-ndjson", "application/ndjson", "application/jsonl", "application/json-lines")
    if not ndjson:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            if not _first_line_is_json(body):
                raise BodyError(e.msg, e.lineno, e.colno) from None
            ndjson = True  # several lines, the first one JSON: read as NDJSON, which reports the bad line
        else:
            if isinstance(doc, list):
                return [(x, None) for x in doc]
            if isinstance(doc, dict):
                return [(doc, None)]
            raise BodyError("the body must be a JSON array of events, one event object, or NDJSON")
    out: list[tuple[Any, int | None]] = []
    for n, line in enumerate(body.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            out.append((orjson.loads(line), n))
        except orjson.JSONDecodeError as e:
            raise BodyError(e.msg, n, e.colno) from None
    return out


def _first_line_is_json(body: bytes) -> bool:
    lines = body.strip().split(b"\n", 1)
    if len(lines) < 2:
        return False
    try:
        orjson.loads(lines[0])
    except orjson.JSONDecodeError:
        return False
    return True


def parse_ts(raw: Any) -> int:
    """A wire timestamp (ISO-8601 with offset, or epoch milliseconds) -> int microseconds UTC.

    >>> parse_ts(1500), parse_ts("1970-01-01T00:00:01.5Z"), parse_ts(0.5)
    (1500000, 1500000, 500)
    """
    if type(raw) is int:
        us = raw * 1_000
    elif type(raw) is float:
        if not math.isfinite(raw):
            raise ValueError("must be finite")
        # far out of range: refused below (raw * 1000 could overflow to inf, and round(inf) raises)
        us = round(raw * 1_000) if abs(raw) <= 1e16 else MAX_TS_US + 1
    elif type(raw) is str:
        us = parse_iso_us(raw.strip())
    else:
        raise ValueError(f"must be an ISO-8601 string with offset or epoch milliseconds, not {_kind(raw)}")
    if not MIN_TS_US <= us <= MAX_TS_US:
        raise ValueError(
            "is out of range: timestamps go from 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z "
            f"({MIN_TS_US // 1000} to {MAX_TS_US // 1000} epoch ms)"
        )
    return us


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(v), type(v).__name__
    )


def _as_string(v: Any) -> Any:
    if type(v) is not str:
        raise ValueError(f"expected a string, got {_kind(v)}")
    return v


def _as_int(v: Any) -> Any:
    if type(v) is not int:
        raise ValueError(f"expected an integer, got {_kind(v)}")
    if not INT64_MIN <= v <= INT64_MAX:
        raise ValueError("integer out of the int64 range")
    return v


def _as_float(v: Any) -> Any:
    if type(v) is float:
        return v
    if type(v) is int:
        return float(v)
    raise ValueError(f"expected a number, got {_kind(v)}")


def _as_bool(v: Any) -> Any:
    if type(v) is not bool:
        raise ValueError(f"expected a boolean, got {_kind(v)}")
    return v


def _as_timestamp(v: Any) -> Any:
    if type(v) is bool or v is None:
        raise ValueError(f"expected a timestamp (ISO-8601 or epoch ms), got {_kind(v)}")
    return parse_ts(v)


CHECKERS: dict[str, Callable[[Any], Any]] = {
    "string": _as_string,
    "int": _as_int,
    "float": _as_float,
    "bool": _as_bool,
    "timestamp": _as_timestamp,
}


def validate_event(
    raw: Any, types: Mapping[str, EventType]
) -> tuple[EventType, int | None, int, dict[str, Any], int]:
    """Check one raw event; return ``(type, id or None, ts_us, attrs, ts_end_us)``.

    ``ts_end_us`` is ``ts_us`` for an event of a point type; an event of an interval type needs
    ``ts_end`` (same forms as ``ts``) after ``ts`` and no longer than the type's maximum duration.

    Raises
    ------
    EventInvalid
        With the field (``type``, ``ts``, ``ts_end``, ``id``, ``attrs.<name>``) and the reason.
    """
    if type(raw) is not dict:
        raise EventInvalid("", f"an event must be a JSON object, not {_kind(raw)}")
    name = raw.get("type")
    spec = types.get(name) if type(name) is str else None
    if spec is None:
        if name is None:
            raise EventInvalid("type", "is required")
        raise EventInvalid(
            "type", f"unknown event type {name!r}" if type(name) is str else f"must be a string, not {_kind(name)}"
        )
    try:
        ts = parse_ts(raw.get("ts")) if "ts" in raw else None
    except ValueError as e:
        raise EventInvalid("ts", str(e)) from None
    if ts is None:
        raise EventInvalid("ts", "is required")
    ts_end = ts
    if spec.interval:
        try:
            end = parse_ts(raw.get("ts_end")) if "ts_end" in raw else None
        except ValueError as e:
            raise EventInvalid("ts_end", str(e)) from None
        if end is None:
            raise EventInvalid("ts_end", f"is required by interval type {spec.name}")
        if end <= ts:
            raise EventInvalid("ts_end", f"must be after ts (an interval event of type {spec.name} needs ts_end > ts)")
        if spec.max_duration_us is not None and end - ts > spec.max_duration_us:
            raise EventInvalid(
                "ts_end",
                f"the event lasts {end - ts} us, longer than type {spec.name}'s max_duration "
                f"({spec.max_duration_us} us)",
            )
        ts_end = end
    elif "ts_end" in raw:
        raise EventInvalid("ts_end", f"type {spec.name} is a point type (register it with \"interval\": true)")
    eid = raw.get("id")
    if eid is not None and (type(eid) is not int or not 0 <= eid < DERIVED_ID_MIN):
        raise EventInvalid("id", "must be an integer in [0, 2^62) (ids from 2^62 on are those of derived events)")
    attrs = raw.get("attrs")
    if attrs is None:  # flat form: the attributes are the other keys
        attrs, prefix = raw, ""
        n_other = len(raw) - 2 - ("id" in raw) - ("attrs" in raw) - ("ts_end" in raw)
    elif type(attrs) is not dict:
        raise EventInvalid("attrs", f"must be an object, not {_kind(attrs)}")
    else:
        prefix = "attrs."
        n_other = len(attrs)
        if len(raw) != 3 + ("id" in raw) + ("ts_end" in raw):
            extra = sorted(k for k in raw if k not in HEADER_KEYS)
            raise EventInvalid(extra[0], "unknown field next to 'attrs' (put attributes inside 'attrs')")
    out: dict[str, Any] = {}
    known = 0
    defaults = spec.defaults
    for attr, kind in spec.attributes.items():
        v = attrs.get(attr, _MISSING)
        if (v is _MISSING or v is None) and attr in defaults:
            known += v is not _MISSING
            if defaults[attr] is not None:
                out[attr] = defaults[attr]
            continue
        if v is _MISSING:
            raise EventInvalid(prefix + attr, f"is required by type {spec.name}")
        known += 1
        if v is None:  # null without a default: a missing value, left out of the event
            continue
        try:
            out[attr] = CHECKERS[kind](v)
        except ValueError as e:
            raise EventInvalid(prefix + attr, f"{e} ({spec.name}.{attr} is {kind})") from None
    if n_other != known:
        extra = sorted(k for k in attrs if k not in out and (prefix or k not in HEADER_KEYS))
        raise EventInvalid(prefix + extra[0], f"unknown attribute of type {spec.name}")
    return spec, eid, ts, out, ts_end
