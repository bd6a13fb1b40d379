"""Alerts and their outbox rows, written in one transaction (docs/architecture.md section 7.10).

An alert is recorded once per (query, event ids): ``dedup_key`` is the SHA-256 of the
match's variable -> event ids map, and inserting a known one does nothing. That is what
lets a restart replay the archive without alerting twice. Every new alert gets one
``deliveries`` row per webhook of its query (paused ones too: they hold it; deleted ones not),
with a fresh idempotency key ``lace-<UUIDv7>`` kept by every retry and redelivery. The key is
not derived from row ids: SQLite hands deleted ids out again.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson
from sqlalchemy import Table, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from engine.match import Match
from service.core.security import new_idempotency_key
from service.db.models import AlertRow, DeliveryRow, WebhookRow


@dataclass(slots=True)
class Found:
    """A match of live query ``query_id``."""

    query_id: int
    match: Match
    version: int | None = None
    """The query's version when it found the match (alerts carry it)."""


def dedup_key(events: dict[str, list[int]]) -> str:
    """SHA-256 hex of the variable -> ids map (order of variables does not matter).

    >>> dedup_key({"a": [1], "b": [2, 3]}) == dedup_key({"b": [2, 3], "a": [1]})
    True
    """
    return hashlib.sha256(orjson.dumps(events, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def alert_values(found: Found, now_us: int) -> dict[str, Any]:
    """The ``alerts`` row of a live match."""
    values = doc_values(found.query_id, found.match.to_json(), now_us)
    values["query_version"] = found.version
    return values


def doc_values(query_id: int, doc: dict[str, Any], now_us: int) -> dict[str, Any]:
    """The ``alerts`` row of a match given as its JSON object (``Match.to_json()``, e.g. a backfill result)."""
    events = dict(doc["events"])
    fields = {k: _json_safe(v) for k, v in doc["fields"].items()}
    if any(events.values()):
        key = dedup_key(events)
    else:  # a window result (AGGREGATE) names no events: its window and group identify it
        key = dedup_key({"window": [doc["start"], doc["end"]], "fields": fields})  # type: ignore[dict-item]
    return {
        "query_id": query_id,
        "dedup_key": key,
        "events": events,
        "fields": fields,
        "start_us": doc["start"],
        "end_us": doc["end"],
        "created_at_us": now_us,
        "query_version": None,
    }


def record_alerts(session: Session, found: Sequence[Found], *, now_us: int) -> tuple[int, int]:
    """Insert the new alerts of ``found`` and their deliveries; return ``(alerts, deliveries)`` created.

    Runs inside the caller's transaction: alerts and outbox rows commit together.
    """
    return record_alert_rows(session, [alert_values(f, now_us) for f in found], now_us=now_us)


def record_alert_rows(session: Session, values: Sequence[dict[str, Any]], *, now_us: int) -> tuple[int, int]:
    """Insert ``alerts`` rows (from :func:`alert_values` / :func:`doc_values`) that are new, and their
    deliveries, in the caller's transaction; return ``(alerts, deliveries)`` created.

    A row whose (query, event ids) is already an alert is skipped: a backfill over a range that live
    detection saw alerts nothing twice.
    """
    if not values:
        return 0, 0
    rows = list({(v["query_id"], v["dedup_key"]): v for v in values}.values())
    dialect = session.get_bind().dialect.name
    alerts, deliveries = cast(Table, AlertRow.__table__), cast(Table, DeliveryRow.__table__)  # Core: no ORM bulk
    ins: Any = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(alerts)
    stmt = ins.on_conflict_do_nothing(index_elements=["query_id", "dedup_key"]).returning(alerts.c.id)
    ids = [r[0] for r in session.execute(stmt, rows)]
    if not ids:
        return 0, 0
    pairs = session.execute(
        select(AlertRow.id, WebhookRow.id)
        .join(WebhookRow, WebhookRow.query_id == AlertRow.query_id)
        .where(AlertRow.id.in_(ids), WebhookRow.deleted_at_us.is_(None))
        .order_by(AlertRow.id, WebhookRow.id)
    ).all()
    if pairs:
        session.execute(
            insert(deliveries),
            [
                {
                    "alert_id": a,
                    "webhook_id": w,
                    "idempotency_key": new_idempotency_key(),
                    "status": "pending",
                    "attempts": 0,
                    "next_attempt_at_us": now_us,
                    "created_at_us": now_us,
                }
                for a, w in pairs
            ],
        )
    return len(ids), len(pairs)
