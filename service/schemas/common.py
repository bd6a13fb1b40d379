"""Shared pieces of the API models: timestamps on the wire, names, cursors."""
from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime, timedelta
from typing import Annotated

from pydantic import BaseModel, Field, StringConstraints

from service.live.events import parse_ts

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_]*$", max_length=64)]
"""Event type and attribute names (also Delta table and column names)."""
Id = Annotated[int, Field(ge=1, le=(1 << 63) - 1)]


def iso(us: int) -> str:
    """int microseconds UTC -> ISO-8601 with offset (``2024-01-10T06:00:00.000001+00:00``).

    >>> iso(1_500_000)
    '1970-01-01T00:00:01.500000+00:00'
    """
    return (_EPOCH + timedelta(microseconds=us)).isoformat(timespec="microseconds")


def parse_wire_ts(text: str) -> int:
    """A query-string timestamp: ISO-8601 with offset, or epoch milliseconds -> int microseconds.

    Raises
    ------
    ValueError
    """
    t = text.strip()
    if t.lstrip("-").isdigit():
        return parse_ts(int(t))
    return parse_ts(t)


def encode_cursor(last_id: int) -> str:
    return base64.urlsafe_b64encode(f"id:{last_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    """The last id of the previous page. Raises ValueError for a cursor this API did not make."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("not a cursor returned by this API") from None
    kind, _, value = raw.partition(":")
    if kind != "id" or not value.isdigit() or int(value) >= 1 << 63:
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
    422: {"model": ErrorBody, "description": "Invalid input"},
}
