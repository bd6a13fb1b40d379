"""``GET /healthz`` (no key) and ``GET /metrics`` (Prometheus text; scope ``read``)."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

from service.api.deps import ReadKey
from service.schemas.common import AUTH_ERRORS

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="Liveness and database check (no API key)")
def healthz(request: Request) -> JSONResponse:
    state = request.app.state
    body: dict[str, Any] = {"status": "ok", "archive": "on" if state.runtime.archive is not None else "off"}
    try:
        with state.sessions() as session:
            session.execute(text("SELECT 1"))
        body["database"] = "ok"
    except Exception as e:  # report, do not raise: this is the health check
        body.update(status="degraded", database=f"error: {type(e).__name__}")
    body["live_queries"] = len(state.runtime.queries)
    return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        200: {
            "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
            "description": "Prometheus text format",
        },
        **AUTH_ERRORS,  # type: ignore[dict-item]
    },
)
def metrics(request: Request, _: ReadKey) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
