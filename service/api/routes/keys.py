"""API keys: ``/keys`` (create: the key is shown once; list; revoke). Scope ``admin``."""
from __future__ import annotations

from fastapi import APIRouter, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.api.deps import AdminKey, SessionDep
from service.core.errors import get_or_404
from service.core.security import hash_api_key, new_api_key
from service.db.models import ApiKeyRow
from service.db.session import now_us
from service.schemas.common import ERRORS, Id, iso
from service.schemas.resources import ApiKeyCreate, ApiKeyCreated, ApiKeyPublic

router = APIRouter(prefix="/keys", tags=["api keys"], responses=ERRORS)  # type: ignore[arg-type]


def public(row: ApiKeyRow) -> ApiKeyPublic:
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


@router.post("", status_code=201, summary="Create an API key (shown once)")
def create_api_key(body: ApiKeyCreate, session: SessionDep, _: AdminKey) -> ApiKeyCreated:
    row, token = create_key(session, name=body.name, scopes=list(body.scopes))
    return ApiKeyCreated(**public(row).model_dump(), key=token)


@router.get("", summary="List API keys (never the keys themselves)")
def list_api_keys(session: SessionDep, _: AdminKey) -> list[ApiKeyPublic]:
    return [public(r) for r in session.scalars(select(ApiKeyRow).order_by(ApiKeyRow.id))]


@router.delete("/{id}", status_code=204, summary="Revoke an API key")
def revoke_api_key(id: Id, session: SessionDep, _: AdminKey) -> Response:
    row = get_or_404(session, ApiKeyRow, id, "API key")
    if row.revoked_at_us is None:
        row.revoked_at_us = now_us()
        session.commit()
    return Response(status_code=204)
