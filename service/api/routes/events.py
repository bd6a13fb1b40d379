"""Ingest: ``POST /events`` (JSON array, one object, or NDJSON).

Per event: valid and on time -> accepted (durable in the archive when the answer comes),
else rejected with its index, field and reason; the others are still taken, unless
``atomic=true``. The answer is 200 when at least one event was accepted or the body held
none, 422 when every event was rejected (nothing changed), 400 for malformed JSON (with the
line and column), 415 for a Content-Type other than JSON or NDJSON, 413 for a body over the
limit (nothing changed either).
"""
from __future__ import annotations

import logging
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Query, Request, Response

from service.api.deps import IngestKey, RuntimeDep, SettingsDep
from service.core.errors import ApiError, clip, malformed_json
from service.live.events import BodyError, parse_body
from service.live.feeds import WorkersBusy
from service.schemas.alerts import EventIn, IngestResponse, QueryLate, Rejection
from service.schemas.common import ERRORS
from service.schemas.resources import QueryHeld

log = logging.getLogger(__name__)
router = APIRouter(tags=["events"], responses=ERRORS)  # type: ignore[arg-type]

_EVENTS_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {"type": "array", "items": EventIn.model_json_schema(ref_template="#/components/schemas/{model}")},
        EventIn.model_json_schema(ref_template="#/components/schemas/{model}"),
    ]
}
_INGEST_OR_ERROR: dict[str, Any] = {
    "anyOf": [{"$ref": "#/components/schemas/IngestResponse"}, {"$ref": "#/components/schemas/ErrorBody"}]
}
_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": _EVENTS_SCHEMA},
            "application/x-ndjson": {"schema": {"type": "string", "description": "one event object per line"}},
        },
    }
}


def _clipped(item: dict[str, Any]) -> dict[str, Any]:
    """A rejection with the request's values in its field and reason cut short (:func:`clip`)."""
    return {k: clip(v) if k in ("field", "reason") and isinstance(v, str) else v for k, v in item.items()}


@router.post(
    "/events",
    summary="Ingest events",
    openapi_extra=_BODY,
    responses={
        422: {
            "content": {"application/json": {"schema": _INGEST_OR_ERROR}},
            "description": "Every event was rejected (or one was, with atomic): an IngestResponse; or a parameter "
            "or the body's shape is invalid: an ErrorBody",
        },
        409: {
            "content": {"application/json": {"schema": _INGEST_OR_ERROR}},
            "description": "Every rejected event reused a producer id with different content, and nothing was taken",
        },
    },
)
async def post_events(
    request: Request,
    response: Response,
    runtime: RuntimeDep,
    settings: SettingsDep,
    _: IngestKey,
    atomic: Annotated[bool, Query(description="refuse the whole body when any event is rejected")] = False,
) -> IngestResponse:
    body = await request.body()
    try:
        items = parse_body(body, request.headers.get("content-type", "application/json"))
    except BodyError as e:
        if e.line is not None and e.column is not None:
            raise malformed_json(e.reason, e.line, e.column) from None
        raise ApiError(422, e.reason, "body") from None
    if len(items) > settings.max_events_per_request:
        raise ApiError(413, f"{len(items)} events; at most {settings.max_events_per_request} per request", "body")
    try:
        res = await anyio.to_thread.run_sync(lambda: runtime.ingest(items, atomic=atomic))
    except WorkersBusy as e:
        err = ApiError(503, f"{e}; nothing was taken", "body")
        err.headers = {"Retry-After": "1"}
        raise err from None
    except Exception as e:
        log.exception("ingest failed")
        err = ApiError(503, f"the events could not be made durable ({type(e).__name__}); nothing was taken", "body")
        err.headers = {"Retry-After": "1"}
        raise err from None
    if res.rejected and (atomic or not (res.accepted or res.duplicates)):
        response.status_code = 409 if res.conflicts == res.rejected else 422
    return IngestResponse(
        accepted=res.accepted,
        rejected=res.rejected,
        ids=res.ids,
        rejections=[Rejection(**_clipped(r)) for r in res.rejections],
        query_late=[QueryLate(**_clipped(q)) for q in res.query_late],
        query_errors=[QueryLate(**_clipped(q)) for q in res.query_errors],
        duplicates=res.duplicates,
        matches=res.matches,
        alerts=res.alerts,
        held=[QueryHeld(**h) for h in res.held],
    )
