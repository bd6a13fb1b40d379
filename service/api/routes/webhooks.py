"""Webhooks: ``/webhooks`` (subscribe a URL to a query; the signing secret is shown once)."""
from __future__ import annotations

from typing import Annotated

import httpx
from fastapi import APIRouter, Query, Response
from sqlalchemy import select

from service.api.deps import AdminKey, ReadKey, SessionDep, SettingsDep
from service.core.errors import ApiError, get_or_404
from service.core.security import new_salt, webhook_secret
from service.db.models import QueryRow, WebhookRow
from service.db.session import now_us
from service.schemas.alerts import WebhookCreate, WebhookCreated, WebhookPublic
from service.schemas.common import ERRORS, Id, iso

router = APIRouter(prefix="/webhooks", tags=["webhooks"], responses=ERRORS)  # type: ignore[arg-type]


def public(row: WebhookRow) -> WebhookPublic:
    return WebhookPublic(
        id=row.id, query_id=row.query_id, url=row.url, active=row.active, created_at=iso(row.created_at_us)
    )


def check_url(url: str) -> str:
    """An absolute http(s) URL with a host, no credentials, no fragment; else a 422 on ``body.url``."""
    reason = None
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        reason = "must not contain spaces or control characters"
    else:
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, ValueError, TypeError) as e:
            reason = f"is not a URL: {e}"
        else:
            if parsed.scheme not in ("http", "https"):
                reason = "must be an http:// or https:// URL"
            elif not parsed.host:
                reason = "needs a host"
            elif parsed.userinfo:
                reason = "must not carry credentials (user:password@)"
            elif parsed.fragment:
                reason = "must not have a #fragment"
    if reason is not None:
        raise ApiError(422, reason, "body.url")
    return url


@router.post("", status_code=201, summary="Subscribe a URL to a query's alerts")
def create_webhook(body: WebhookCreate, session: SessionDep, settings: SettingsDep, _: AdminKey) -> WebhookCreated:
    url = check_url(body.url)
    get_or_404(session, QueryRow, body.query_id, "query", "body.query_id")
    row = WebhookRow(query_id=body.query_id, url=url, salt=new_salt(), active=True, created_at_us=now_us())
    session.add(row)
    session.commit()
    secret = webhook_secret(settings.signing_key(), row.id, row.salt)
    return WebhookCreated(**public(row).model_dump(), secret=secret)


@router.get("", summary="List webhooks")
def list_webhooks(
    session: SessionDep, _: ReadKey, query_id: Annotated[Id | None, Query()] = None
) -> list[WebhookPublic]:
    stmt = select(WebhookRow).order_by(WebhookRow.id)
    if query_id is not None:
        stmt = stmt.where(WebhookRow.query_id == query_id)
    return [public(r) for r in session.scalars(stmt)]


def get_row(session: SessionDep, webhook_id: int) -> WebhookRow:
    return get_or_404(session, WebhookRow, webhook_id, "webhook")


@router.get("/{id}", summary="Get a webhook")
def get_webhook(id: Id, session: SessionDep, _: ReadKey) -> WebhookPublic:
    return public(get_row(session, id))


@router.delete("/{id}", status_code=204, summary="Unsubscribe (deletes its pending deliveries and log)")
def delete_webhook(id: Id, session: SessionDep, _: AdminKey) -> Response:
    session.delete(get_row(session, id))
    session.commit()
    return Response(status_code=204)
