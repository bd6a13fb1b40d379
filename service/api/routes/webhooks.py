"""Webhooks: ``/webhooks`` (subscribe a URL to a query; the signing secret is shown once), pause and
resume, a new URL, secret rotation with a grace period, bulk redelivery, deletion (the delivery log stays)."""
from __future__ import annotations

from typing import Annotated

import httpx
from fastapi import APIRouter, Query, Request, Response
from sqlalchemy import select, update

from service.api.deps import AdminKey, ReadKey, SessionDep, SettingsDep
from service.core.config import Settings
from service.core.errors import ApiError, get_or_404
from service.core.security import new_salt, webhook_secret
from service.db.models import DeliveryRow, QueryRow, WebhookRow
from service.db.session import now_us
from service.schemas.alerts import (
    Circuit,
    Redelivery,
    RedeliveryResult,
    SecretRotation,
    WebhookCreate,
    WebhookCreated,
    WebhookPublic,
    WebhookUpdate,
)
from service.schemas.common import ERRORS, Id, iso, parse_wire_ts
from service.webhooks.targets import TargetRefused, check_target

router = APIRouter(prefix="/webhooks", tags=["webhooks"], responses=ERRORS)  # type: ignore[arg-type]


def _opt_iso(us: int | None) -> str | None:
    return iso(us) if us is not None else None


def public(row: WebhookRow) -> WebhookPublic:
    grace = row.previous_salt_until_us if row.previous_salt and (row.previous_salt_until_us or 0) > now_us() else None
    circuit = row.circuit or "closed"
    return WebhookPublic(
        id=row.id,
        query_id=row.query_id,
        url=row.url,
        active=row.active,
        created_at=iso(row.created_at_us),
        previous_secret_expires_at=_opt_iso(grace),
        circuit=Circuit(
            state=circuit,  # type: ignore[arg-type]
            failures=row.failures or 0,
            opened_at=_opt_iso(row.opened_at_us) if circuit != "closed" else None,
            next_probe_at=_opt_iso(row.probe_at_us) if circuit == "open" else None,
        ),
    )


def check_url(url: str, settings: Settings | None = None) -> str:
    """An absolute http(s) URL with a host, no credentials, no fragment, whose host is an allowed
    target (:mod:`service.webhooks.targets`); else a 422 on ``body.url``."""
    reason = None
    host = ""
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        reason = "must not contain spaces or control characters"
    else:
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, ValueError, TypeError) as e:
            reason = f"is not a URL: {e}"
        else:
            host = parsed.host
            if parsed.scheme not in ("http", "https"):
                reason = "must be an http:// or https:// URL"
            elif not parsed.host:
                reason = "needs a host"
            elif parsed.userinfo:
                reason = "must not carry credentials (user:password@)"
            elif parsed.fragment:
                reason = "must not have a #fragment"
    if reason is None and settings is not None:
        try:
            check_target(host, settings)
        except TargetRefused as e:
            reason = str(e)
    if reason is not None:
        raise ApiError(422, reason, "body.url")
    return url


@router.post("", status_code=201, summary="Subscribe a URL to a query's alerts")
def create_webhook(body: WebhookCreate, session: SessionDep, settings: SettingsDep, _: AdminKey) -> WebhookCreated:
    url = check_url(body.url, settings)
    get_or_404(session, QueryRow, body.query_id, "query", "body.query_id")
    row = WebhookRow(
        query_id=body.query_id, url=url, salt=new_salt(), active=True, created_at_us=now_us(), circuit="closed"
    )
    session.add(row)
    session.commit()
    secret = webhook_secret(settings.signing_key(), row.id, row.salt)
    return WebhookCreated(**public(row).model_dump(), secret=secret)


@router.get("", summary="List webhooks (deleted ones are not listed)")
def list_webhooks(
    session: SessionDep, _: ReadKey, query_id: Annotated[Id | None, Query()] = None
) -> list[WebhookPublic]:
    stmt = select(WebhookRow).where(WebhookRow.deleted_at_us.is_(None)).order_by(WebhookRow.id)
    if query_id is not None:
        stmt = stmt.where(WebhookRow.query_id == query_id)
    return [public(r) for r in session.scalars(stmt)]


def get_row(session: SessionDep, webhook_id: int) -> WebhookRow:
    row = get_or_404(session, WebhookRow, webhook_id, "webhook")
    if row.deleted_at_us is not None:
        raise ApiError(404, f"webhook {webhook_id} was deleted", "path.id")
    return row


