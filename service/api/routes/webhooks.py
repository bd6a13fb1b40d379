"""Webhooks: ``/webhooks`` (subscribe a URL to a query; the signing secret is shown once), pause and
resume, a new URL, secret rotation with a grace period, bulk redelivery, deletion (the delivery log stays)."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response

from service.api.deps import AdminKey, ReadKey, SessionDep, SettingsDep
from service.schemas.alerts import (
    Redelivery,
    RedeliveryResult,
    SecretRotation,
    WebhookAlert,
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


# ---------------------------------------------------------------- what the service sends (OpenAPI `webhooks`)

outgoing = APIRouter()
"""The request every webhook receives (documentation only: FastAPI lists it under the OpenAPI 3.1 ``webhooks``)."""

VERIFY = """Your endpoint receives one such `POST` per alert and webhook. Check `X-Lace-Signature` before
trusting the body: `t=<unix seconds>,v1=<hex>[,v1=<hex>]`, where each `hex` is HMAC-SHA256(secret,
`"<t>." + body`) over the raw body bytes, with the `secret` that `POST /webhooks` (or
`POST /webhooks/{id}/rotate-secret`) answered. During a rotation's grace period there is a second `v1`
(the old secret's): accept the request if any `v1` matches; refuse a `t` more than a few minutes from your clock.

```python
import hashlib, hmac, time
def verify(secret: str, body: bytes, header: str, tolerance_s: int = 300) -> bool:
    parts = [p.split("=", 1) for p in header.split(",")]
    t = next(v for k, v in parts if k == "t")
    mac = hmac.new(secret.encode(), t.encode() + b"." + body, hashlib.sha256).hexdigest()
    fresh = abs(time.time() - int(t)) <= tolerance_s
    return fresh and any(k == "v1" and hmac.compare_digest(mac, v) for k, v in parts)
```

Answer 2xx once the alert is yours; anything else, or no answer in time, is retried with the same body and
`Idempotency-Key` (deduplicate on it: delivery is at least once)."""


@outgoing.post(
    "alert",
    operation_id="alert",
    summary="An alert, POSTed to each webhook of its query",
    description=VERIFY,
    responses={
        200: {"description": "Any 2xx: delivered"},
        "default": {"description": "Anything else (or no answer): retried with back-off, then dead-lettered"},
    },
)
def alert_delivery(
    body: WebhookAlert,
    idempotency_key: Annotated[
        str,
        Header(alias="Idempotency-Key", description="`lace-<UUIDv7>`: the same on every retry and redelivery of "
               "this delivery (one alert to one webhook), never reused"),
    ],
    x_lace_signature: Annotated[
        str,
        Header(alias="X-Lace-Signature", description="`t=<unix seconds>,v1=<hex HMAC-SHA256(secret, \"<t>.\" + "
               "body)>`; a second `v1` during a secret rotation's grace period"),
    ],
    x_lace_delivery: Annotated[
        int, Header(alias="X-Lace-Delivery", description="The delivery's id (`GET /deliveries/{id}`)")
    ],
    x_lace_attempt: Annotated[
        int, Header(alias="X-Lace-Attempt", description="1 for the first attempt, then 2, 3, ...")
    ],
) -> None:
    """Documentation only: the service sends this request, it does not serve it."""
