"""Shared pieces of the API models: timestamps on the wire, names, cursors."""
from __future__ import annotations

import base64
import binascii
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, overload

from fastapi import Query
from pydantic import BaseModel, BeforeValidator, Field, StringConstraints, WithJsonSchema

from engine.events import MAX_TS_US, MIN_TS_US
from service.core.errors import ApiError
from service.live.events import parse_ts

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_]*$", max_length=64)]
"""Event type and attribute names (also Delta table and column names)."""
MAX_ID = (1 << 53) - 1
"""Largest id the API takes: the largest integer every JSON client holds exactly."""
Id = Annotated[int, Field(ge=1, le=MAX_ID)]


def json_int(value: Any) -> Any:
    """A JSON integer of a request body: an int, or a float with no fraction (``5.0``, as JSON Schema
    counts it); not a boolean, not a string. Raises ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be an integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("must be an integer")
        return int(value)
    return value


def json_int_type(ge: int, le: int) -> Any:
    """An integer from ``ge`` to ``le`` in a JSON body (:func:`json_int`), for models that otherwise coerce nothing."""
    return Annotated[
        int,
        BeforeValidator(json_int),
        Field(strict=False, ge=ge, le=le),
        WithJsonSchema({"type": "integer", "minimum": ge, "maximum": le}),
    ]


BodyId = json_int_type(1, MAX_ID)
"""An id in a JSON body."""

# ------------------------------------------------------------------ timestamps on the wire
_YEAR = r"(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_MONTH_DAY = r"(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)"
_LEAP_DAY = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)-02-29"
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?"
_OFFSET = r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
ISO_PATTERN = rf"^(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_DAY})T{_TIME}{_OFFSET}$"
"""The ISO-8601 (RFC 3339) timestamps the API reads: a real calendar date, ``T``, time to at most the
microsecond, ``Z`` or a ``±HH:MM`` offset (``2024-01-10T06:00:00.5+01:00``)."""
_ISO_RE = re.compile(ISO_PATTERN)
_INT_RE = re.compile(r"^-?[0-9]+$")
MIN_TS_MS, MAX_TS_MS = MIN_TS_US // 1000, MAX_TS_US // 1000
_TS_HELP = "ISO-8601 with offset (e.g. 2024-01-10T06:00:00Z), or epoch milliseconds"
WIRE_TS_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "pattern": ISO_PATTERN},
        {"type": "integer", "minimum": MIN_TS_MS, "maximum": MAX_TS_MS},
    ],
    "description": _TS_HELP,
}


def iso(us: int) -> str:
    """int microseconds UTC -> ISO-8601 with offset (``2024-01-10T06:00:00.000001+00:00``).

    >>> iso(1_500_000)
    '1970-01-01T00:00:01.500000+00:00'
    """
    return (_EPOCH + timedelta(microseconds=us)).isoformat(timespec="microseconds")


def ms(us: int) -> int | float:
    """int microseconds -> milliseconds for an answer: an int when whole (every duration given in ms, or in a
    larger unit), a float otherwise (an LQL duration in ``us``).

    >>> ms(5_000_000), ms(1_500)
    (5000, 1.5)
    """
    return us // 1_000 if us % 1_000 == 0 else us / 1_000


def parse_wire_ts(value: str | int, *, from_query: bool = False) -> int:
    """A timestamp of a request (:data:`WIRE_TS_SCHEMA`) -> int microseconds UTC.

    ``value`` is an int (epoch milliseconds) or a string of :data:`ISO_PATTERN`; in a query string
    (``from_query``) epoch milliseconds come as a string of digits. An ISO timestamp whose offset
    takes it past year 1 or 9999 is clamped to the range.

    >>> parse_wire_ts("1970-01-01T00:00:01.5Z"), parse_wire_ts(1500), parse_wire_ts("-1", from_query=True)
    (1500000, 1500000, -1000)

    Raises
    ------
    ValueError
        Anything else, or epoch milliseconds out of range.
    """
    if from_query and isinstance(value, str) and _INT_RE.match(value):
        value = int(value)
    if type(value) is int:
        return parse_ts(value)
    if isinstance(value, str) and _ISO_RE.match(value):
        dt = datetime.fromisoformat(value)
        return min(max((dt - _EPOCH) // timedelta(microseconds=1), MIN_TS_US), MAX_TS_US)
    raise ValueError(f"must be {_TS_HELP}")


@overload
def wire_ts(value: str | int, field: str, *, from_query: bool = False) -> int: ...


@overload
def wire_ts(value: None, field: str, *, from_query: bool = False) -> None: ...


def wire_ts(value: str | int | None, field: str, *, from_query: bool = False) -> int | None:
    """:func:`parse_wire_ts` of a request's ``field`` (int microseconds UTC); None stays None.

    Raises
    ------
    ApiError
        422 on ``field`` when ``value`` is no timestamp.
    """
    if value is None:
        return None
    try:
        return parse_wire_ts(value, from_query=from_query)
    except ValueError as e:
        raise ApiError(422, str(e), field) from None


def _wire_ts(value: Any) -> Any:
    return value if isinstance(value, str) else json_int(value)


WireTs = Annotated[str | int, BeforeValidator(_wire_ts), WithJsonSchema(WIRE_TS_SCHEMA)]
"""A timestamp in a JSON body: a string (checked against :data:`ISO_PATTERN` by :func:`parse_wire_ts`)
or epoch milliseconds."""
TsQuery = Annotated[str | None, Query(description=_TS_HELP), WithJsonSchema(WIRE_TS_SCHEMA)]
"""A timestamp in the query string (``since``, ``until``)."""


def _cursor_pattern() -> str:
    # base64url, unpadded, of "id:" and 1 to 18 digits: "aWQ6", then 4 characters per 3 digits
    # (the first two carry the first digit), 2 or 3 for a last 1 or 2 digits
    first = r"(?:[MN][DTjz]|O[DT])"
    group = first + r"[AEIMQUYcgk][wxyz0-5]"
    tail = rf"(?:(?:[MN][AQgw]|O[AQ])|{first}[AEIMQUYcgk])"
    return rf"^aWQ6(?:(?:{group}){{1,6}}|(?:{group}){{0,5}}{tail})$"


CURSOR_PATTERN = _cursor_pattern()
"""Exactly the cursors :func:`encode_cursor` makes (an id of at most 18 digits)."""
CursorQuery = Annotated[
    str | None,
    Query(max_length=28, pattern=CURSOR_PATTERN, description="`next_cursor` of the previous page"),
]


def encode_cursor(last_id: int) -> str:
    return base64.urlsafe_b64encode(f"id:{last_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    """The last id of the previous page. Raises ValueError for a cursor this API did not make."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("not a cursor returned by this API") from None
    kind, _, value = raw.partition(":")
    if kind != "id" or not re.fullmatch(r"[0-9]{1,18}", value):
        raise ValueError("not a cursor returned by this API")
    return int(value)


class Problem(BaseModel):
    """One error: where and why."""

    field: str | None = None
    reason: str


class ErrorBody(BaseModel):
    """The body of every 4xx answer."""

    detail: list[Problem]


ERRORS = {
    400: {"model": ErrorBody, "description": "Malformed request"},
    401: {"model": ErrorBody, "description": "Missing or unknown API key"},
    403: {"model": ErrorBody, "description": "The key lacks the scope this route needs"},
    404: {"model": ErrorBody, "description": "Unknown id"},
    409: {"model": ErrorBody, "description": "Conflicts with existing records"},
    413: {"model": ErrorBody, "description": "Body too large"},
    415: {"model": ErrorBody, "description": "The body is not JSON (Content-Type)"},
    422: {"model": ErrorBody, "description": "Invalid input"},
}
AUTH_ERRORS = {k: ERRORS[k] for k in (401, 403)}
"""The answers of a route that needs a key (and takes no input)."""
