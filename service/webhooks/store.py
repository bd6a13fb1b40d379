"""Database side of the dispatcher: claim due deliveries, record attempt outcomes.

A claimed delivery gets a lease (``lease_until_us``) so the next poll skips it while its
request is in flight; a crash leaves the lease to expire (or :func:`release_leases` at start),
and the delivery is sent again with the same idempotency key.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from service.db.models import AlertRow, DeliveryAttemptRow, DeliveryRow, QueryRow, WebhookRow
from service.db.session import transaction


@dataclass(slots=True)
class Job:
    """One delivery to attempt."""

    delivery_id: int
    idempotency_key: str
    attempt: int
    url: str
    webhook_id: int
    salt: str
    payload: dict[str, Any]
    alert_created_at_us: int


@dataclass(slots=True)
class Outcome:
    """What one attempt gave: ``status_code`` (None: no response) and ``error``."""

    job: Job
    ok: bool
    status_code: int | None
    error: str | None
    at_us: int
    duration_ms: float


def release_leases(sessions: sessionmaker[Session]) -> None:
    """Forget the leases of a previous process (one dispatcher per database)."""
    with transaction(sessions) as s:
        s.execute(update(DeliveryRow).where(DeliveryRow.lease_until_us.is_not(None)).values(lease_until_us=None))


def claim_due(sessions: sessionmaker[Session], *, now_us: int, limit: int, lease_us: int) -> list[Job]:
    """Lease up to ``limit`` pending deliveries whose next attempt is due."""
    with transaction(sessions) as s:
        rows = s.execute(
            select(DeliveryRow, AlertRow, WebhookRow, QueryRow.name)
            .join(AlertRow, AlertRow.id == DeliveryRow.alert_id)
            .join(WebhookRow, WebhookRow.id == DeliveryRow.webhook_id)
            .join(QueryRow, QueryRow.id == AlertRow.query_id)
            .where(
                DeliveryRow.status == "pending",
                DeliveryRow.next_attempt_at_us <= now_us,
                or_(DeliveryRow.lease_until_us.is_(None), DeliveryRow.lease_until_us < now_us),
            )
            .order_by(DeliveryRow.next_attempt_at_us, DeliveryRow.id)
            .limit(limit)
        ).all()
        if not rows:
            return []
        ids = [d.id for d, *_ in rows]
        s.execute(update(DeliveryRow).where(DeliveryRow.id.in_(ids)).values(lease_until_us=now_us + lease_us))
        return [
            Job(
                delivery_id=d.id,
                idempotency_key=d.idempotency_key,
                attempt=d.attempts + 1,
                url=w.url,
                webhook_id=w.id,
                salt=w.salt,
                payload=alert_payload(a, qname),
                alert_created_at_us=a.created_at_us,
            )
            for d, a, w, qname in rows
        ]


def alert_payload(a: AlertRow, query_name: str) -> dict[str, Any]:
    """The JSON body of a delivery (the same for every attempt)."""
    from service.schemas.common import iso

    return {
        "alert_id": a.id,
        "query": {"id": a.query_id, "name": query_name},
        "events": a.events,
        "start": iso(a.start_us),
        "end": iso(a.end_us),
        "fields": a.fields,
        "detected_at": iso(a.created_at_us),
    }


def record_outcomes(
    sessions: sessionmaker[Session], outcomes: Sequence[Outcome], *, max_attempts: int, next_at: dict[int, int]
) -> tuple[int, int, int]:
    """Write the attempts; return ``(delivered, failed, dead)``.

    ``next_at``: delivery id -> when to retry a failed attempt (int microseconds).
    """
    delivered = failed = dead = 0
    with transaction(sessions) as s:
        for o in outcomes:
            d = s.get(DeliveryRow, o.job.delivery_id)
            if d is None:  # its query or webhook was deleted meanwhile
                continue
            d.attempts = o.job.attempt
            d.lease_until_us = None
            d.last_status_code = o.status_code
            d.last_error = (o.error or "")[:500] or None
            if o.ok:
                d.status, d.delivered_at_us, outcome = "delivered", o.at_us, "delivered"
                delivered += 1
            elif o.job.attempt >= max_attempts:
                d.status, outcome = "dead", "dead"
                dead += 1
            else:
                d.next_attempt_at_us, outcome = next_at[d.id], "failed"
                failed += 1
            s.add(
                DeliveryAttemptRow(
                    delivery_id=d.id,
                    attempt=o.job.attempt,
                    at_us=o.at_us,
                    outcome=outcome,
                    status_code=o.status_code,
                    error=d.last_error,
                    duration_ms=o.duration_ms,
                )
            )
    return delivered, failed, dead
