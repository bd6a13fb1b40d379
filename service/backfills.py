"""Backfills in the service: queued in the database, run one at a time on Spark (docs/architecture.md section 7.11).

:class:`BackfillRunner` owns one worker thread. ``POST /backfills`` writes a ``queued`` row and wakes
it; the worker takes the oldest queued row, flushes the archive writer's recent buffer (so every event
acknowledged before the request is in the Delta snapshot the backfill pins), runs
:func:`archive.backfill.run_backfill` for the query's text, and records progress (percent of Spark
tasks, events scanned) on the row about once a second. When the backfill was asked to ``deliver``, its
matches become alerts of the query in one transaction with their outbox rows (the query's webhooks
get them; a match live detection already alerted is not alerted again). A cancel request sets the
backfill's cancel event (its Spark job group is cancelled) or, while it is queued, ends it at once.

A backfill left ``running`` by a stopped process is marked ``failed`` at the next start (its Spark
job died with the process); ``queued`` ones are run.

A backfill is stored as a :class:`~service.db.models.BackfillRow` (times int microseconds UTC); :func:`public`
gives its REST shape :class:`~service.schemas.backfills.BackfillPublic` (times ISO-8601), and the operations of
``/backfills`` (:func:`enqueue`, :func:`cancel`, :func:`results`) are here too. Their errors are
:class:`~service.core.errors.ApiError` with their HTTP status, naming the request field.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Select, select, update
from sqlalchemy.orm import Session, sessionmaker

from service.core.errors import ApiError, get_or_404
from service.core.metrics import Metrics
from service.db.models import BackfillRow, QueryRow
from service.db.session import now_us
from service.schemas.backfills import BackfillMatch, BackfillPublic, BackfillResults
from service.schemas.common import iso

log = logging.getLogger("lace.backfills")

FINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
ALERT_BATCH = 5_000


class BackfillRunner:
    """Runs queued backfills, one at a time, in a background thread.

    Parameters
    ----------
    sessions : sessionmaker
        The service database.
    archive_root : Path-like
        The Delta archive the backfills read.
    spark_master : str
        Spark master for the process's session (started on the first backfill).
    flush_archive : callable, optional
        Flushes the archive writer's recent buffer to Delta (``ArchiveWriter.flush``).
    on_deliveries : callable, optional
        Called after alerts with deliveries were committed (wakes the webhook dispatcher).
    progress_interval_s : float
        Least seconds between two progress writes of one backfill.
    metrics : Metrics, optional
        The service's Prometheus metrics (``lace_spark_jobs``, ``lace_backfills{state}``, events, matches).
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        archive_root: Any,
        spark_master: str,
        *,
        flush_archive: Callable[[], object] | None = None,
        on_deliveries: Callable[[], object] | None = None,
        progress_interval_s: float = 1.0,
        metrics: Metrics | None = None,
    ) -> None:
        self.sessions = sessions
        self.archive_root = archive_root
        self.spark_master = spark_master
        self.flush_archive = flush_archive
        self.on_deliveries = on_deliveries
        self.progress_interval_s = progress_interval_s
        self.metrics = metrics
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._cancels: dict[int, threading.Event] = {}
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Fail the backfills a stopped process left running, then start the worker thread."""
        with self.sessions() as s:
            s.execute(
                update(BackfillRow)
                .where(BackfillRow.state == "running")
                .values(state="failed", error="the service stopped while it ran", finished_at_us=now_us())
            )
            s.commit()
        self._thread = threading.Thread(target=self._loop, name="lace-backfills", daemon=True)
        self._thread.start()
        self._wake.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Cancel the running backfill and stop the worker (its row ends ``failed``: the service stopped)."""
        self._stopping.set()
        with self._lock:
            for ev in self._cancels.values():
                ev.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def wake(self) -> None:
        """A backfill was queued."""
        self._wake.set()

    def cancel(self, backfill_id: int) -> bool:
        """Ask backfill ``backfill_id`` to stop; False when it is not running in this process."""
        with self._lock:
            ev = self._cancels.get(backfill_id)
        if ev is None:
            return False
        ev.set()
        return True

    # ---------------------------------------------------------------- the worker

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(5.0)
            self._wake.clear()
            while not self._stopping.is_set():
                with self.sessions() as s:
                    row = s.scalars(
                        select(BackfillRow).where(BackfillRow.state == "queued").order_by(BackfillRow.id).limit(1)
                    ).first()
                    if row is None:
                        break
                    backfill_id = row.id
                try:
                    self.run(backfill_id)
                except Exception:  # never let one backfill stop the worker
                    log.exception("backfill %d: unexpected error", backfill_id)
                    self._finish(backfill_id, "failed", error="internal error (see the service log)")

    def run(self, backfill_id: int) -> None:
        """Run one queued backfill to its end (blocking)."""
        from archive.backfill import BackfillError, Progress, run_backfill

        # the cancel event exists before the row is claimed: a cancel request in between finds one of the two
        cancel = threading.Event()
        with self._lock:
            self._cancels[backfill_id] = cancel
        with self.sessions() as s:
            claimed: Any = s.execute(
                update(BackfillRow)
                .where(BackfillRow.id == backfill_id, BackfillRow.state == "queued")
                .values(state="running", started_at_us=now_us())
            )
            s.commit()
            row = s.get(BackfillRow, backfill_id)
            query = s.get(QueryRow, row.query_id) if row is not None else None
            if not claimed.rowcount or row is None or query is None:  # cancelled, or deleted with its query
                with self._lock:
                    self._cancels.pop(backfill_id, None)
                return
            query_id, text, run_id = row.query_id, query.text, row.run_id
            lo, hi, deliver = row.from_us, row.to_us, row.deliver
        last = [0.0]

        def report(p: Progress) -> None:
            t = time.monotonic()
            if t - last[0] >= self.progress_interval_s:
                last[0] = t
                self._update(backfill_id, percent=round(p.percent, 1), events_scanned=p.events)

        try:
            if self.flush_archive is not None:
                self.flush_archive()
            spark = self._spark()
            if self.metrics is not None:
                self.metrics.spark_jobs.inc()
            result = run_backfill(
                self.archive_root,
                text,
                lo,
                hi,
                spark=spark,
                backfill_id=run_id,
                progress=report,
                cancel=cancel,
                query_id=query_id,
            )
        except BackfillError as e:
            if self._stopping.is_set():
                self._finish(backfill_id, "failed", error="the service stopped while it ran")
            elif cancel.is_set():
                self._finish(backfill_id, "cancelled")
            else:
                self._finish(backfill_id, "failed", error=str(e))
            return
        finally:
            with self._lock:
                self._cancels.pop(backfill_id, None)
        alerts = self._deliver(query_id, result.matches) if deliver else None
        if self.metrics is not None:
            self.metrics.backfill_events.inc(result.events_scanned)
            self.metrics.backfill_matches.inc(len(result.matches))
        self._finish(
            backfill_id,
            "succeeded",
            percent=100.0,
            events_scanned=result.events_scanned,
            matches=len(result.matches),
            alerts=alerts,
            versions=result.versions,
        )

    def _spark(self) -> Any:
        from dataclasses import replace

        from archive.spark import SparkSettings, get_spark

        return get_spark(replace(SparkSettings.from_env(), master=self.spark_master))

    def _deliver(self, query_id: int, matches: list[dict[str, Any]]) -> int:
        """Record the matches as alerts of the query (with their outbox rows); returns how many were new."""
        from service.live.outbox import doc_values, record_alert_rows

        created = deliveries = 0
        for i in range(0, len(matches), ALERT_BATCH):
            t = now_us()
            with self.sessions() as s:
                rows = [doc_values(query_id, m, t) for m in matches[i : i + ALERT_BATCH]]
                a, d = record_alert_rows(s, rows, now_us=t)
                s.commit()
            created, deliveries = created + a, deliveries + d
        if deliveries and self.on_deliveries is not None:
            self.on_deliveries()
        return created

    def _update(self, backfill_id: int, **values: Any) -> None:
        with self.sessions() as s:
            running = (BackfillRow.id == backfill_id) & (BackfillRow.state == "running")
            s.execute(update(BackfillRow).where(running).values(**values))
            s.commit()

    def _finish(self, backfill_id: int, state: str, **values: Any) -> None:
        with self.sessions() as s:
            res: Any = s.execute(
                update(BackfillRow)
                .where(BackfillRow.id == backfill_id, BackfillRow.state.not_in(FINAL_STATES))
                .values(state=state, finished_at_us=now_us(), **values)
            )
            s.commit()
        if res.rowcount and self.metrics is not None:
            self.metrics.backfills.labels(state).inc()


