"""Deliveries (the outbox and its log): list, get with attempts, redeliver with the same key.

A deleted webhook's deliveries stay listed (``webhook_id`` filter), its pending ones ``cancelled``."""
from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from sqlalchemy import select

from service.api.deps import AdminKey, ReadKey, SessionDep
from service.api.paging import page
from service.core.errors import ApiError, get_or_404
from service.db.models import DeliveryAttemptRow, DeliveryRow, WebhookRow
from service.db.session import now_us
from service.schemas.alerts import DeliveryAttemptPublic, DeliveryDetail, DeliveryPage, DeliveryPublic
from service.schemas.common import ERRORS, CursorQuery, Id, iso

router = APIRouter(prefix="/deliveries", tags=["webhooks"], responses=ERRORS)  # type: ignore[arg-type]


def public(d: DeliveryRow) -> DeliveryPublic:
    return DeliveryPublic(
        id=d.id,
        alert_id=d.alert_id,
        webhook_id=d.webhook_id,
        idempotency_key=d.idempotency_key,
        status=d.status,  # type: ignore[arg-type]
        attempts=d.attempts,
        next_attempt_at=iso(d.next_attempt_at_us) if d.status == "pending" else None,
        last_status_code=d.last_status_code,
        last_error=d.last_error,
        created_at=iso(d.created_at_us),
        delivered_at=iso(d.delivered_at_us) if d.delivered_at_us is not None else None,
    )


@router.get("", summary="List deliveries, oldest first")
def list_deliveries(
    session: SessionDep,
    _: ReadKey,
    status: Annotated[Literal["pending", "delivered", "dead", "cancelled"] | None, Query()] = None,
    webhook_id: Annotated[Id | None, Query()] = None,
    alert_id: Annotated[Id | None, Query()] = None,
    cursor: CursorQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> DeliveryPage:
    stmt = select(DeliveryRow)
    if status is not None:
        stmt = stmt.where(DeliveryRow.status == status)
    if webhook_id is not None:
        stmt = stmt.where(DeliveryRow.webhook_id == webhook_id)
    if alert_id is not None:
        stmt = stmt.where(DeliveryRow.alert_id == alert_id)
    rows, next_cursor = page(session, stmt, DeliveryRow.id, cursor, limit)
    return DeliveryPage(items=[public(r) for r in rows], next_cursor=next_cursor)


def _get(session: SessionDep, delivery_id: int) -> DeliveryRow:
    return get_or_404(session, DeliveryRow, delivery_id, "delivery")


@router.get("/{id}", summary="Get a delivery with its attempt log")
def get_delivery(id: Id, session: SessionDep, _: ReadKey) -> DeliveryDetail:
    d = _get(session, id)
    attempts = session.scalars(
        select(DeliveryAttemptRow).where(DeliveryAttemptRow.delivery_id == id).order_by(DeliveryAttemptRow.id)
    )
    log = [
        DeliveryAttemptPublic(
            attempt=a.attempt,
            at=iso(a.at_us),
            outcome=a.outcome,  # type: ignore[arg-type]
            status_code=a.status_code,
            error=a.error,
            duration_ms=a.duration_ms,
        )
        for a in attempts
    ]
    return DeliveryDetail(**public(d).model_dump(), log=log)


@router.post("/{id}/redeliver", summary="Send again (same idempotency key), with a fresh attempt budget")
def redeliver(id: Id, request: Request, session: SessionDep, _: AdminKey) -> DeliveryPublic:
    d = _get(session, id)
    w = session.get(WebhookRow, d.webhook_id)
    if w is None or w.deleted_at_us is not None:
        raise ApiError(409, f"webhook {d.webhook_id} of delivery {id} was deleted", "path.id")
    d.status = "pending"
    d.attempts = 0
    d.next_attempt_at_us = now_us()
    d.lease_until_us = None
    session.commit()
    request.app.state.dispatcher.wake()
    return public(d)
