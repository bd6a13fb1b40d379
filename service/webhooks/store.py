"""Database side of the dispatcher: claim due deliveries, record attempt outcomes, run each
endpoint's circuit breaker.

A claimed delivery gets a lease (``lease_until_us``) so the next poll skips it while its
request is in flight; a crash leaves the lease to expire (or :func:`release_leases` at start),
and the delivery is sent again with the same idempotency key.

Circuit breaker (per webhook, ``webhooks.circuit``): ``webhook_breaker_failures`` consecutive
endpoint failures (no answer, 5xx, 408, 429) open it. While open, the webhook's deliveries are
held (neither sent nor dead-lettered); when ``probe_at_us`` comes, its oldest pending delivery
is sent alone as a probe (``probing``). A probe answered 2xx (or any answer that is not an
endpoint failure) closes the circuit and releases the held deliveries at once, each with a fresh
attempt budget; a failed probe re-opens it with a doubled, jittered wait. A 4xx other than
408/429 is the receiver refusing that one delivery: it counts against the delivery's attempts,
not against the endpoint.
"""
from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, insert, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from service.core.config import Settings
from service.db.models import AlertRow, DeliveryAttemptRow, DeliveryRow, QueryRow, WebhookRow
from service.db.session import transaction


def backoff_s(attempt: int, *, base_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """Delay before retry number ``attempt`` (1 = after the first failure), seconds, jittered.

    ``d = min(max_s, base_s * 2^(attempt-1))``, drawn uniformly in ``[d/2, d]``.

    >>> 0.5 <= backoff_s(1, base_s=1, max_s=60) <= 1.0, 30 <= backoff_s(10, base_s=1, max_s=60) <= 60
    (True, True)
    """
    d = min(max_s, base_s * (2 ** min(max(attempt - 1, 0), 60)))
    return (rng or random).uniform(d / 2, d)


@dataclass(slots=True)
class Job:
    """One delivery to attempt; ``previous_salt``: the pre-rotation secret still in its grace period."""

    delivery_id: int
    idempotency_key: str
    attempt: int
    url: str
    webhook_id: int
    salt: str
    previous_salt: str | None
    payload: dict[str, Any]
    alert_created_at_us: int
    probe: bool = False


@dataclass(slots=True)
class Outcome:
    """What one attempt gave: ``status_code`` (None: no response) and ``error``.

    ``endpoint_down``: the failure says the endpoint is unwell (no answer, 5xx, 408, 429), not
    that it refused this delivery; only those count towards its circuit breaker.
    """

    job: Job
    ok: bool
    status_code: int | None
    error: str | None
    at_us: int
    duration_ms: float
    endpoint_down: bool = False
    skipped: bool = False
    """Not sent: its endpoint's circuit opened while it waited for a slot (the lease is just released)."""


def is_endpoint_failure(status_code: int | None) -> bool:
    """No answer, a 5xx, 408 or 429.

    >>> [is_endpoint_failure(c) for c in (None, 503, 429, 400, 404)]
    [True, True, True, False, False]
    """
    return status_code is None or status_code >= 500 or status_code in (408, 429)


def release_leases(sessions: sessionmaker[Session], *, now_us: int) -> None:
    """Forget the leases of a previous process (one dispatcher per database); an interrupted probe is due now."""
    with transaction(sessions) as s:
        s.execute(update(DeliveryRow).where(DeliveryRow.lease_until_us.is_not(None)).values(lease_until_us=None))
        s.execute(update(WebhookRow).where(WebhookRow.circuit == "probing").values(circuit="open", probe_at_us=now_us))


_ALERT_FIELDS = ("id", "query_id", "query_version", "events", "start_us", "end_us", "fields", "created_at_us")
"""What :func:`alert_payload` reads of an alert."""


def _live(stmt: Any) -> Any:
    return stmt.where(WebhookRow.active.is_(True), WebhookRow.deleted_at_us.is_(None))


def _pending(*columns: Any) -> Any:
    """``columns`` of the pending deliveries joined to their alert, webhook and query (what a claim leases
    through)."""
    return (
        select(*columns)
        .select_from(DeliveryRow)
        .join(AlertRow, AlertRow.id == DeliveryRow.alert_id)
        .join(WebhookRow, WebhookRow.id == DeliveryRow.webhook_id)
        .join(QueryRow, QueryRow.id == AlertRow.query_id)
        .where(DeliveryRow.status == "pending")
    )


def _unleased(now_us: int) -> Any:
    return or_(DeliveryRow.lease_until_us.is_(None), DeliveryRow.lease_until_us < now_us)


_JOB_COLUMNS = (
    DeliveryRow.id.label("delivery_id"),
    DeliveryRow.idempotency_key,
    DeliveryRow.attempts,
    WebhookRow.id.label("webhook_id"),
    WebhookRow.url,
    WebhookRow.salt,
    WebhookRow.previous_salt,
    WebhookRow.previous_salt_until_us,
    *(getattr(AlertRow, k) for k in _ALERT_FIELDS),  # named as alert_payload reads them
    QueryRow.name.label("query_name"),
)


def claim_due(sessions: sessionmaker[Session], *, now_us: int, limit: int, lease_us: int) -> list[Job]:
    """Lease up to ``limit`` pending deliveries whose next attempt is due (closed circuits), plus
    one probe per open circuit whose probe time has come.

    The rows are selected as columns, not ORM entities (loading the entities was most of a claim's CPU)."""
    base = _pending(*_JOB_COLUMNS).where(_unleased(now_us))
    with transaction(sessions) as s:
        probes: list[Any] = []
        for wid in s.scalars(
            _live(select(WebhookRow.id).where(WebhookRow.circuit == "open", WebhookRow.probe_at_us <= now_us))
        ):
            row = s.execute(base.where(DeliveryRow.webhook_id == wid).order_by(DeliveryRow.id).limit(1)).first()
            if row is not None:
                probes.append(row)
                s.execute(update(WebhookRow).where(WebhookRow.id == wid).values(circuit="probing"))
        rows = s.execute(
            _live(base.where(DeliveryRow.next_attempt_at_us <= now_us, WebhookRow.circuit == "closed"))
            .order_by(DeliveryRow.next_attempt_at_us, DeliveryRow.id)
            .limit(limit)
        ).all()
        n_probes = len(probes)
        rows = [*probes, *rows]
        if not rows:
            return []
        ids = [r.delivery_id for r in rows]
        table = cast(Table, DeliveryRow.__table__)  # Core: no ORM bulk update (nothing loaded to synchronize)
        s.execute(update(table).where(table.c.id.in_(ids)).values(lease_until_us=now_us + lease_us))
        return [
            Job(
                delivery_id=r.delivery_id,
                idempotency_key=r.idempotency_key,
                attempt=r.attempts + 1,
                url=r.url,
                webhook_id=r.webhook_id,
                salt=r.salt,
                previous_salt=r.previous_salt if (r.previous_salt_until_us or 0) > now_us else None,
                payload=alert_payload(r, r.query_name),
                alert_created_at_us=r.created_at_us,
                probe=i < n_probes,
            )
            for i, r in enumerate(rows)
        ]


def next_due_us(sessions: sessionmaker[Session], *, now_us: int) -> int | None:
    """The earliest time (int us UTC) at which :func:`claim_due` may lease something it does not lease at ``now_us``,
    over the deliveries it can lease (pending, of a live webhook, with their alert and query): an unleased one's next
    attempt where the circuit is closed, its probe time where the circuit is open, a leased one's lease end (None:
    nothing pending that a claim could take; only a new or released delivery, which wakes the dispatcher, changes
    that). Early is harmless (a claim finds nothing), late never happens."""
    unleased = _unleased(now_us)

    def earliest(column: Any, *where: Any) -> Any:
        return _live(_pending(func.min(column)).where(*where))

    with sessions() as s:
        times = [
            s.scalar(earliest(DeliveryRow.next_attempt_at_us, unleased, WebhookRow.circuit == "closed")),
            s.scalar(earliest(WebhookRow.probe_at_us, unleased, WebhookRow.circuit == "open")),
            s.scalar(earliest(DeliveryRow.lease_until_us, DeliveryRow.lease_until_us >= now_us)),
        ]
    found = [int(t) for t in times if t is not None]
    return min(found) if found else None


def alert_payload(a: Any, query_name: str) -> dict[str, Any]:
    """The JSON body of a delivery (the same for every attempt): :class:`~service.schemas.alerts.WebhookAlert`, the
    fields of the alert's item in ``GET /alerts`` (:func:`service.alert.public`), its query's name, and the
    deprecated names sent before issue 47 (``alert_id``, ``query``).

    ``a``: the alert's ``_ALERT_FIELDS`` as attributes (an :class:`~service.db.models.AlertRow`, or a result row
    of those columns; times int microseconds UTC)."""
    from service.schemas.common import iso

    return {
        "id": a.id,
        "query_id": a.query_id,
        "query_version": a.query_version,
        "events": a.events,
        "start": iso(a.start_us),
        "end": iso(a.end_us),
        "fields": a.fields,
        "detected_at": iso(a.created_at_us),
        "query_name": query_name,
        "alert_id": a.id,
        "query": {"id": a.query_id, "name": query_name, "version": a.query_version},
    }


@dataclass(slots=True)
class Recorded:
    """Counts of one :func:`record_outcomes` call."""

    delivered: int = 0
    failed: int = 0
    dead: int = 0
    held: int = 0
    opened: int = 0
    open_webhooks: set[int] = field(default_factory=set)
    """Webhooks of these outcomes whose circuit is not closed afterwards."""


def mark_delivered(
    sessions: sessionmaker[Session], outcomes: Sequence[Outcome], *, check: Collection[int] = ()
) -> tuple[int, bool]:
    """Commit the delivered marks (and log rows) of 2xx outcomes at once, in one small transaction;
    return how many deliveries still existed, and whether every webhook of ids ``check`` had a
    closed circuit with no failure counted (read without locking them). Nothing else is written with
    them: the shorter this step, the fewer deliveries a crash right after a receiver's 2xx sends again."""
    table, log = cast(Table, DeliveryRow.__table__), cast(Table, DeliveryAttemptRow.__table__)
    hooks = cast(Table, WebhookRow.__table__)
    with transaction(sessions) as s:
        settled = not check or s.execute(
            select(hooks.c.id)
            .where(hooks.c.id.in_(check), or_(hooks.c.circuit != "closed", hooks.c.failures != 0))
            .limit(1)
        ).first() is None
        ids = [o.job.delivery_id for o in outcomes]
        live = set(s.execute(select(table.c.id).where(table.c.id.in_(ids))).scalars())
        rows = [o for o in outcomes if o.job.delivery_id in live]
        if not rows:
            return 0, settled
        s.execute(
            update(table)
            .where(table.c.id == bindparam("d_id"))
            .values(
                status="delivered",
                delivered_at_us=bindparam("d_at"),
                attempts=bindparam("d_attempt"),
                lease_until_us=None,
                last_status_code=bindparam("d_code"),
                last_error=None,
            ),
            [
                {"d_id": o.job.delivery_id, "d_at": o.at_us, "d_attempt": o.job.attempt, "d_code": o.status_code}
                for o in rows
            ],
        )
        s.execute(
            insert(log),
            [
                {
                    "delivery_id": o.job.delivery_id,
                    "attempt": o.job.attempt,
                    "at_us": o.at_us,
                    "outcome": "delivered",
                    "status_code": o.status_code,
                    "error": None,
                    "duration_ms": o.duration_ms,
                }
                for o in rows
            ],
        )
        return len(rows), settled


def _close(s: Session, w: WebhookRow, *, now_us: int, except_id: int) -> None:
    """Close ``w``'s circuit; if it was not closed, its held deliveries are due now with fresh budgets."""
    if w.circuit != "closed":
        s.execute(
            update(DeliveryRow)
            .where(DeliveryRow.webhook_id == w.id, DeliveryRow.status == "pending", DeliveryRow.id != except_id)
            .values(next_attempt_at_us=now_us, attempts=0)
        )
    w.circuit, w.failures, w.opened_at_us, w.probe_at_us = "closed", 0, None, None


def record_outcomes(
    sessions: sessionmaker[Session],
    outcomes: Sequence[Outcome],
    *,
    settings: Settings,
    rng: random.Random | None = None,
) -> Recorded:
    """Write the attempts and move each endpoint's circuit; return the counts.

    The 2xx outcomes are committed first, on their own (:func:`mark_delivered`); then the failures
    and the circuits, in a second transaction (none when every outcome is a 2xx and their webhooks'
    circuits are closed with no failure counted: it would change nothing).
    """
    st = settings
    threshold = st.webhook_breaker_failures
    out = Recorded()
    skipped = [o.job.delivery_id for o in outcomes if o.skipped]
    outcomes = [o for o in outcomes if not o.skipped]
    if skipped:
        with transaction(sessions) as s:
            s.execute(update(DeliveryRow).where(DeliveryRow.id.in_(skipped)).values(lease_until_us=None))
    if not outcomes:
        return out
    ok = [o for o in outcomes if o.ok]
    wids = sorted({o.job.webhook_id for o in outcomes})
    if ok:
        # all 2xx and every circuit closed without failures (the common case): the second transaction would
        # lock the webhooks only to change nothing, so an unlocked read in the first one tells that instead
        out.delivered, settled = mark_delivered(sessions, ok, check=wids if len(ok) == len(outcomes) else ())
        if settled and len(ok) == len(outcomes):
            return out
    with transaction(sessions) as s:
        # the webhook rows are locked first, in id order, as the routes do (PostgreSQL: no deadlock with a PATCH)
        ws = {
            w.id: w
            for w in s.scalars(
                select(WebhookRow).where(WebhookRow.id.in_(wids)).order_by(WebhookRow.id).with_for_update()
            )
        }
        if len(ok) == len(outcomes) and all(w.circuit == "closed" and not w.failures for w in ws.values()):
            return out
        ids = {o.job.delivery_id for o in outcomes if not o.ok}
        ds = {d.id: d for d in s.scalars(select(DeliveryRow).where(DeliveryRow.id.in_(ids)))}
        for o in sorted(outcomes, key=lambda x: x.at_us):
            w = ws.get(o.job.webhook_id)
            if o.ok:
                if w is not None and (w.circuit != "closed" or w.failures):
                    _close(s, w, now_us=o.at_us, except_id=o.job.delivery_id)
                continue
            d = ds.get(o.job.delivery_id)
            if d is None:  # its query was deleted meanwhile
                continue
            d.attempts = o.job.attempt
            d.lease_until_us = None
            d.last_status_code = o.status_code
            d.last_error = (o.error or "")[:500] or None
            if w is not None and not o.endpoint_down:
                if w.circuit != "closed" or w.failures:
                    _close(s, w, now_us=o.at_us, except_id=d.id)
            elif w is not None and threshold > 0 and (w.circuit == "closed" or o.job.probe):
                # while open, only probes count: stragglers sent before it opened do not push the next probe out
                w.failures += 1
                if o.job.probe or (w.circuit == "closed" and w.failures >= threshold):
                    if w.circuit == "closed":
                        w.opened_at_us = o.at_us
                        out.opened += 1
                    k = max(w.failures - threshold, 0) + 1
                    delay = backoff_s(
                        k, base_s=st.webhook_breaker_probe_s, max_s=st.webhook_breaker_probe_max_s, rng=rng
                    )
                    w.circuit, w.probe_at_us = "open", o.at_us + int(delay * 1e6)
            if d.status != "pending":  # cancelled while in flight (webhook deleted): stays so
                outcome = "failed"
                out.failed += 1
            elif w is not None and o.endpoint_down and w.circuit != "closed":
                outcome = "held"  # the circuit is open: not dead-lettered, released when it closes
                out.held += 1
            elif o.job.attempt >= st.webhook_max_attempts:
                d.status, outcome = "dead", "dead"
                out.dead += 1
            else:
                delay = backoff_s(
                    o.job.attempt, base_s=st.webhook_backoff_base_s, max_s=st.webhook_backoff_max_s, rng=rng
                )
                d.next_attempt_at_us, outcome = o.at_us + int(delay * 1e6), "failed"
                out.failed += 1
            if w is not None and w.circuit != "closed":
                out.open_webhooks.add(w.id)
            s.add(
                DeliveryAttemptRow(
                    delivery_id=d.id,
                    attempt=o.job.attempt,
                    at_us=o.at_us,
                    outcome=outcome,
                    status_code=o.status_code,
                    error=d.last_error,
                    duration_ms=o.duration_ms,
                )
            )
    return out
