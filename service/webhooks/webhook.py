"""The webhook (a URL subscribed to a query's alerts) of the service, converted in one place (one model per
concept).

A webhook is stored as a :class:`~service.db.models.WebhookRow` (times int microseconds UTC): its URL, the
salts its signing secrets are made from (:func:`service.core.security.webhook_secret`), whether it is active,
its circuit breaker (:mod:`service.webhooks.store`). :func:`public` gives the REST shape
:class:`~service.schemas.alerts.WebhookPublic` (times ISO-8601), :func:`created` the one that shows the secret
once. The operations of ``/webhooks`` are here too; their errors are :class:`~service.core.errors.ApiError`
with their HTTP status, naming the request field.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yarl
from sqlalchemy import Select, select, update
from sqlalchemy.orm import Session

from service.core.config import Settings
from service.core.errors import ApiError, get_or_404
from service.core.security import new_salt, webhook_secret
from service.db.models import DeliveryRow, QueryRow, WebhookRow
from service.db.session import now_us
from service.schemas.alerts import Circuit, WebhookCreated, WebhookPublic
from service.schemas.common import iso
from service.webhooks.targets import TargetRefused, check_target


def _opt_iso(us: int | None) -> str | None:
    return iso(us) if us is not None else None


def public(row: WebhookRow) -> WebhookPublic:
    """The REST shape of ``row`` (never its secret): URL, active, when the previous secret stops signing (during
    a rotation's grace period), and the circuit (state, failures, when it opened and when it next probes)."""
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


def created(row: WebhookRow, settings: Settings) -> WebhookCreated:
    """:func:`public` with the current signing secret (shown once: when made and when rotated)."""
    return WebhookCreated(**public(row).model_dump(), secret=webhook_secret(settings.signing_key(), row.id, row.salt))


def check_url(url: str, settings: Settings | None = None) -> str:
    """``url`` when it is an absolute http(s) URL with a host, no credentials, no fragment, whose host is an
    allowed target (:func:`service.webhooks.targets.check_target`; not checked without ``settings``). A host name
    that does not resolve now is accepted: every delivery attempt checks the addresses it connects to
    (:class:`service.webhooks.targets.CheckedResolver`).

    Raises
    ------
    ApiError
        422 on ``body.url`` otherwise.
    """
    reason = None
    host = ""
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        reason = "must not contain spaces or control characters"
    else:
        try:
            parsed = yarl.URL(url)  # the parser of the client that sends (aiohttp)
            parsed.port  # noqa: B018 (parsed lazily: a bad port raises here)
        except (ValueError, TypeError) as e:
            reason = f"is not a URL: {e}"
        else:
            host = parsed.raw_host or ""
            if parsed.scheme not in ("http", "https"):
                reason = "must be an http:// or https:// URL"
            elif not host:
                reason = "needs a host"
            elif parsed.user is not None or parsed.password is not None:
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


def create(session: Session, settings: Settings, query_id: int, url: str) -> WebhookRow:
    """Subscribe ``url`` to query ``query_id``'s alerts (active, circuit closed, a new salt).

    Raises
    ------
    ApiError
        422 on ``body.url`` (:func:`check_url`); 404 on ``body.query_id`` when there is no such query.
    """
    url = check_url(url, settings)
    get_or_404(session, QueryRow, query_id, "query", "body.query_id")
    row = WebhookRow(query_id=query_id, url=url, salt=new_salt(), active=True, created_at_us=now_us(), circuit="closed")
    session.add(row)
    session.commit()
    return row


def selection(query_id: int | None) -> Select[Any]:
    """The webhooks not deleted (of query ``query_id``; None: of any), in id order."""
    stmt = select(WebhookRow).where(WebhookRow.deleted_at_us.is_(None)).order_by(WebhookRow.id)
    if query_id is not None:
        stmt = stmt.where(WebhookRow.query_id == query_id)
    return stmt


def get(session: Session, webhook_id: int) -> WebhookRow:
    """The row of webhook ``webhook_id``; 404 on ``path.id`` when there is none or it was deleted."""
    row = get_or_404(session, WebhookRow, webhook_id, "webhook")
    if row.deleted_at_us is not None:
        raise ApiError(404, f"webhook {webhook_id} was deleted", "path.id")
    return row


def _release(session: Session, row: WebhookRow) -> None:
    """Close the circuit; pending deliveries are due now with fresh attempt budgets."""
    session.execute(
        update(DeliveryRow)
        .where(DeliveryRow.webhook_id == row.id, DeliveryRow.status == "pending")
        .values(next_attempt_at_us=now_us(), attempts=0, lease_until_us=None)
    )
    row.circuit, row.failures, row.opened_at_us, row.probe_at_us = "closed", 0, None, None


def move(session: Session, settings: Settings, webhook_id: int, url: str) -> WebhookRow:
    """Send webhook ``webhook_id``'s deliveries to ``url`` from now on: its circuit closes and its pending
    deliveries are due now (same idempotency keys, fresh attempt budgets).

    Raises
    ------
    ApiError
        404 on ``path.id`` (:func:`get`); 422 on ``body.url`` (:func:`check_url`).
    """
    row = get(session, webhook_id)
    row.url = check_url(url, settings)
    _release(session, row)
    session.commit()
    return row


def set_active(session: Session, webhook_id: int, active: bool) -> WebhookRow:
    """Pause (``active`` False: deliveries are held, alerts still recorded) or resume webhook ``webhook_id``;
    404 on ``path.id`` (:func:`get`)."""
    row = get(session, webhook_id)
    row.active = active
    session.commit()
    return row


def rotate_secret(session: Session, webhook_id: int, grace_s: int) -> WebhookRow:
    """A new salt (so a new signing secret) for webhook ``webhook_id``; the old one also signs for ``grace_s``
    seconds (0: not at all). 404 on ``path.id`` (:func:`get`)."""
    row = get(session, webhook_id)
    now = now_us()
    row.previous_salt, row.previous_salt_until_us = (row.salt, now + grace_s * 1_000_000) if grace_s else (None, None)
    row.salt = new_salt()
    session.commit()
    return row


def redeliver(
    session: Session, row: WebhookRow, statuses: Sequence[str], from_us: int | None, to_us: int | None
) -> int:
    """Make ``row``'s deliveries in ``statuses`` made in ``[from_us, to_us)`` (int us UTC; None: unbounded)
    pending and due now, with fresh attempt budgets and the same idempotency keys; returns how many."""
    stmt = update(DeliveryRow).where(DeliveryRow.webhook_id == row.id, DeliveryRow.status.in_(statuses))
    if from_us is not None:
        stmt = stmt.where(DeliveryRow.created_at_us >= from_us)
    if to_us is not None:
        stmt = stmt.where(DeliveryRow.created_at_us < to_us)
    res = session.execute(
        stmt.values(status="pending", attempts=0, next_attempt_at_us=now_us(), lease_until_us=None)
    )
    session.commit()
    return max(int(getattr(res, "rowcount", 0) or 0), 0)


def delete(session: Session, webhook_id: int) -> None:
    """Unsubscribe webhook ``webhook_id``: marked deleted and inactive, its pending deliveries cancelled (its
    delivery log stays); 404 on ``path.id`` (:func:`get`)."""
    row = get(session, webhook_id)
    row.deleted_at_us, row.active = now_us(), False
    session.execute(
        update(DeliveryRow)
        .where(DeliveryRow.webhook_id == row.id, DeliveryRow.status == "pending")
        .values(status="cancelled", lease_until_us=None)
    )
    session.commit()
