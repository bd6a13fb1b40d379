"""API keys: ``/keys`` (create: the key is shown once; list; revoke). Scope ``admin``."""
from __future__ import annotations

from fastapi import APIRouter, Response

from service import api_key
from service.api.deps import AdminKey, SessionDep
from service.schemas.common import ERRORS, Id
from service.schemas.resources import ApiKeyCreate, ApiKeyCreated, ApiKeyPublic

router = APIRouter(prefix="/keys", tags=["api keys"], responses=ERRORS)  # type: ignore[arg-type]


@router.post("", status_code=201, summary="Create an API key (shown once)")
def create_api_key(body: ApiKeyCreate, session: SessionDep, _: AdminKey) -> ApiKeyCreated:
    row, token = api_key.create_key(session, name=body.name, scopes=list(body.scopes))
    return ApiKeyCreated(**api_key.public(row).model_dump(), key=token)


@router.get("", summary="List API keys (never the keys themselves)")
def list_api_keys(session: SessionDep, _: AdminKey) -> list[ApiKeyPublic]:
    return [api_key.public(r) for r in api_key.listing(session)]


@router.delete("/{id}", status_code=204, summary="Revoke an API key")
def revoke_api_key(id: Id, session: SessionDep, _: AdminKey) -> Response:
    api_key.revoke(session, id)
    return Response(status_code=204)
