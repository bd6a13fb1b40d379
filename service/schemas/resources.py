"""API models of event types, queries and API keys."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from engine.event_type import RESERVED
from engine.options import Algorithm, PmPolicy
from service.core.security import Scope
from service.schemas.common import Id, Name, WireTs, json_int_type

AttrType = Literal["string", "int", "float", "bool", "timestamp"]
AttrValue = str | int | float | bool | None
"""A default value: checked against the attribute's type when the event type is registered or changed."""
MAX_LATENESS_MS = 30 * 86_400_000
NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_]*$"


def _no_reserved(attributes: dict[str, str]) -> dict[str, str]:
    taken = sorted(set(attributes) & RESERVED)
    if taken:
        raise ValueError(f"attribute names {', '.join(sorted(RESERVED))} are reserved: rename {', '.join(taken)}")
    return attributes


Attributes = Annotated[
    dict[Name, AttrType],
    Field(max_length=512),
    AfterValidator(_no_reserved),
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": 512,
            "propertyNames": {"pattern": NAME_PATTERN, "maxLength": 64, "not": {"enum": sorted(RESERVED)}},
            "additionalProperties": {"type": "string", "enum": ["string", "int", "float", "bool", "timestamp"]},
        }
    ),
]
"""Attribute name -> type; names as :data:`Name`, not ``id``, ``ts``, ``type``, ``date``, ``ingested_at``."""
Lateness = json_int_type(0, MAX_LATENESS_MS)
QueryName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$", max_length=128)]
QueryText = Annotated[str, StringConstraints(min_length=1, max_length=65_536, pattern=r"^[^\x00]*$")]


class _In(BaseModel):
    """A request body: no unknown keys, no coercion (``"5"`` or ``true`` is not an integer)."""

    model_config = ConfigDict(extra="forbid", strict=True)


# ---------------------------------------------------------------- event types


class EventTypeCreate(_In):
    """A stream: attribute types, the archive's key attribute, allowed lateness (ms)."""

    name: Name
    attributes: Attributes = {}
    partition_key: Name | None = Field(None, description="One of the attributes")
    allowed_lateness_ms: Lateness = Field(  # type: ignore[valid-type]
        0,
        description="How far behind the type's newest event an event may still arrive, ms: each query holds the "
        "newest events (and the matches they complete) back this long, until its watermark passes them",
    )
    defaults: Annotated[dict[Name, AttrValue], Field(max_length=512)] = Field(
        {},
        description="Optional attributes and the value an event without one (or with null) gets; null: it stays "
        "missing. Attributes not listed are required.",
    )
    interval: bool = Field(
        False,
        description="An interval type (issue 15): each event carries ts_end after ts; queries see v.ts_end, "
        "v.duration and Allen's relations; its watermark runs on ts_end.",
    )
    max_duration_ms: Annotated[int, Field(gt=0)] | None = Field(
        None, description="Interval types only: the longest event accepted (ts_end - ts), ms; bounds query state."
    )

    @field_validator("max_duration_ms")
    @classmethod
    def _duration_needs_interval(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and not info.data.get("interval"):
            raise ValueError("max_duration_ms applies to interval types: set \"interval\": true")
        return value

    @field_validator("partition_key")
    @classmethod
    def _key_is_an_attribute(cls, key: str | None, info: ValidationInfo) -> str | None:
        attributes = info.data.get("attributes")
        if key is not None and attributes is not None and key not in attributes:
            raise ValueError(f"partition key {key!r} is not one of the attributes")
        return key

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "Stock",
                    "attributes": {"symbol": "string", "price": "float"},
                    "partition_key": "symbol",
                    "allowed_lateness_ms": 5000,
                }
            ]
        },
    )


class EventTypeUpdate(_In):
    """Schema evolution: attributes to add (optional: producers need not send them), defaults to set (a
    required attribute may become optional, not the reverse), attributes to remove (none a query uses), a
    new allowed lateness (a smaller one at any time; a larger one with no active query using the type)."""

    attributes: Attributes | None = None
    defaults: Annotated[dict[Name, AttrValue], Field(max_length=512)] | None = Field(
        None, description="Defaults of added or existing attributes (null: missing when absent)."
    )
    remove: Annotated[list[Name], Field(max_length=512)] | None = Field(
        None, description="Attributes to drop from the schema (the archive keeps their past values)."
    )
    allowed_lateness_ms: Lateness | None = None  # type: ignore[valid-type]


