"""Typed dependencies: database session, live runtime, settings, and API-key scopes.

Every route but ``/healthz`` takes one of ``AdminKey``, ``IngestKey`` or ``ReadKey``. A key
holds one or more scopes and a route accepts exactly its own: an ingest-only key cannot
read alerts, a read-only key cannot change a query, an admin-only key cannot post events.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.config import Settings
from service.core.errors import ApiError
from service.core.security import Scope, hash_api_key
from service.db.models import ApiKeyRow
from service.live.runtime import LiveRuntime

bearer = HTTPBearer(
    auto_error=False, description="An API key from `lace keys create`: `Authorization: Bearer lace_...`"
)


def get_db(request: Request) -> Iterator[Session]:
    with request.app.state.sessions() as session:
        yield session


def get_runtime(request: Request) -> LiveRuntime:
    runtime: LiveRuntime = request.app.state.runtime
    return runtime


def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SessionDep = Annotated[Session, Depends(get_db)]
RuntimeDep = Annotated[LiveRuntime, Depends(get_runtime)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]


@dataclass(frozen=True, slots=True)
class Principal:
    """The API key a request came with."""

    key_id: int
    scopes: frozenset[str]


def _unauthorized(reason: str) -> ApiError:
    err = ApiError(401, reason, "header.Authorization")
    err.headers = {"WWW-Authenticate": "Bearer"}
    return err


def authenticate(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Principal:
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
        raise _unauthorized("an API key is required: Authorization: Bearer <key>")
    digest = hash_api_key(creds.credentials)
    with request.app.state.sessions() as session:
        row = session.execute(select(ApiKeyRow).where(ApiKeyRow.key_hash == digest)).scalar_one_or_none()
    if row is None or row.revoked_at_us is not None:
        raise _unauthorized("unknown or revoked API key")
    return Principal(row.id, frozenset(row.scopes))


def require(scope: Scope) -> Callable[[Principal], Principal]:
    """A dependency that admits keys holding ``scope``."""

    def check(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
        if scope not in principal.scopes:
            raise ApiError(403, f"this route needs a key with scope '{scope}'", "header.Authorization")
        return principal

    check.__name__ = f"require_{scope}"
    return check


AdminKey = Annotated[Principal, Depends(require("admin"))]
IngestKey = Annotated[Principal, Depends(require("ingest"))]
ReadKey = Annotated[Principal, Depends(require("read"))]