# -------------------------------------------------------------------- the API shape and the operations


def public(row: BackfillRow) -> BackfillPublic:
    """The REST shape of ``row``: its query and version, ``[from, to)``, state, progress (percent of Spark
    tasks, events scanned), outcome (matches, alerts, the Delta versions read, the error) and times (ISO-8601)."""
    return BackfillPublic(
        id=row.id,
        query_id=row.query_id,
        query_version=row.query_version,
        run_id=row.run_id,
        state=row.state,  # type: ignore[arg-type]
        from_=iso(row.from_us),
        to=iso(row.to_us),
        deliver=row.deliver,
        percent=row.percent,
        events_scanned=row.events_scanned,
        matches=row.matches,
        alerts=row.alerts,
        versions=row.versions,
        error=row.error,
        created_at=iso(row.created_at_us),
        started_at=None if row.started_at_us is None else iso(row.started_at_us),
        finished_at=None if row.finished_at_us is None else iso(row.finished_at_us),
    )


def need(runner: BackfillRunner | None) -> BackfillRunner:
    """``runner``; a 409 (no field) when there is none: backfills need the archive."""
    if runner is None:
        raise ApiError(409, "backfills need the archive (LACE_ARCHIVE_ENABLED=true)", None)
    return runner


def get(session: Session, backfill_id: int) -> BackfillRow:
    """The row of backfill ``backfill_id``; 404 on ``path.id`` when there is none."""
    return get_or_404(session, BackfillRow, backfill_id, "backfill")


