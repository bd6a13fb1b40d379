"""Backfills: ``/backfills`` (start over ``[from, to)``, list, progress, cancel, results).

A backfill runs a registered query's text over the archived events on Spark
(:mod:`service.backfills`, :func:`archive.backfill.run_backfill`); its matches land in the archive's
Delta results table and, with ``deliver``, in the query's alerts and webhooks.
"""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from service import backfills
from service.api.deps import AdminKey, ReadKey, SessionDep, SettingsDep
from service.api.paging import page
from service.backfills import BackfillRunner
from service.db.models import BackfillRow
from service.schemas.backfills import BackfillCreate, BackfillPage, BackfillPublic, BackfillResults
from service.schemas.common import ERRORS, CursorQuery, Id, wire_ts

router = APIRouter(prefix="/backfills", tags=["backfills"], responses=ERRORS)  # type: ignore[arg-type]


def _runner(request: Request) -> BackfillRunner | None:
    """The service's backfill runner; None with the archive off."""
    return getattr(request.app.state, "backfills", None)


@router.post("", status_code=202, summary="Start a backfill of a query over archived history [from, to)")
def create_backfill(body: BackfillCreate, request: Request, session: SessionDep, _: AdminKey) -> BackfillPublic:
    runner = backfills.need(_runner(request))
    lo, hi = wire_ts(body.from_, "body.from"), wire_ts(body.to, "body.to")
    return backfills.public(backfills.enqueue(session, runner, body.query_id, lo, hi, body.deliver))


@router.get("", summary="List backfills (newest last)")
def list_backfills(
    session: SessionDep,
    _: ReadKey,
    query_id: Annotated[Id | None, Query()] = None,
    cursor: CursorQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> BackfillPage:
    rows, next_cursor = page(session, backfills.selection(query_id), BackfillRow.id, cursor, limit)
    return BackfillPage(items=[backfills.public(r) for r in rows], next_cursor=next_cursor)


@router.get("/{id}", summary="A backfill: state, progress (percent of Spark tasks, events scanned), outcome")
def get_backfill(id: Id, session: SessionDep, _: ReadKey) -> BackfillPublic:
    return backfills.public(backfills.get(session, id))


@router.post("/{id}/cancel", summary="Cancel a queued or running backfill (stops its Spark jobs)")
def cancel_backfill(id: Id, request: Request, session: SessionDep, _: AdminKey) -> BackfillPublic:
    return backfills.public(backfills.cancel(session, _runner(request), id))


@router.get("/{id}/results", summary="The matches of a succeeded backfill, in (start, end) order")
def backfill_results(
    id: Id,
    session: SessionDep,
    settings: SettingsDep,
    _: ReadKey,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> BackfillResults:
    return backfills.results(session, settings.archive_root, id, offset, limit)
