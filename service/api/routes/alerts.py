"""Alerts: ``GET /alerts`` (filter by query and match time, cursor paging) and ``GET /alerts/{id}``."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import select

from service.api.deps import ReadKey, SessionDep
from service.api.paging import page
from service.core.errors import ApiError, get_or_404
from service.db.models import AlertRow
from service.schemas.alerts import AlertPage, AlertPublic
from service.schemas.common import ERRORS, CursorQuery, Id, TsQuery, iso, parse_wire_ts

router = APIRouter(prefix="/alerts", tags=["alerts"], responses=ERRORS)  # type: ignore[arg-type]


def public(row: AlertRow) -> AlertPublic:
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


def _ts(value: str | None, name: str) -> int | None:
    if value is None:
        return None
    try:
        return parse_wire_ts(value, from_query=True)
    except ValueError as e:
        raise ApiError(422, str(e), f"query.{name}") from None


@router.get("", summary="List alerts, oldest first")
def list_alerts(
    session: SessionDep,
    _: ReadKey,
    query_id: Annotated[Id | None, Query(description="only this query's alerts")] = None,
    since: Annotated[TsQuery, Query(description="match end >= since")] = None,
    until: Annotated[TsQuery, Query(description="match end < until")] = None,
    cursor: CursorQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> AlertPage:
    stmt = select(AlertRow)
    if query_id is not None:
        stmt = stmt.where(AlertRow.query_id == query_id)
    lo, hi = _ts(since, "since"), _ts(until, "until")
    if lo is not None:
        stmt = stmt.where(AlertRow.end_us >= lo)
    if hi is not None:
        stmt = stmt.where(AlertRow.end_us < hi)
    rows, next_cursor = page(session, stmt, AlertRow.id, cursor, limit)
    return AlertPage(items=[public(r) for r in rows], next_cursor=next_cursor)


@router.get("/{id}", summary="Get an alert")
def get_alert(id: Id, session: SessionDep, _: ReadKey) -> AlertPublic:
    return public(get_or_404(session, AlertRow, id, "alert"))