class EventTypePublic(BaseModel):
    name: str
    attributes: dict[str, str]
    partition_key: str | None
    defaults: dict[str, Any] = Field({}, description="Optional attributes -> default (null: missing)")
    allowed_lateness_ms: int = Field(description="How far behind its newest event an event may arrive, ms (0 when "
                                     "registered without it)")
    interval: bool = False
    max_duration_ms: int | None = None
    derived: bool = Field(
        False,
        description="Made by EMIT INTO: its events come from statements only (POST /events refuses them, also "
        "while no statement emits it); false: an ingested type, which EMIT INTO cannot name.",
    )
    ended_at: str | None = Field(
        None,
        description="When its stream was ended (POST /event-types/{name}/end), ISO-8601; null: open. An ended "
        "type takes no more events.",
    )
    end_ts: str | None = Field(None, description="Its newest event time when it ended (null: none, or open)")
    created_at: str
    updated_at: str


class EventTypeEnd(BaseModel):
    """What ``POST /event-types/{name}/end`` closed (docs/rest.md, docs/operations.md *Ending a stream*)."""

    name: str
    end_ts: str | None = Field(description="The type's newest event time, ISO-8601 (null: it had sent nothing)")
    ended_at: str = Field(description="When the stream was ended (wall clock), ISO-8601")
    already_ended: bool = Field(description="The stream had ended before this call (nothing changed)")
    queries: list[str] = Field(
        description="Running statements whose every type has now ended: their windows, SLLAA subwindows and "
        "pending live instances are closed"
    )
    results: int = Field(description="Results the end completed in the rule graph's statements, recorded as alerts")
    live_archived_pending: dict[str, int] = Field(
        description="Per live-and-archived query closed: completed live instances that were waiting in its open "
        "subwindow (or live window) when the stream ended; the end sends them, and the live instances it completes, "
        "to the archive; their results are recorded when the requests answer (watch its stats' caught_up)"
    )


# ---------------------------------------------------------------- queries


class ArchiveSlice(BaseModel):
    """``[from, to)`` of the archive: the candidate plans run over its events (``EXPLAIN ... USING ARCHIVE``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    from_: WireTs = Field(alias="from", description="Start (inclusive): ISO-8601 with offset, or epoch milliseconds")
    to: WireTs = Field(description="End (exclusive): ISO-8601 with offset, or epoch milliseconds")


class QueryOptions(_In):
    """How a query runs: live-and-archived algorithm and ``T_L``, partial-match budget and policy."""

    algorithm: Annotated[Algorithm, Field(strict=False)] | None = Field(
        None,
        description="Live-and-archived queries only: sllaa (default), ollaa, llaa or alaa (001 section 4).",
    )
    tolerance: Annotated[str, StringConstraints(min_length=1, max_length=40)] | None = Field(
        None,
        description="Live-and-archived queries only: SLLAA's tolerated delay T_L, e.g. '10 min' (default "
        "LACE_LA_TOLERANCE_S, 1 min); OLLAA's archive refresh period.",
    )
    pm_capacity: json_int_type(1, 1 << 40) | None = Field(  # type: ignore[valid-type]
        None,
        description="Partial matches kept in memory; beyond it they spill to the database (default LACE_PM_CAPACITY).",
    )
    pm_policy: Annotated[PmPolicy, Field(strict=False)] | None = Field(
        None, description="stpm or tpm: which partial matches spill first."
    )
    plan_trial: ArchiveSlice | None = Field(
        None,
        description="Live pattern queries only (EXPLAIN ... USING ARCHIVE at registration): before the query sees "
        "a live event, run its candidate plans over the archived events of [from, to) on Spark and start it as "
        "the one with the least measured CPU time (kept as plan_choice; the request waits for the trial). "
        "PUT without it drops an earlier choice.",
    )


class QueryCreate(QueryOptions):
    """An LQL query (docs/lql.md), live-only or live-and-archived; ``name`` defaults to the query's NAME."""

    text: QueryText
    name: QueryName | None = None
    state: Literal["active", "paused"] = "active"

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "text": "NAME drop\nPATTERN SEQ(Stock a, Stock b)\nWHERE b.price < a.price * 0.9\n"
                    "PARTITION BY symbol\nWITHIN 10 min",
                }
            ]
        },
    )


class QueryUpdate(QueryOptions):
    """New LQL text (and options; unset ones keep their values): the query restarts empty."""

    text: QueryText


