"""API models of ingest results, alerts, webhooks and deliveries."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from service.schemas.common import BodyId, WireTs, json_int_type
from service.schemas.resources import QueryHeld

RedeliverState = Literal["dead", "delivered", "pending"]
URL_PATTERN = r"^[Hh][Tt][Tt][Pp][Ss]?://[^\x00-\x20\x7f/?#@\\]+(?:[/?][^\x00-\x20\x7f#]*)?$"
"""An absolute http(s) URL with a host, no credentials, spaces, control characters or #fragment."""
Url = Annotated[str, StringConstraints(min_length=1, max_length=2048, pattern=URL_PATTERN)]


class EventIn(BaseModel):
    """One event (documentation of the ``POST /events`` body; attributes may also be top-level keys)."""

    model_config = ConfigDict(extra="allow")

    type: str
    ts: str | int | float = Field(description="ISO-8601 with offset, or epoch milliseconds")
    ts_end: str | int | float | None = Field(
        None, description="Events of an interval type only (issue 15): the end, after ts, same forms as ts"
    )
    id: int | None = Field(None, description="int64; assigned at ingest when absent")
    attrs: dict[str, Any] | None = None


class Rejection(BaseModel):
    index: int = Field(description="0-based position of the event in the body")
    line: int | None = Field(None, description="NDJSON line")
    field: str
    reason: str


class QueryLate(BaseModel):
    index: int
    query: str
    reason: str


class IngestResponse(BaseModel):
    """Counts, the ids of the accepted events (in body order) and why each rejected event was."""

    accepted: int
    rejected: int
    ids: list[int]
    rejections: list[Rejection]
    query_late: list[QueryLate] = []
    query_errors: list[QueryLate] = Field(
        [], description="queries a plug-in failed on for this event: the query is marked failed, the event is taken"
    )
    duplicates: list[int] = Field(
        [], description="producer ids already ingested with the same content: acknowledged again, not taken twice"
    )
    matches: int
    alerts: int
    held: list[QueryHeld] = Field(
        [],
        description="The queries reading this request's event types that hold events or matches back until their "
        "watermark passes (their type's allowed lateness, a trailing negation): how many, and which event times",
    )


INT64 = json_int_type(-(1 << 63), (1 << 63) - 1)


class MatchIn(BaseModel):
    """One match as ``lace match`` and ``lace stream`` write it (a line of their JSONL output: ``Match.to_json()``),
    imported by ``POST /queries/{id}/results``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    query: str | None = Field(description="The statement's NAME (null for a statement without one)")
    events: dict[str, list[INT64]] = Field(description="variable -> event ids")  # type: ignore[valid-type]
    start: INT64 = Field(description="ts of the first event, int microseconds UTC")  # type: ignore[valid-type]
    end: INT64 = Field(description="ts (or ts_end) of the last event, int microseconds UTC")  # type: ignore[valid-type]
    fields: dict[str, Any] = Field(description="RETURN fields by alias")


class ResultsImported(BaseModel):
    """What ``POST /queries/{id}/results`` recorded."""

    received: int = Field(description="Matches in the body")
    alerts: int = Field(description="New alerts recorded (each delivered to the query's webhooks)")
    duplicates: int = Field(
        description="Matches already alerted (by this service or an earlier import) or repeated in the body: "
        "not alerted again"
    )


class AlertPublic(BaseModel):
    """An alert: a match of a query (``GET /alerts``); a webhook delivery sends the same fields (``WebhookAlert``)."""

    id: int
    query_id: int
    query_version: int | None = Field(None, description="the version of the query that found it (PUT makes a new one)")
    events: dict[str, list[int]] = Field(description="variable -> event ids")
    start: str
    end: str
    fields: dict[str, Any] = Field(description="RETURN fields (timestamps as int microseconds)")
    detected_at: str


class AlertQueryRef(BaseModel):
    """Deprecated (issue 47): the query of a webhook alert as it was sent before; use ``query_id``,
    ``query_name`` and ``query_version``."""

    id: int
    name: str
    version: int | None


WEBHOOK_ALERT_EXAMPLE: dict[str, Any] = {
    "id": 17,
    "query_id": 3,
    "query_version": 1,
    "events": {"a": [101], "b": [102]},
    "start": "2024-01-10T05:00:00.000000+00:00",
    "end": "2024-01-10T05:01:00.000000+00:00",
    "fields": {"symbol": "AIG", "low": 50.0},
    "detected_at": "2024-01-10T05:01:00.012345+00:00",
    "query_name": "drop",
    "alert_id": 17,
    "query": {"id": 3, "name": "drop", "version": 1},
}


class WebhookAlert(AlertPublic):
    """The JSON body of a webhook delivery: one alert, with the fields (same names, same values) of its item in
    ``GET /alerts``, and its query's name. Every attempt of a delivery sends the same body. ``alert_id`` and
    ``query`` are the names sent before issue 47, kept for receivers that read them: deprecated, to be removed in
    a later version (read ``id``, ``query_id``, ``query_name`` and ``query_version``)."""

    model_config = ConfigDict(json_schema_extra={"examples": [WEBHOOK_ALERT_EXAMPLE]})

    query_name: str = Field(description="The query's name (`GET /queries/{query_id}`)")
    alert_id: int = Field(deprecated=True, description="Deprecated: the same as `id`")
    query: AlertQueryRef = Field(
        deprecated=True, description="Deprecated: `{id, name, version}`, the same as `query_id`, `query_name` and "
        "`query_version`"
    )


class AlertPage(BaseModel):
    items: list[AlertPublic]
    next_cursor: str | None = Field(None, description="pass as `cursor` for the next page; null on the last")


class WebhookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    query_id: BodyId
    url: Url = Field(description="http(s) URL that receives one POST per alert", examples=["https://example.com/hook"])


class WebhookUpdate(BaseModel):
    """A new URL: pending deliveries go there (same keys); the circuit closes."""

    model_config = ConfigDict(extra="forbid", strict=True)

    url: Url = Field(description="http(s) URL that receives one POST per alert", examples=["https://example.com/hook"])


class SecretRotation(BaseModel):
    """Rotate the signing secret; the old one also signs for ``grace_s`` seconds (default from the settings)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    grace_s: json_int_type(0, 30 * 86_400) | None = Field(  # type: ignore[valid-type]
        None, description="Seconds the old secret keeps signing (a second `v1`); 0 drops it at once"
    )


