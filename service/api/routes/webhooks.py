"""Webhooks: ``/webhooks`` (subscribe a URL to a query; the signing secret is shown once), pause and
resume, a new URL, secret rotation with a grace period, bulk redelivery, deletion (the delivery log stays)."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from service.api.deps import AdminKey, ReadKey, SessionDep, SettingsDep
from service.schemas.alerts import (
    Redelivery,
    RedeliveryResult,
    SecretRotation,
    WebhookCreate,
    WebhookCreated,
    WebhookPublic,
    WebhookUpdate,
)
from service.schemas.common import ERRORS, Id, wire_ts
from service.webhooks import webhook

router = APIRouter(prefix="/webhooks", tags=["webhooks"], responses=ERRORS)  # type: ignore[arg-type]


@router.post("", status_code=201, summary="Subscribe a URL to a query's alerts")
def create_webhook(body: WebhookCreate, session: SessionDep, settings: SettingsDep, _: AdminKey) -> WebhookCreated:
    return webhook.created(webhook.create(session, settings, body.query_id, body.url), settings)


@router.get("", summary="List webhooks (deleted ones are not listed)")
def list_webhooks(
    session: SessionDep, _: ReadKey, query_id: Annotated[Id | None, Query()] = None
) -> list[WebhookPublic]:
    return [webhook.public(r) for r in session.scalars(webhook.selection(query_id))]


@router.get("/{id}", summary="Get a webhook")
def get_webhook(id: Id, session: SessionDep, _: ReadKey) -> WebhookPublic:
    return webhook.public(webhook.get(session, id))


@router.patch("/{id}", summary="Change the URL (pending deliveries go there, same keys; the circuit closes)")
def update_webhook(
    id: Id, body: WebhookUpdate, request: Request, session: SessionDep, settings: SettingsDep, _: AdminKey
) -> WebhookPublic:
    row = webhook.move(session, settings, id, body.url)
    request.app.state.dispatcher.wake()
    return webhook.public(row)


@router.post("/{id}/pause", summary="Hold deliveries (alerts keep being recorded for it)")
def pause_webhook(id: Id, session: SessionDep, _: AdminKey) -> WebhookPublic:
    return webhook.public(webhook.set_active(session, id, False))


@router.post("/{id}/resume", summary="Send held deliveries and new ones again")
def resume_webhook(id: Id, request: Request, session: SessionDep, _: AdminKey) -> WebhookPublic:
    row = webhook.set_active(session, id, True)
    request.app.state.dispatcher.wake()
    return webhook.public(row)


@router.post("/{id}/rotate-secret", summary="New signing secret (shown once); the old one also signs during the grace")
def rotate_secret(
    id: Id, session: SessionDep, settings: SettingsDep, _: AdminKey, body: SecretRotation | None = None
) -> WebhookCreated:
    grace_s = settings.webhook_rotation_grace_s if body is None or body.grace_s is None else body.grace_s
    return webhook.created(webhook.rotate_secret(session, id, grace_s), settings)


@router.post("/{id}/redeliver", summary="Send again, by state and detection time (same keys, fresh budgets)")
def redeliver(id: Id, body: Redelivery, request: Request, session: SessionDep, _: AdminKey) -> RedeliveryResult:
    row = webhook.get(session, id)
    lo, hi = wire_ts(body.from_, "body.from"), wire_ts(body.to, "body.to")
    n = webhook.redeliver(session, row, body.status, lo, hi)
    request.app.state.dispatcher.wake()
    return RedeliveryResult(redelivered=n)


@router.delete("/{id}", status_code=204, summary="Unsubscribe (pending deliveries are cancelled; the log stays)")
def delete_webhook(id: Id, session: SessionDep, _: AdminKey) -> Response:
    webhook.delete(session, id)
    return Response(status_code=204)
