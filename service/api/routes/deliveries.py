"""Deliveries (the outbox and its log): list, get with attempts, redeliver with the same key.

A deleted webhook's deliveries stay listed (``webhook_id`` filter), its pending ones ``cancelled``."""
from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

from service.api.deps import AdminKey, ReadKey, SessionDep
from service.api.paging import page
from service.db.models import DeliveryRow
from service.schemas.alerts import DeliveryDetail, DeliveryPage, DeliveryPublic
from service.schemas.common import ERRORS, CursorQuery, Id
from service.webhooks import delivery

router = APIRouter(prefix="/deliveries", tags=["webhooks"], responses=ERRORS)  # type: ignore[arg-type]


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
    stmt = delivery.selection(status, webhook_id, alert_id)
    rows, next_cursor = page(session, stmt, DeliveryRow.id, cursor, limit)
    return DeliveryPage(items=[delivery.public(r) for r in rows], next_cursor=next_cursor)


@router.get("/{id}", summary="Get a delivery with its attempt log")
def get_delivery(id: Id, session: SessionDep, _: ReadKey) -> DeliveryDetail:
    return delivery.detail(session, delivery.get(session, id))


@router.post("/{id}/redeliver", summary="Send again (same idempotency key), with a fresh attempt budget")
def redeliver(id: Id, request: Request, session: SessionDep, _: AdminKey) -> DeliveryPublic:
    d = delivery.redeliver(session, id)
    request.app.state.dispatcher.wake()
    return delivery.public(d)