def _release(session: SessionDep, row: WebhookRow) -> None:
    """Close the circuit; pending deliveries are due now with fresh attempt budgets."""
    session.execute(
        update(DeliveryRow)
        .where(DeliveryRow.webhook_id == row.id, DeliveryRow.status == "pending")
        .values(next_attempt_at_us=now_us(), attempts=0, lease_until_us=None)
    )
    row.circuit, row.failures, row.opened_at_us, row.probe_at_us = "closed", 0, None, None


@router.get("/{id}", summary="Get a webhook")
def get_webhook(id: Id, session: SessionDep, _: ReadKey) -> WebhookPublic:
    return public(get_row(session, id))


@router.patch("/{id}", summary="Change the URL (pending deliveries go there, same keys; the circuit closes)")
def update_webhook(
    id: Id, body: WebhookUpdate, request: Request, session: SessionDep, settings: SettingsDep, _: AdminKey
) -> WebhookPublic:
    row = get_row(session, id)
    row.url = check_url(body.url, settings)
    _release(session, row)
    session.commit()
    request.app.state.dispatcher.wake()
    return public(row)


@router.post("/{id}/pause", summary="Hold deliveries (alerts keep being recorded for it)")
def pause_webhook(id: Id, session: SessionDep, _: AdminKey) -> WebhookPublic:
    row = get_row(session, id)
    row.active = False
    session.commit()
    return public(row)


@router.post("/{id}/resume", summary="Send held deliveries and new ones again")
def resume_webhook(id: Id, request: Request, session: SessionDep, _: AdminKey) -> WebhookPublic:
    row = get_row(session, id)
    row.active = True
    session.commit()
    request.app.state.dispatcher.wake()
    return public(row)


@router.post("/{id}/rotate-secret", summary="New signing secret (shown once); the old one also signs during the grace")
def rotate_secret(
    id: Id, session: SessionDep, settings: SettingsDep, _: AdminKey, body: SecretRotation | None = None
) -> WebhookCreated:
    row = get_row(session, id)
    grace_s = settings.webhook_rotation_grace_s if body is None or body.grace_s is None else body.grace_s
    now = now_us()
    row.previous_salt, row.previous_salt_until_us = (row.salt, now + grace_s * 1_000_000) if grace_s else (None, None)
    row.salt = new_salt()
    session.commit()
    return WebhookCreated(**public(row).model_dump(), secret=webhook_secret(settings.signing_key(), row.id, row.salt))


def _wire_ts(value: str | int | None, field: str) -> int | None:
    if value is None:
        return None
    try:
        return parse_wire_ts(value)
    except ValueError as e:
        raise ApiError(422, str(e), field) from None


@router.post("/{id}/redeliver", summary="Send again, by state and detection time (same keys, fresh budgets)")
def redeliver(id: Id, body: Redelivery, request: Request, session: SessionDep, _: AdminKey) -> RedeliveryResult:
    row = get_row(session, id)
    lo, hi = _wire_ts(body.from_, "body.from"), _wire_ts(body.to, "body.to")
    stmt = update(DeliveryRow).where(DeliveryRow.webhook_id == row.id, DeliveryRow.status.in_(body.status))
    if lo is not None:
        stmt = stmt.where(DeliveryRow.created_at_us >= lo)
    if hi is not None:
        stmt = stmt.where(DeliveryRow.created_at_us < hi)
    res = session.execute(
        stmt.values(status="pending", attempts=0, next_attempt_at_us=now_us(), lease_until_us=None)
    )
    session.commit()
    request.app.state.dispatcher.wake()
    return RedeliveryResult(redelivered=max(int(getattr(res, "rowcount", 0) or 0), 0))


@router.delete("/{id}", status_code=204, summary="Unsubscribe (pending deliveries are cancelled; the log stays)")
def delete_webhook(id: Id, session: SessionDep, _: AdminKey) -> Response:
    row = get_row(session, id)
    row.deleted_at_us, row.active = now_us(), False
    session.execute(
        update(DeliveryRow)
        .where(DeliveryRow.webhook_id == row.id, DeliveryRow.status == "pending")
        .values(status="cancelled", lease_until_us=None)
    )
    session.commit()
    return Response(status_code=204)
