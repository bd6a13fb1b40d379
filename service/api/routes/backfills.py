"""Backfills: ``/backfills`` (start over ``[from, to)``, list, progress, cancel, results).

A backfill runs a registered query's text over the archived events on Spark
(:mod:`service.backfills`, :func:`archive.backfill.run_backfill`); its matches land in the archive's
Delta results table and, with ``deliver``, in the query's alerts and webhooks.
"""
from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from sqlalchemy import select, update

from service.api.deps import AdminKey, ReadKey, SessionDep, SettingsDep
from service.api.paging import page
from service.backfills import FINAL_STATES, BackfillRunner
from service.core.errors import ApiError, get_or_404
from service.db.models import BackfillRow, QueryRow
from service.db.session import now_us
from service.schemas.backfills import BackfillCreate, BackfillMatch, BackfillPage, BackfillPublic, BackfillResults
from service.schemas.common import ERRORS, CursorQuery, Id, iso, parse_wire_ts

router = APIRouter(prefix="/backfills", tags=["backfills"], responses=ERRORS)  # type: ignore[arg-type]


def public(row: BackfillRow) -> BackfillPublic:
    return BackfillPublic(
        id=row.id,
        query_id=row.query_id,
        query_version=row.query_version,
        run_id=row.run_id,
        state=row.state,  # type: ignore[arg-type]
        from_=iso(row.from_us),
        to=iso(row.to_us),
        deliver=row.deliver,
        percent=row.percent,
        events_scanned=row.events_scanned,
        matches=row.matches,
        alerts=row.alerts,
        versions=row.versions,
        error=row.error,
        created_at=iso(row.created_at_us),
        started_at=None if row.started_at_us is None else iso(row.started_at_us),
        finished_at=None if row.finished_at_us is None else iso(row.finished_at_us),
    )


def _runner(request: Request) -> BackfillRunner:
    runner: BackfillRunner | None = getattr(request.app.state, "backfills", None)
    if runner is None:
        raise ApiError(409, "backfills need the archive (LACE_ARCHIVE_ENABLED=true)", None)
    return runner


def _ts(value: str | int, name: str) -> int:
    try:
        return parse_wire_ts(value)
    except ValueError as e:
        raise ApiError(422, str(e), f"body.{name}") from None


def _get(session: SessionDep, backfill_id: int) -> BackfillRow:
    return get_or_404(session, BackfillRow, backfill_id, "backfill")


@router.post("", status_code=202, summary="Start a backfill of a query over archived history [from, to)")
def create_backfill(body: BackfillCreate, request: Request, session: SessionDep, _: AdminKey) -> BackfillPublic:
    runner = _runner(request)
    lo, hi = _ts(body.from_, "from"), _ts(body.to, "to")
    if hi <= lo:
        raise ApiError(422, "must be after from", "body.to")
    query = get_or_404(session, QueryRow, body.query_id, "query", "body.query_id")
    row = BackfillRow(
        query_id=query.id,
        query_version=query.version,
        run_id=uuid.uuid4().hex,
        state="queued",
        from_us=lo,
        to_us=hi,
        deliver=body.deliver,
        percent=0.0,
        events_scanned=0,
        created_at_us=now_us(),
    )
    session.add(row)
    session.commit()
    runner.wake()
    return public(row)


@router.get("", summary="List backfills (newest last)")
def list_backfills(
    session: SessionDep,
    _: ReadKey,
    query_id: Annotated[Id | None, Query()] = None,
    cursor: CursorQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> BackfillPage:
    stmt = select(BackfillRow)
    if query_id is not None:
        stmt = stmt.where(BackfillRow.query_id == query_id)
    rows, next_cursor = page(session, stmt, BackfillRow.id, cursor, limit)
    return BackfillPage(items=[public(r) for r in rows], next_cursor=next_cursor)


@router.get("/{id}", summary="A backfill: state, progress (percent of Spark tasks, events scanned), outcome")
def get_backfill(id: Id, session: SessionDep, _: ReadKey) -> BackfillPublic:
    return public(_get(session, id))


@router.post("/{id}/cancel", summary="Cancel a queued or running backfill (stops its Spark jobs)")
def cancel_backfill(id: Id, request: Request, session: SessionDep, _: AdminKey) -> BackfillPublic:
    row = _get(session, id)
    if row.state in FINAL_STATES:
        raise ApiError(409, f"the backfill has ended ({row.state})", "path.id")
    # a queued one ends here; a running one ends when its Spark job group has stopped
    runner = _runner(request)
    res: Any = session.execute(
        update(BackfillRow)
        .where(BackfillRow.id == id, BackfillRow.state == "queued")
        .values(state="cancelled", finished_at_us=now_us())
    )
    session.commit()
    if res.rowcount and runner.metrics is not None:
        runner.metrics.backfills.labels("cancelled").inc()
    runner.cancel(id)
    session.refresh(row)
    return public(row)


@router.get("/{id}/results", summary="The matches of a succeeded backfill, in (start, end) order")
def backfill_results(
    id: Id,
    session: SessionDep,
    settings: SettingsDep,
    _: ReadKey,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> BackfillResults:
    import orjson

    from archive.backfill import read_results

    row = _get(session, id)
    if row.state != "succeeded":
        raise ApiError(409, f"the backfill has no results: it is {row.state}", "path.id")
    table = read_results(settings.archive_root, row.run_id)
    table = table.sort_by([("start", "ascending"), ("end", "ascending"), ("match", "ascending")])
    lines = table.column("match").to_pylist()[offset : offset + limit]
    nxt = offset + limit if offset + limit < table.num_rows else None
    return BackfillResults(
        items=[BackfillMatch(**orjson.loads(s)) for s in lines], total=table.num_rows, next_offset=nxt
    )
