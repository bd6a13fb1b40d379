"""Recording the running statements' results: alerts and their outbox rows, one transaction per batch
(docs/architecture.md sections 2-4).

The runtime's rule graph hands its results to :meth:`Results.save` (ingest, ticks, the end of a stream, the restart
replay, ``state=warm``); a live-and-archived worker (a thread or a process of its own) commits its results as it
finds them with :meth:`Results.record` (group commit: the submissions waiting at one moment share a
transaction). Both go through :func:`service.live.outbox.record_alerts`, which
de-duplicates by (query, event ids), so a result recorded twice (a replay, a retry) alerts once. A failed
transaction keeps the rule graph's batch in memory and tries it again with the next one (:attr:`Results.recorded`
says whether anything waits: a checkpoint then does not claim those results recorded).
"""
from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from engine.match import Match
from service.core.faults import crash_point
from service.core.metrics import Metrics
from service.db.session import now_us, transaction
from service.live.live_query import LiveQuery
from service.live.outbox import Found, doc_values, record_alert_rows, record_alerts

log = logging.getLogger(__name__)

GROUP_MATCHES = 20_000
"""The most live-and-archived results one group-commit transaction takes (:meth:`Results.submit`); a larger
submission is committed alone."""


class Results:
    """Where the running statements' results are recorded as alerts + outbox rows.

    Parameters
    ----------
    sessions : sessionmaker
        Database sessions (alerts and outbox).
    metrics : Metrics
        ``matches`` (per statement name), ``alerts``, ``alerts_duplicate``, ``alert_write_errors``.
    queries : Mapping[int, LiveQuery]
        The running statements by id (the runtime's): a deleted statement's results are dropped, a result
        without a version gets its running version's.
    lock : context manager
        The runtime's lock (:class:`~service.live.applying_lock.ApplyingLock`), taken by :meth:`retry_unsaved`.
    """

    def __init__(
        self, *, sessions: sessionmaker[Session], metrics: Metrics, queries: Mapping[int, LiveQuery], lock: Any
    ) -> None:
        self.sessions = sessions
        self.metrics = metrics
        self.queries = queries
        self.lock = lock
        self.on_deliveries: Callable[[], None] | None = None
        """Called after a transaction that wrote alerts or outbox rows (the webhook dispatcher's wake-up)."""
        self._unsaved: list[Found] = []
        self._group: collections.deque[tuple[int, list[Match], Future[None]]] = collections.deque()
        self._group_lock = threading.Lock()
        self._group_ready = threading.Condition(self._group_lock)
        self._committer: threading.Thread | None = None

    def record(self, query_id: int, matches: list[Match]) -> None:
        """Commit a live-and-archived query's results: alerts + outbox, committed before this returns (any thread).

        The calls waiting at one moment share one transaction (:meth:`submit`).

        Raises
        ------
        Exception
            When the database cannot take them (the worker retries). A deleted query's results
            are dropped.
        """
        self.submit(query_id, matches).result()

    def submit(self, query_id: int, matches: list[Match]) -> Future[None]:
        """Queue a live-and-archived query's results for the committer; the future is done when they are
        committed (alerts + outbox rows), or fails with the database's exception (nothing of them recorded).

        Group commit: the committer thread takes every submission waiting when it is free and commits them in
        one transaction (at most :data:`GROUP_MATCHES` matches), so ten queries answering requests at once cost
        one commit (one fsync on SQLite), not ten queued behind the write gate. When a shared transaction fails,
        each submission is tried alone, so one bad submission (its query deleted meanwhile) fails only itself.
        """
        fut: Future[None] = Future()
        with self._group_lock:
            self._group.append((query_id, matches, fut))
            if self._committer is None:
                self._committer = threading.Thread(target=self._commit_loop, name="lace-results", daemon=True)
                self._committer.start()
            self._group_ready.notify()
        return fut

    def _commit_loop(self) -> None:
        while True:
            with self._group_lock:
                while not self._group:
                    self._group_ready.wait()
                taken: list[tuple[int, list[Match], Future[None]]] = []
                size = 0
                while self._group and (not taken or size + len(self._group[0][1]) <= GROUP_MATCHES):
                    size += len(self._group[0][1])
                    taken.append(self._group.popleft())
            try:
                self._commit_group(taken)
            except Exception as e:  # noqa: BLE001 - each submission alone: only the one that cannot commit fails
                if len(taken) == 1:
                    taken[0][2].set_exception(e)
                    continue
                log.debug("a shared results transaction failed; each submission alone", exc_info=True)
                for item in taken:
                    try:
                        self._commit_group([item])
                    except Exception as e:  # noqa: BLE001 - its worker retries
                        item[2].set_exception(e)

    def _commit_group(self, taken: list[tuple[int, list[Match], Future[None]]]) -> None:
        """One transaction for the submissions ``taken``; their futures done after the commit."""
        found: list[Found] = []
        counted: list[tuple[str, int]] = []
        for query_id, matches, _ in taken:
            lq = self.queries.get(query_id)
            if lq is None:  # deleted: its results are dropped
                continue
            found += [Found(query_id, m, lq.version) for m in matches]
            counted.append((lq.name, len(matches)))
        if found:
            with transaction(self.sessions) as session:
                alerts, deliveries = record_alerts(session, found, now_us=now_us())
            for name, n in counted:
                self.metrics.matches.labels(name).inc(n)
            self._committed(len(found), alerts, deliveries)
        for _, _, fut in taken:
            fut.set_result(None)

    def import_docs(self, query_id: int, version: int, docs: list[dict[str, Any]]) -> int:
        """Commit matches found elsewhere (``lace stream``'s, as their JSON objects ``Match.to_json()``) as alerts
        of query ``query_id`` at ``version``, with their outbox rows, in one transaction; returns the new alerts.

        The query may be paused or stopped (it need not run here): a match it already alerted (same event ids)
        is not alerted again, and neither is one repeated in ``docs``.

        Raises
        ------
        Exception
            When the database cannot take them (nothing is recorded); an ``IntegrityError`` when the query was
            deleted meanwhile.
        """
        t = now_us()
        rows = [doc_values(query_id, d, t) | {"query_version": version} for d in docs]
        with transaction(self.sessions) as session:
            alerts, deliveries = record_alert_rows(session, rows, now_us=t)
            crash_point("results.import.before_commit")
        crash_point("results.import.after_commit")
        self._committed(len(docs), alerts, deliveries)
        return alerts

    def _committed(self, results: int, alerts: int, deliveries: int) -> None:
        """After a transaction that recorded ``results``: count the new ``alerts`` and the duplicates, and wake the
        webhook dispatcher when alerts or deliveries were written."""
        self.metrics.alerts.inc(alerts)
        self.metrics.alerts_duplicate.inc(results - alerts)
        if (alerts or deliveries) and self.on_deliveries is not None:  # rowcount of INSERT..SELECT is not portable
            self.on_deliveries()

    def save(self, found: list[Found]) -> int:
        """Record alerts + outbox in one transaction; keep them for the next try if the database fails. Returns
        the alerts written (0 when the transaction failed: the batch waits for the next call)."""
        batch = [f for f in self._unsaved if f.query_id in self.queries] + found  # a deleted query's are dropped
        if not batch:
            return 0
        for f in batch:
            if f.version is None:
                f.version = self.queries[f.query_id].version if f.query_id in self.queries else None
        try:
            with transaction(self.sessions) as session:
                alerts, deliveries = record_alerts(session, batch, now_us=now_us())
                crash_point("ingest.before_alert_commit")
        except Exception:
            self._unsaved = batch
            self.metrics.alert_write_errors.inc()
            log.exception("recording %d alerts failed; retried with the next batch", len(batch))
            return 0
        self._unsaved = []
        self._committed(len(batch), alerts, deliveries)
        return alerts

    @property
    def recorded(self) -> bool:
        """Whether every result found so far is recorded (no failed alert transaction left one in memory)."""
        return not self._unsaved

    def retry_unsaved(self) -> None:
        """Try again to record alerts a failed transaction left in memory."""
        with self.lock:
            if self._unsaved:
                self.save([])