class PlanSwitch(_In):
    """Another plan for a running pattern query (``POST /queries/{id}/plan``): give ``plan`` or ``plan_trial``,
    exactly one of them (not null)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"minProperties": 1, "maxProperties": 1})

    plan: Literal["auto", "nfa", "tree"] | SkipJsonSchema[None] = Field(
        None,
        description="auto (the cost model's choice), nfa, or tree (skip_till_any_match without a trailing "
        "negation); what a PLAN clause in the text would say.",
    )
    plan_trial: ArchiveSlice | SkipJsonSchema[None] = Field(
        None,
        description="Run the candidate plans over the archived events of [from, to) on Spark and switch to the one "
        "with the least measured CPU time (the request waits for the trial).",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> PlanSwitch:
        given = [name for name in ("plan", "plan_trial") if name in self.model_fields_set]
        if len(given) != 1 or getattr(self, given[0]) is None:
            raise ValueError("give plan or plan_trial, exactly one of them (not null)")
        return self


class RuleGraphNode(BaseModel):
    """One statement in the rule graph."""

    id: int
    name: str
    kind: str
    state: str
    reads: list[str]
    emits: str | None


class RuleGraphPublic(BaseModel):
    """Which statement reads and emits which event type (``GET /queries/graph``)."""

    statements: list[RuleGraphNode]
    derived_types: dict[str, list[str]] = Field(description="Derived event type -> the statements emitting it.")
    edges: list[tuple[str, str]] = Field(
        description="(emitting statement, reading statement) pairs: the flow of derived events."
    )


class Delays(BaseModel):
    """Result delay percentiles of a live-and-archived query: result emitted minus live instance completed."""

    n: int
    event_p50_ms: float
    event_p99_ms: float
    wall_p50_ms: float
    wall_p99_ms: float


class WorkerPlace(BaseModel):
    """The worker process of the pool hosting a live-and-archived query (docs/architecture.md section 3)."""

    index: int = Field(description="The worker's index in the pool (0 .. LACE_WORKERS - 1).")
    pid: int | None = Field(None, description="Its process id now (null: not started).")
    alive: bool
    restarts: int = Field(description="Times the worker was started again after it died (since the service started).")
    queries: int = Field(description="Live-and-archived queries it hosts.")


class LiveArchivedStats(BaseModel):
    """What a live-and-archived query's algorithm has done since it last started (001 section 4)."""

    algorithm: str
    tolerance_ms: int | float = Field(description="T_L, ms (a float only for a tolerance in us)")
    live_instances: int
    results: int
    archive_requests: int
    archived_events_scanned: int
    archived_instances: int
    pending_live_instances: int = Field(description="Completed live instances waiting in an open subwindow.")
    open_subwindows: int = Field(description="Subwindows being filled or answered (archive requests in flight).")
    requests_in_flight: int
    backlog_events: int = Field(description="Events ingested but not yet offered to the query's live matcher.")
    backlog_s: float = Field(
        0.0, description="Wall seconds since the oldest of the backlog's events was handed to the query: how far "
        "behind ingest it is (0 without a backlog)."
    )
    requests_waiting: int = Field(
        0, description="Archive requests of this query waiting for a lookup worker (part of requests_in_flight)."
    )
    oldest_pending_start: str | None = Field(
        None, description="The earliest start (event time, ISO-8601) of a live instance waiting for the archive (in "
        "the open subwindow or a request in flight); null: none."
    )
    oldest_pending_wait_s: float = Field(
        0.0, description="Wall seconds that oldest pending live instance has waited (since it completed, or since "
        "its request was made)."
    )
    caught_up: bool = Field(
        True, description="No backlog and no archive request in flight: every result due so far is recorded (live "
        "instances in the open subwindow wait for T_L, the stream's idleness or its end)."
    )
    subwindows_closed_idle: int | None = Field(
        None, description="SLLAA: subwindows closed because every stream the query reads was idle "
        "(LACE_IDLE_TIMEOUT_S) or ended."
    )
    requests_from_memory: int | None = Field(
        None, description="Archive requests answered without reading: every part of their access ranges was read by "
        "an earlier request of the same key (known ranges: a one-event archived pattern over the live pattern's one "
        "ingested type); null: the query reads whole ranges."
    )
    delay: Delays
    worker: WorkerPlace | None = Field(
        None, description="The pool's worker process hosting it; null when it runs on a thread of the service "
        "(LACE_LA_PROCESS=false)."
    )
    ollaa_mode: str | None = Field(None, description="OLLAA: live (live drives) or archive (archive drives).")
    sel_live: float | None = Field(None, description="OLLAA: Sel_PL at the last decision.")
    sel_archived: float | None = Field(None, description="OLLAA: Sel_PA at the last decision.")
    errors: int = Field(0, description="Archive requests that failed and were retried.")
    close_to_commit_p50_ms: float = Field(
        0.0, description="From the POST /events that closed a subwindow (or completed an LLAA instance) to its "
        "results committed as alerts, p50 over the last 10,000 requests."
    )
    close_to_commit_p99_ms: float = 0.0


