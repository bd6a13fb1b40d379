"""API models of event types, queries and API keys."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from service.core.security import Scope
from service.schemas.common import Id, Name

AttrType = Literal["string", "int", "float", "bool", "timestamp"]
MAX_LATENESS_MS = 30 * 86_400_000
QueryName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$", max_length=128)]
QueryText = Annotated[str, StringConstraints(min_length=1, max_length=65_536, pattern=r"^[^\x00]*$")]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- event types


class EventTypeCreate(_In):
    """A stream: attribute types, the archive's key attribute, allowed lateness (ms)."""

    name: Name
    attributes: Annotated[dict[Name, AttrType], Field(max_length=512)] = {}
    partition_key: Name | None = None
    allowed_lateness_ms: Annotated[int, Field(ge=0, le=MAX_LATENESS_MS)] = 0

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
    """New attributes to add (existing ones keep their type) and/or a new allowed lateness."""

    attributes: Annotated[dict[Name, AttrType], Field(max_length=512)] | None = None
    allowed_lateness_ms: Annotated[int, Field(ge=0, le=MAX_LATENESS_MS)] | None = None


class EventTypePublic(BaseModel):
    name: str
    attributes: dict[str, str]
    partition_key: str | None
    allowed_lateness_ms: float
    created_at: str
    updated_at: str


# ---------------------------------------------------------------- queries


class QueryCreate(_In):
    """An LQL live query (docs/lql.md); ``name`` defaults to the query's NAME."""

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


class QueryUpdate(_In):
    """New LQL text: the query restarts (its partial matches are dropped)."""

    text: QueryText


class QueryStats(BaseModel):
    """Live counters of an active query's matcher (since it last started)."""

    events: int
    late: int
    matches: int
    partial_matches: int
    keys: int


class QueryPublic(BaseModel):
    id: int
    name: str
    text: str
    state: Literal["active", "paused"]
    types: list[str]
    window_ms: float | None
    version: int
    active_since: str
    created_at: str
    updated_at: str
    stats: QueryStats | None = None


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
    "QueryCreate",
    "QueryPublic",
    "QueryStats",
    "QueryUpdate",
]
