"""Tables of the service database (SQLAlchemy 2 declarative, typed).

Every time is an int64 of microseconds since the Unix epoch, UTC (``*_us``), so SQLite and
PostgreSQL store and compare them alike. Deleting a query deletes its webhooks, alerts and
deliveries (``ON DELETE CASCADE``); deleting a webhook only marks it deleted (its log stays).
The partial-match store (docs/architecture.md section 1) will add its own tables in a later migration.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only autoincrements an INTEGER PRIMARY KEY; PostgreSQL gets BIGINT identities.
BigId = BigInteger().with_variant(Integer(), "sqlite")

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class EventTypeRow(Base):
    """A registered event type (stream): schema, archive key, allowed lateness."""

    __tablename__ = "event_types"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    attributes: Mapped[dict[str, str]] = mapped_column(JSON)
    partition_key: Mapped[str | None] = mapped_column(String(64))
    defaults: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """Optional attributes -> the value an event that lacks one gets (None: it stays missing)."""
    allowed_lateness_us: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at_us: Mapped[int] = mapped_column(BigInteger)
    updated_at_us: Mapped[int] = mapped_column(BigInteger)
    interval: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """An interval type (issue 15): events carry ts_end > ts (migration 0008)."""
    max_duration_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """An interval type's longest accepted event, microseconds (None: no bound)."""
    derived: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """Made by EMIT INTO (migration 0011): producers cannot post it, even with no statement emitting it now;
    False: registered with POST /event-types (ingested), EMIT INTO cannot name it."""
    ended_at_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """When (wall clock, us) its stream was ended by ``POST /event-types/{name}/end`` (migration 0014); None: open."""
    end_ts_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """Its newest event time (us) when it ended (None: open, or it had sent nothing)."""


class QueryRow(Base):
    """A registered LQL query; ``active_since_us`` is when its live matcher (re)started."""

    __tablename__ = "queries"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    text: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))  # active | paused
    types: Mapped[list[str]] = mapped_column(JSON)
    window_us: Mapped[int | None] = mapped_column(BigInteger)
    version: Mapped[int] = mapped_column(Integer, default=1)
    # live | live_archived | filter | aggregate | interval
    kind: Mapped[str] = mapped_column(String(16), default="live", server_default="live")
    emits: Mapped[str | None] = mapped_column(String(64))  # EMIT INTO: the derived event type
    algorithm: Mapped[str | None] = mapped_column(String(8))  # live-and-archived: sllaa | ollaa | llaa | alaa
    tolerance_us: Mapped[int | None] = mapped_column(BigInteger)  # SLLAA's T_L (None: the service default)
    pm_capacity: Mapped[int | None] = mapped_column(BigInteger)  # None: the service default (LACE_PM_CAPACITY)
    pm_policy: Mapped[str | None] = mapped_column(String(8))  # stpm | tpm (None: LACE_PM_POLICY)
    resume_seq: Mapped[int | None] = mapped_column(BigInteger)
    """Its checkpoint: the position in the durable ingest order from which a restart replays what rebuilds its
    state (migration 0012; None: not checkpointed since it started)."""
    checkpoint_seq: Mapped[int | None] = mapped_column(BigInteger)
    """The position its checkpoint was taken at: every result of the events before it was recorded then, and the
    restart replay does not alert them again (migration 0013; None: none, or a live-and-archived query)."""
    warmed: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """This version started with ``?state=warm`` and its warm start was committed: it counts as having received the
    events of its horizon ingested before ``active_since_us`` too (the restart replay feeds them to it; migration
    0015). False: it received only what came after ``active_since_us``."""
    counters: Mapped[dict[str, float] | None] = mapped_column(JSON)
    """Totals since the query was created or updated (events, matches, late, cpu_s, ...): kept across restarts."""
    plan_choice: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # a plan trial's winner (issue 16)
    active_since_us: Mapped[int] = mapped_column(BigInteger)
    created_at_us: Mapped[int] = mapped_column(BigInteger)
    updated_at_us: Mapped[int] = mapped_column(BigInteger)


class WebhookRow(Base):
    """A URL subscribed to one query's alerts; the signing secret is derived from ``salt``.

    ``active`` is false while paused (deliveries are recorded and held). ``previous_salt`` derives
    the secret before the last rotation, also signed with until ``previous_salt_until_us``.
    ``circuit`` is the endpoint's breaker: ``closed``, ``open`` (deliveries held, a probe due at
    ``probe_at_us``) or ``probing`` (one delivery in flight); ``failures`` counts consecutive endpoint
    failures. A deleted webhook keeps its row (``deleted_at_us``) so its delivery log stays.
    """

    __tablename__ = "webhooks"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    query_id: Mapped[int] = mapped_column(ForeignKey("queries.id", ondelete="CASCADE"), index=True)
    url: Mapped[str] = mapped_column(String(2048))
    salt: Mapped[str] = mapped_column(String(64))
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at_us: Mapped[int] = mapped_column(BigInteger)
    previous_salt: Mapped[str | None] = mapped_column(String(64))
    previous_salt_until_us: Mapped[int | None] = mapped_column(BigInteger)
    circuit: Mapped[str] = mapped_column(String(16), default="closed", server_default="closed")
    failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    opened_at_us: Mapped[int | None] = mapped_column(BigInteger)
    probe_at_us: Mapped[int | None] = mapped_column(BigInteger)
    deleted_at_us: Mapped[int | None] = mapped_column(BigInteger)


