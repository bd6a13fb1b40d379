"""One error shape for every 4xx: ``{"detail": [{"field": ..., "reason": ..., ...}]}``.

``field`` is a dotted path into the request (``body.url``, ``query.since``,
``events[3].attrs.price``); ``reason`` is one sentence. Extra keys carry what a client
needs to fix the input (``line``/``column`` for LQL, ``index`` for events).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)
T = TypeVar("T")


class ApiError(Exception):
    """A client error with its HTTP status.

    Parameters
    ----------
    status : int
        4xx status code.
    reason : str
        What is wrong, in one sentence.
    field : str | None
        Where, as a dotted path.
    extra : Any
        More keys of the error object (``line``, ``column``, ``index``...).
    """

    def __init__(self, status: int, reason: str, field: str | None = None, **extra: Any) -> None:
        super().__init__(reason)
        self.status = status
        self.errors: list[dict[str, Any]] = [{"field": field, "reason": reason, **extra}]
        self.headers: dict[str, str] | None = None


def get_or_404(session: Session, model: type[T], ident: Any, what: str, field: str = "path.id") -> T:
    """The row of ``model`` with primary key ``ident``, else a 404 ``no <what> with id <ident>`` on ``field``."""
    row = session.get(model, ident)
    if row is None:
        raise ApiError(404, f"no {what} with id {ident}", field)
    return row


def _loc(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def install_handlers(app: FastAPI) -> None:
    """Register the handlers that give every error the shape above."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"detail": exc.errors}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = []
        for err in exc.errors():
            loc = list(err.get("loc", ()))
            errors.append(
                {"field": _loc(loc) or None, "reason": str(err.get("msg", "invalid")), "type": err.get("type")}
            )
        return JSONResponse({"detail": errors}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            {"detail": [{"field": None, "reason": str(exc.detail)}]}, status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(IntegrityError)
    async def _integrity(_: Request, exc: IntegrityError) -> JSONResponse:
        log.info("integrity error: %s", exc.orig)
        return JSONResponse(
            {"detail": [{"field": None, "reason": "conflicts with an existing record"}]}, status_code=409
        )

    @app.exception_handler(DataError)
    async def _data(_: Request, exc: DataError) -> JSONResponse:
        log.info("data error: %s", exc.orig)
        return JSONResponse(
            {"detail": [{"field": None, "reason": "a value is out of range for the database"}]}, status_code=422
        )
