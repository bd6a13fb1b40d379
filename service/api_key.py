"""The API key of the service, converted in one place (one model per concept).

A key is stored as an :class:`~service.db.models.ApiKeyRow`: its name, scopes, the hash of its token and the
token's first 12 characters (``prefix``); the token itself is shown once, when it is made (:func:`create_key`).
:func:`public` gives the REST shape :class:`~service.schemas.resources.ApiKeyPublic` (times ISO-8601).
"""
from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.errors import get_or_404
from service.core.security import hash_api_key, new_api_key
from service.db.models import ApiKeyRow
from service.db.session import now_us
from service.schemas.common import iso
from service.schemas.resources import ApiKeyPublic


def public(row: ApiKeyRow) -> ApiKeyPublic:
    """The REST shape of ``row`` (never the key itself): name, scopes, prefix, when made and revoked."""
    return ApiKeyPublic(
        id=row.id,
        name=row.name,
        scopes=list(row.scopes),
        prefix=row.prefix,
        created_at=iso(row.created_at_us),
        revoked_at=iso(row.revoked_at_us) if row.revoked_at_us is not None else None,
    )


def create_key(session: Session, *, name: str, scopes: list[str], token: str | None = None) -> tuple[ApiKeyRow, str]:
    """Store a new key (or ``token`` when given) and return its row and the token."""
    token = token or new_api_key()
    row = ApiKeyRow(
        name=name,
        scopes=sorted(set(scopes)),
        key_hash=hash_api_key(token),
        prefix=token[:12],
        created_at_us=now_us(),
    )
    session.add(row)
    session.commit()
    return row, token


def listing(session: Session) -> list[ApiKeyRow]:
    """Every key, revoked ones too, in id order."""
    return list(session.scalars(select(ApiKeyRow).order_by(ApiKeyRow.id)))


def revoke(session: Session, key_id: int) -> None:
    """Revoke key ``key_id`` now (a revoked key stays revoked as it was); 404 on ``path.id`` when there is none."""
    row = get_or_404(session, ApiKeyRow, key_id, "API key")
    if row.revoked_at_us is None:
        row.revoked_at_us = now_us()
        session.commit()
