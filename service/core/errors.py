"""One error shape for every 4xx: ``{"detail": [{"field": ..., "reason": ..., ...}]}``.

``field`` is a dotted path into the request (``body.url``, ``query.since``,
``events[3].attrs.price``); ``reason`` is one sentence. Extra keys carry what a client
needs to fix the input (``line``/``column`` for LQL and malformed JSON, ``index`` for events).

Values from the request are never echoed back whole: every run of more than
:data:`MAX_ECHO` characters without a space in a ``field`` or ``reason`` is cut (:func:`clip`).
Malformed JSON is a 400 with ``field: body`` and the line and column, on every route.
A 405 names in ``Allow`` every method the path supports.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_ECHO = 64
"""Longest run of non-space characters echoed back in an error (a value from the request, cut beyond)."""
MAX_REASON = 1024
"""Longest ``reason`` or ``field`` in an error, in characters, after the runs are cut."""
_LONG_RUN = re.compile(rf"\S{{{MAX_ECHO + 1},}}")


def clip(text: str) -> str:
    """``text`` with every run of more than :data:`MAX_ECHO` non-space characters cut to its start,
    ``…`` and the run's length, and the whole capped at :data:`MAX_REASON` characters.

    >>> clip("unknown event type " + "S" * 100)
    'unknown event type SSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSS… (100 characters)'
    """

    def cut(m: re.Match[str]) -> str:
        run = m.group(0)
        return f"{run[:40]}… ({len(run)} characters)"

    out = _LONG_RUN.sub(cut, text)
    return out if len(out) <= MAX_REASON else out[:MAX_REASON] + "…"


def clip_errors(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The error objects with their string values clipped (:func:`clip`)."""
    return [{k: clip(v) if isinstance(v, str) else v for k, v in e.items()} for e in errors]


def line_column(doc: str | bytes, pos: int) -> tuple[int, int]:
    """1-based line and column of character offset ``pos`` in ``doc``.

    >>> line_column("ab" + chr(10) + "cd", 4)
    (2, 2)
    """
    text = doc.decode("utf-8", "replace") if isinstance(doc, bytes) else doc
    pos = max(0, min(pos, len(text)))
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def malformed_json(reason: str, line: int, column: int) -> ApiError:
    """The one answer to malformed JSON, on every route: 400 on ``body`` with the 1-based line and column."""
    return ApiError(400, f"malformed JSON: {reason} (line {line}, column {column})", "body", line=line, column=column)


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


_METHODS = ("DELETE", "GET", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app serves at the request's path (for ``Allow`` on a 405)."""
    routes = request.app.router.routes
    return [
        method
        for method in _METHODS
        if any(route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes)
    ]


def install_handlers(app: FastAPI) -> None:
    """Register the handlers that give every error the shape above."""

    def _answer(exc: ApiError) -> JSONResponse:
        return JSONResponse({"detail": clip_errors(exc.errors)}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return _answer(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = []
        for err in exc.errors():
            loc = list(err.get("loc", ()))
            if err.get("type") == "json_invalid" and len(loc) == 2 and isinstance(loc[1], int):
                ctx = err.get("ctx") or {}
                line, column = line_column(exc.body or b"", loc[1])
                return _answer(malformed_json(str(ctx.get("error", "invalid")), line, column))
            errors.append(
                {"field": _loc(loc) or None, "reason": str(err.get("msg", "invalid")), "type": err.get("type")}
            )
        return JSONResponse({"detail": clip_errors(errors)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(allowed_methods(request))
        body = {"detail": clip_errors([{"field": None, "reason": str(exc.detail)}])}
        return JSONResponse(body, status_code=exc.status_code, headers=headers or None)

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
