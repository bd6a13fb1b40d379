"""The alert of the service, converted in one place (one model per concept).

An alert (a match of a registered query, made by :mod:`service.live.outbox` or a delivering backfill) is stored
as an :class:`~service.db.models.AlertRow` (times int microseconds UTC); :func:`public` gives its REST shape
:class:`~service.schemas.alerts.AlertPublic` (times ISO-8601), :func:`selection` the rows ``GET /alerts`` lists.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import Select, select

from service.db.models import AlertRow
from service.schemas.alerts import AlertPublic
from service.schemas.common import iso


def public(row: AlertRow) -> AlertPublic:
    """The REST shape of ``row``: the match's events, bounds (``start``, ``end``) and RETURN fields, with its
    query's id and version and when it was detected (times ISO-8601)."""
    return AlertPublic(
        id=row.id,
        query_id=row.query_id,
        query_version=row.query_version,
        events=row.events,
        start=iso(row.start_us),
        end=iso(row.end_us),
        fields=row.fields,
        detected_at=iso(row.created_at_us),
    )


def selection(query_id: int | None, since_us: int | None, until_us: int | None) -> Select[Any]:
    """The alerts of query ``query_id`` whose match ends in ``[since_us, until_us)`` (int us UTC); None: any."""
    stmt = select(AlertRow)
    if query_id is not None:
        stmt = stmt.where(AlertRow.query_id == query_id)
    if since_us is not None:
        stmt = stmt.where(AlertRow.end_us >= since_us)
    if until_us is not None:
        stmt = stmt.where(AlertRow.end_us < until_us)
    return stmt