class Held(BaseModel):
    """What of a query waits for its watermark: the newest events are held back by their type's allowed lateness
    (``allowed_lateness_ms``) and matched, in (ts, id) order, once the watermark passes them; a match with a trailing
    negation waits for its window to end. The watermark moves when a later event arrives (``allowed_lateness_ms``
    after the held ones) or when the stream ends (``POST /event-types/{name}/end``); idleness does not move it."""

    events: int = Field(description="Events taken but not matched yet (the matches they complete come later)")
    matches: int = Field(description="Complete matches waiting for their trailing negation's deadline")
    earliest: str | None = Field(description="The earliest event time among them, ISO-8601 (null: nothing held)")
    latest: str | None = Field(description="The latest event time among them, ISO-8601 (null: nothing held)")
    watermark: str | None = Field(
        description="The query's watermark now, ISO-8601: what is at or before it is matched (null: no event yet, "
        "or every stream it reads ended)"
    )


class QueryHeld(Held):
    """:class:`Held` of one query (``POST /events`` answers those of the queries reading its events)."""

    query: str = Field(description="The query's name")


class QueryStats(BaseModel):
    """Live counters of an active query's matcher (since it last started)."""

    events: int
    late: int
    matches: int
    partial_matches: int
    keys: int
    pm_capacity: int | None = None
    pm_policy: str | None = None
    partial_matches_spilled: int = 0
    spills: int = 0
    reloads: int = 0
    misses: int = 0
    cpu_s: float = Field(0.0, description="CPU seconds spent matching since the query started (its live side)")
    held: Held | None = Field(
        None, description="What waits for the watermark (null: a FILTER rule or a live-and-archived query)"
    )
    live_archived: LiveArchivedStats | None = None
    failed: str | None = Field(
        None, description="why the query stopped matching: a plug-in it uses misbehaved (update the query to restart)"
    )


class QueryPublic(BaseModel):
    id: int
    name: str
    text: str
    state: Literal["active", "paused"]
    kind: Literal["live", "live_archived", "filter", "aggregate", "interval"] = Field(
        description="live: a pattern query; live_archived: LIVE ... ARCHIVED ...; filter: FILTER rule; "
        "aggregate: AGGREGATE ... WINDOW continuous query; interval: INTERVAL derivation (layered rules, 003)."
    )
    types: list[str] = Field(description="The event types it reads.")
    emits: str | None = Field(None, description="The derived event type of its EMIT INTO (None: it ends in alerts).")
    window_ms: int | float | None = Field(description="WITHIN, ms (a float only for a window in us); null: none")
    algorithm: str | None = None
    tolerance_ms: int | float | None = None
    pm_capacity: int | None = None
    pm_policy: str | None = None
    version: int
    active_since: str
    created_at: str
    updated_at: str
    stats: QueryStats | None = None
    plan_choice: dict[str, Any] | None = Field(
        None,
        description="After plan_trial (or POST /queries/{id}/plan): the chosen candidate (chosen, plan_kind, "
        "order) and the slice's pass probabilities (estimates) and rates it was compiled with.",
    )
    warm: dict[str, int] | None = Field(
        None,
        description="After ?state=warm (or a plan switch) of the running version: history events fed from the "
        "archive, results they completed, and alerts recorded for them (emit_history=true; a plan switch records "
        "none). Null when this version started without warming, while it is paused, and after a service restart "
        "(the restart replay rebuilds its state).",
    )
    totals: dict[str, int | float] = Field(
        {},
        description="Counters since the query was created or last updated (integers: events, late, matches; "
        "cpu_s, float seconds; "
        "live_instances and archive_requests for live-and-archived queries), kept across pauses and restarts "
        "(recorded every LACE_LA_CHECKPOINT_S: a crash may lose the last second's counts, never count twice).",
    )


# ---------------------------------------------------------------- API keys


class ApiKeyCreate(_In):
    name: Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[^\x00]*$")]
    scopes: Annotated[list[Scope], Field(min_length=1, max_length=3)]


class ApiKeyPublic(BaseModel):
    id: int
    name: str
    scopes: list[str]
    prefix: str
    created_at: str
    revoked_at: str | None


class ApiKeyCreated(ApiKeyPublic):
    """The only answer that carries the key itself."""

    key: str


__all__ = [
    "ApiKeyCreate",
    "ApiKeyCreated",
    "ApiKeyPublic",
    "AttrType",
    "EventTypeCreate",
    "EventTypePublic",
    "EventTypeUpdate",
    "Id",
    "Delays",
    "LiveArchivedStats",
    "QueryCreate",
    "QueryOptions",
    "QueryPublic",
    "QueryStats",
    "QueryUpdate",
]