def selection(query_id: int | None) -> Select[Any]:
    """The backfills of query ``query_id`` (None: of any)."""
    stmt = select(BackfillRow)
    if query_id is not None:
        stmt = stmt.where(BackfillRow.query_id == query_id)
    return stmt


def enqueue(
    session: Session, runner: BackfillRunner, query_id: int, from_us: int, to_us: int, deliver: bool
) -> BackfillRow:
    """Queue a backfill of query ``query_id``'s current version over ``[from_us, to_us)`` (int us UTC; with
    ``deliver`` its matches become alerts) and wake ``runner``.

    Raises
    ------
    ApiError
        422 on ``body.to`` unless ``to_us > from_us``; 404 on ``body.query_id`` when there is no such query.
    """
    if to_us <= from_us:
        raise ApiError(422, "must be after from", "body.to")
    query = get_or_404(session, QueryRow, query_id, "query", "body.query_id")
    row = BackfillRow(
        query_id=query.id,
        query_version=query.version,
        run_id=uuid.uuid4().hex,
        state="queued",
        from_us=from_us,
        to_us=to_us,
        deliver=deliver,
        percent=0.0,
        events_scanned=0,
        created_at_us=now_us(),
    )
    session.add(row)
    session.commit()
    runner.wake()
    return row


def cancel(session: Session, runner: BackfillRunner | None, backfill_id: int) -> BackfillRow:
    """Cancel backfill ``backfill_id``: a queued one ends here, a running one when its Spark job group has
    stopped (its row is returned as it is now).

    Raises
    ------
    ApiError
        404 on ``path.id`` (:func:`get`); 409 on ``path.id`` when it has ended; 409 without ``runner``
        (:func:`need`).
    """
    row = get(session, backfill_id)
    if row.state in FINAL_STATES:
        raise ApiError(409, f"the backfill has ended ({row.state})", "path.id")
    # a queued one ends here; a running one ends when its Spark job group has stopped
    running = need(runner)
    res: Any = session.execute(
        update(BackfillRow)
        .where(BackfillRow.id == backfill_id, BackfillRow.state == "queued")
        .values(state="cancelled", finished_at_us=now_us())
    )
    session.commit()
    if res.rowcount and running.metrics is not None:
        running.metrics.backfills.labels("cancelled").inc()
    running.cancel(backfill_id)
    session.refresh(row)
    return row


def results(session: Session, archive_root: Path, backfill_id: int, offset: int, limit: int) -> BackfillResults:
    """The matches of succeeded backfill ``backfill_id`` (from the archive's Delta results table under
    ``archive_root``), in (start, end, match) order: ``limit`` from ``offset`` on, the total and the next offset.

    Raises
    ------
    ApiError
        404 on ``path.id`` (:func:`get`); 409 on ``path.id`` unless it succeeded.
    """
    import orjson

    from archive.backfill import read_results

    row = get(session, backfill_id)
    if row.state != "succeeded":
        raise ApiError(409, f"the backfill has no results: it is {row.state}", "path.id")
    table = read_results(archive_root, row.run_id)
    table = table.sort_by([("start", "ascending"), ("end", "ascending"), ("match", "ascending")])
    lines = table.column("match").to_pylist()[offset : offset + limit]
    nxt = offset + limit if offset + limit < table.num_rows else None
    return BackfillResults(
        items=[BackfillMatch(**orjson.loads(s)) for s in lines], total=table.num_rows, next_offset=nxt
    )
