"""The delivery (one alert to one webhook: the outbox and its log) of the service, converted in one place (one
model per concept).

A delivery is stored as a :class:`~service.db.models.DeliveryRow`, each attempt at it as a
:class:`~service.db.models.DeliveryAttemptRow` (times int microseconds UTC); the dispatcher sends them
(:mod:`service.webhooks.store`). :func:`public` and :func:`detail` give the REST shapes
:class:`~service.schemas.alerts.DeliveryPublic` and :class:`~service.schemas.alerts.DeliveryDetail` (times
ISO-8601). A deleted webhook's deliveries stay, its pending ones ``cancelled``.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from service.core.errors import ApiError, get_or_404
from service.db.models import DeliveryAttemptRow, DeliveryRow, WebhookRow
from service.db.session import now_us
from service.schemas.alerts import DeliveryAttemptPublic, DeliveryDetail, DeliveryPublic
from service.schemas.common import iso


def public(d: DeliveryRow) -> DeliveryPublic:
    """The REST shape of ``d``: alert, webhook, idempotency key, status, attempts, when next attempted (pending
    ones only), the last answer, when made and delivered."""
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


def detail(session: Session, d: DeliveryRow) -> DeliveryDetail:
    """:func:`public` with the log of ``d``'s attempts, oldest first (outcome, status code, error, duration ms)."""
    attempts = session.scalars(
        select(DeliveryAttemptRow).where(DeliveryAttemptRow.delivery_id == d.id).order_by(DeliveryAttemptRow.id)
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


def selection(status: str | None, webhook_id: int | None, alert_id: int | None) -> Select[Any]:
    """The deliveries in ``status``, to webhook ``webhook_id``, of alert ``alert_id``; None: any."""
    stmt = select(DeliveryRow)
    if status is not None:
        stmt = stmt.where(DeliveryRow.status == status)
    if webhook_id is not None:
        stmt = stmt.where(DeliveryRow.webhook_id == webhook_id)
    if alert_id is not None:
        stmt = stmt.where(DeliveryRow.alert_id == alert_id)
    return stmt


def get(session: Session, delivery_id: int) -> DeliveryRow:
    """The row of delivery ``delivery_id``; 404 on ``path.id`` when there is none."""
    return get_or_404(session, DeliveryRow, delivery_id, "delivery")


def redeliver(session: Session, delivery_id: int) -> DeliveryRow:
    """Make delivery ``delivery_id`` pending and due now with a fresh attempt budget (same idempotency key).

    Raises
    ------
    ApiError
        404 on ``path.id`` (:func:`get`); 409 on ``path.id`` when its webhook was deleted.
    """
    d = get(session, delivery_id)
    w = session.get(WebhookRow, d.webhook_id)
    if w is None or w.deleted_at_us is not None:
        raise ApiError(409, f"webhook {d.webhook_id} of delivery {delivery_id} was deleted", "path.id")
    d.status = "pending"
    d.attempts = 0
    d.next_attempt_at_us = now_us()
    d.lease_until_us = None
    session.commit()
    return d
