"""API models of backfills (``/backfills``)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.schemas.common import BodyId, WireTs

BackfillState = Literal["queued", "running", "succeeded", "failed", "cancelled"]




class BackfillCreate(BaseModel):
    """Evaluate a registered query over the archived events of ``[from, to)``."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        populate_by_name=True,
        json_schema_extra={
            "examples": [
                {"query_id": 1, "from": "2014-08-01T00:00:00Z", "to": "2014-09-01T00:00:00Z", "deliver": False}
            ]
        },
    )

    query_id: BodyId
    from_: WireTs = Field(alias="from", description="Start (inclusive): ISO-8601 with offset, or epoch milliseconds")
    to: WireTs = Field(description="End (exclusive): ISO-8601 with offset, or epoch milliseconds")
    deliver: bool = Field(
        False,
        description="Record the matches as alerts of the query, delivered to its webhooks "
        "(a match already alerted, e.g. by live detection, is not alerted again)",
    )


class BackfillPublic(BaseModel):
    """A backfill and its progress."""

    id: int
    query_id: int
    query_version: int = Field(description="The query's version whose text the backfill runs")
    run_id: str = Field(description="Names the backfill's rows in the archive's Delta results table")
    state: BackfillState
    from_: str = Field(serialization_alias="from")
    to: str
    deliver: bool
    percent: float = Field(description="Spark tasks done, percent (100 when succeeded)")
    events_scanned: int = Field(description="Archived events read so far (the look-back and look-ahead included)")
    matches: int | None = Field(None, description="Matches found (when succeeded)")
    alerts: int | None = Field(None, description="New alerts recorded (when succeeded with deliver)")
    versions: dict[str, int] | None = Field(None, description="Pinned Delta snapshot version per event type")
    error: str | None = Field(None, description="Why it failed")
    created_at: str
    started_at: str | None = None
    finished_at: str | None = None


class BackfillPage(BaseModel):
    items: list[BackfillPublic]
    next_cursor: str | None = None


class BackfillMatch(BaseModel):
    """One match of a backfill (the object ``lace match`` writes)."""

    query: str | None
    events: dict[str, list[int]] = Field(description="variable -> event ids")
    start: int = Field(description="int microseconds UTC")
    end: int = Field(description="int microseconds UTC")
    fields: dict[str, Any]


class BackfillResults(BaseModel):
    items: list[BackfillMatch]
    total: int
    next_offset: int | None = None