class Redelivery(BaseModel):
    """Which deliveries of a webhook to send again (same idempotency keys, fresh attempt budgets)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    status: Annotated[list[RedeliverState], Field(min_length=1, max_length=3)] = Field(
        default_factory=lambda: list[RedeliverState](["dead"]),
        description="States to redeliver (default: dead letters)",
    )
    from_: WireTs | None = Field(
        None, alias="from", description="Alerts detected at or after (ISO-8601 with offset, or epoch ms)"
    )
    to: WireTs | None = Field(None, description="Alerts detected before (ISO-8601 with offset, or epoch ms)")


class RedeliveryResult(BaseModel):
    redelivered: int = Field(description="Deliveries made pending again")


class Circuit(BaseModel):
    """The endpoint's circuit breaker: ``open`` holds deliveries until a probe gets an answer."""

    state: Literal["closed", "open", "probing"]
    failures: int = Field(description="Consecutive endpoint failures (no answer, 5xx, 408, 429)")
    opened_at: str | None
    next_probe_at: str | None


class WebhookPublic(BaseModel):
    id: int
    query_id: int
    url: str
    active: bool = Field(description="false while paused (deliveries are recorded and held)")
    created_at: str
    previous_secret_expires_at: str | None = Field(
        None, description="Until then deliveries are also signed with the secret before the last rotation"
    )
    circuit: Circuit


class WebhookCreated(WebhookPublic):
    """Carries the signing secret: shown once."""

    secret: str


class DeliveryAttemptPublic(BaseModel):
    attempt: int
    at: str
    outcome: Literal["delivered", "failed", "held", "dead"] = Field(
        description="held: failed while the endpoint's circuit is open (not counted towards dead-lettering)"
    )
    status_code: int | None
    error: str | None
    duration_ms: float


class DeliveryPublic(BaseModel):
    id: int
    alert_id: int
    webhook_id: int
    idempotency_key: str
    status: Literal["pending", "delivered", "dead", "cancelled"] = Field(
        description="cancelled: its webhook was deleted before it was delivered"
    )
    attempts: int
    next_attempt_at: str | None
    last_status_code: int | None
    last_error: str | None
    created_at: str
    delivered_at: str | None


class DeliveryDetail(DeliveryPublic):
    log: list[DeliveryAttemptPublic]


class DeliveryPage(BaseModel):
    items: list[DeliveryPublic]
    next_cursor: str | None = None
