"""Alerts: ``GET /alerts`` (filter by query and match time, cursor paging) and ``GET /alerts/{id}``."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from service import alert
from service.api.deps import ReadKey, SessionDep
from service.api.paging import page
from service.core.errors import get_or_404
from service.db.models import AlertRow
from service.schemas.alerts import AlertPage, AlertPublic
from service.schemas.common import ERRORS, CursorQuery, Id, TsQuery, wire_ts

router = APIRouter(prefix="/alerts", tags=["alerts"], responses=ERRORS)  # type: ignore[arg-type]


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
    lo = wire_ts(since, "query.since", from_query=True)
    hi = wire_ts(until, "query.until", from_query=True)
    rows, next_cursor = page(session, alert.selection(query_id, lo, hi), AlertRow.id, cursor, limit)
    return AlertPage(items=[alert.public(r) for r in rows], next_cursor=next_cursor)


@router.get("/{id}", summary="Get an alert")
def get_alert(id: Id, session: SessionDep, _: ReadKey) -> AlertPublic:
    return alert.public(get_or_404(session, AlertRow, id, "alert"))
