"""Body size limits as a pure ASGI middleware: 413 before the body is read past the limit.

``POST /events`` may carry ``max_body_bytes``; every other route ``max_admin_body_bytes``.
A ``Content-Length`` above the limit is refused at once; a chunked body is counted as it
streams and refused the moment it passes the limit.
"""
from __future__ import annotations

from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(HTTPException):
    """Raised from ``receive``: an HTTPException, so FastAPI's body parsing passes it through as a 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the body is larger than {limit} bytes")


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, *, ingest_bytes: int, other_bytes: int, ingest_path: str = "/events") -> None:
        self.app = app
        self.ingest_bytes = ingest_bytes
        self.other_bytes = other_bytes
        self.ingest_path = ingest_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.ingest_bytes if scope["path"] == self.ingest_path else self.other_bytes
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > limit:
                    await _too_large(send, limit)
                    return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return msg

        async def tracking_send(msg: Message) -> None:
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await _too_large(send, limit)


async def _too_large(send: Send, limit: int) -> None:
    body: dict[str, Any] = {"detail": [{"field": "body", "reason": f"the body is larger than {limit} bytes"}]}
    data = orjson.dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})