class AlertRow(Base):
    """One match of a query, recorded once per (query, event ids) (``dedup_key``)."""

    __tablename__ = "alerts"
    __table_args__ = (
        UniqueConstraint("query_id", "dedup_key", name="uq_alerts_query_dedup"),
        Index("ix_alerts_query_id_id", "query_id", "id"),
        Index("ix_alerts_end_us", "end_us"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    query_id: Mapped[int] = mapped_column(ForeignKey("queries.id", ondelete="CASCADE"))
    dedup_key: Mapped[str] = mapped_column(String(64))
    events: Mapped[dict[str, list[int]]] = mapped_column(JSON)
    fields: Mapped[dict[str, Any]] = mapped_column(JSON)
    start_us: Mapped[int] = mapped_column(BigInteger)
    end_us: Mapped[int] = mapped_column(BigInteger)
    created_at_us: Mapped[int] = mapped_column(BigInteger)
    query_version: Mapped[int | None] = mapped_column(Integer)
    """The version of the query that found it (``PUT /queries/{id}`` makes a new one)."""


class DeliveryRow(Base):
    """The outbox: one row per (alert, webhook), written in the alert's transaction.

    ``idempotency_key`` is ``lace-`` + a UUIDv7 made when the row is: never reused, whatever ids the
    database hands out again. ``status``: pending | delivered | dead | cancelled (webhook deleted).
    """

    __tablename__ = "deliveries"
    __table_args__ = (
        UniqueConstraint("alert_id", "webhook_id", name="uq_deliveries_alert_webhook"),
        Index("ix_deliveries_due", "status", "next_attempt_at_us"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    alert_id: Mapped[int] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"), index=True)
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"), index=True)
    idempotency_key: Mapped[str] = mapped_column(String(80), unique=True)
    status: Mapped[str] = mapped_column(String(16))  # pending | delivered | dead | cancelled
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at_us: Mapped[int] = mapped_column(BigInteger)
    lease_until_us: Mapped[int | None] = mapped_column(BigInteger)
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(String(500))
    created_at_us: Mapped[int] = mapped_column(BigInteger)
    delivered_at_us: Mapped[int | None] = mapped_column(BigInteger)


class DeliveryAttemptRow(Base):
    """The delivery log: one row per HTTP attempt."""

    __tablename__ = "delivery_attempts"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    delivery_id: Mapped[int] = mapped_column(ForeignKey("deliveries.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    at_us: Mapped[int] = mapped_column(BigInteger)
    outcome: Mapped[str] = mapped_column(String(16))  # delivered | failed | dead
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(String(500))
    duration_ms: Mapped[float] = mapped_column(Float)


class ApiKeyRow(Base):
    """An API key: only the SHA-256 of the token is stored."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128))
    scopes: Mapped[list[str]] = mapped_column(JSON)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at_us: Mapped[int] = mapped_column(BigInteger)
    revoked_at_us: Mapped[int | None] = mapped_column(BigInteger)


class BackfillRow(Base):
    """A backfill: a registered query evaluated over archived history ``[from_us, to_us)`` on Spark.

    ``state``: queued -> running -> succeeded | failed | cancelled. ``run_id`` names its rows in the
    Delta results table (``archive.backfill.RESULTS_DIR``); ``versions`` the pinned snapshot version
    of each event type's table.
    """

    __tablename__ = "backfills"
    __table_args__ = (Index("ix_backfills_query_id", "query_id"), Index("ix_backfills_state", "state"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    query_id: Mapped[int] = mapped_column(BigId, ForeignKey("queries.id", ondelete="CASCADE"))
    query_version: Mapped[int] = mapped_column(Integer)
    run_id: Mapped[str] = mapped_column(String(32), unique=True)
    state: Mapped[str] = mapped_column(String(16))
    from_us: Mapped[int] = mapped_column(BigInteger)
    to_us: Mapped[int] = mapped_column(BigInteger)
    deliver: Mapped[bool] = mapped_column(Boolean)
    percent: Mapped[float] = mapped_column(Float, default=0.0)
    events_scanned: Mapped[int] = mapped_column(BigInteger, default=0)
    matches: Mapped[int | None] = mapped_column(BigInteger)
    alerts: Mapped[int | None] = mapped_column(BigInteger)
    versions: Mapped[dict[str, int] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(String(1000))
    created_at_us: Mapped[int] = mapped_column(BigInteger)
    started_at_us: Mapped[int | None] = mapped_column(BigInteger)
    finished_at_us: Mapped[int | None] = mapped_column(BigInteger)
