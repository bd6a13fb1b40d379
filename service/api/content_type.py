"""Content types as a pure ASGI middleware: 415 for a request body that is not JSON.

Every body the API reads is JSON (``application/json``, or a ``+json`` type such as
``application/merge-patch+json``); ``POST /events`` and ``POST /queries/{id}/results`` also read NDJSON
(``application/x-ndjson``, ``application/ndjson``, ``application/jsonl``, ``application/json-lines``). A request that
carries a body of any other declared type (``text/plain``, XML, a form...) is refused with 415
before the body is read, and nothing changes. A body without ``Content-Type`` is read as JSON.
"""
from __future__ import annotations

import re
from typing import Any

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from service.core.errors import clip

NDJSON_TYPES = frozenset({"application/x-ndjson", "application/ndjson", "application/jsonl", "application/json-lines"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_NDJSON_PATHS = re.compile(r"/queries/[0-9]+/results")
"""Paths besides the ingest path that also read NDJSON (a query's results import)."""


def media_type(header: str) -> str:
    """The bare media type of a Content-Type header, lower case (``application/json; charset=utf-8`` ->
    ``application/json``).

    >>> media_type(" Application/JSON ; charset=utf-8")
    'application/json'
    """
    return header.split(";", 1)[0].strip().lower()


def is_json(media: str) -> bool:
    """``application/json`` or any ``application/...+json`` type."""
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class ContentTypeMiddleware:
    def __init__(self, app: ASGIApp, *, ingest_path: str = "/events") -> None:
        self.app = app
        self.ingest_path = ingest_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        content_type, has_body = None, False
        for name, value in scope.get("headers", ()):
            if name == b"content-type":
                content_type = value.decode("latin-1")
            elif name == b"content-length":
                has_body = has_body or value.strip() not in (b"0", b"")
            elif name == b"transfer-encoding":
                has_body = has_body or b"chunked" in value.lower()
        if has_body and content_type is not None:
            media = media_type(content_type)
            path = scope["path"]
            ndjson = path == self.ingest_path or _NDJSON_PATHS.fullmatch(path) is not None
            if not (is_json(media) or (ndjson and media in NDJSON_TYPES)):
                await _unsupported(send, media, ndjson)
                return
        await self.app(scope, receive, send)


async def _unsupported(send: Send, media: str, ndjson: bool) -> None:
    accepted = "application/json or application/x-ndjson" if ndjson else "application/json"
    reason = clip(f"unsupported Content-Type {media!r}: send {accepted}")
    body: dict[str, Any] = {"detail": [{"field": "header.Content-Type", "reason": reason}]}
    data = orjson.dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": 415,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})
