"""Prometheus metrics of one service instance (its own registry, so tests can build many apps).

Measured: events in/late/rejected, matches, alerts, deliveries, partial matches in memory,
archive buffer and WAL, backfills (Spark job groups). Exposed at 0 until their subsystem exists
in the service: partial matches spilled (STPM, docs/architecture.md section 7.6).
"""
from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Metrics:
    """The service's counters and gauges."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.events_in = Counter("lace_events_ingested", "Events accepted by POST /events", ["type"], registry=r)
        self.events_late = Counter("lace_events_late", "Events rejected as late (behind the watermark)", registry=r)
        self.events_rejected = Counter(
            "lace_events_rejected", "Events rejected, by reason kind", ["reason"], registry=r
        )
        self.events_derived = Counter(
            "lace_events_derived", "Derived events emitted by EMIT INTO statements (archived)", registry=r
        )
        self.matches = Counter("lace_matches", "Matches found by live queries", ["query"], registry=r)
        self.alerts = Counter("lace_alerts", "Alerts recorded (after de-duplication)", registry=r)
        self.alerts_duplicate = Counter(
            "lace_alerts_duplicate", "Matches already recorded as alerts (restart replay)", registry=r
        )
        self.alert_write_errors = Counter("lace_alert_write_errors", "Failed alert transactions", registry=r)
        self.deliveries_ok = Counter("lace_alerts_delivered", "Webhook deliveries acknowledged (2xx)", registry=r)
        self.deliveries_failed = Counter("lace_alert_delivery_failures", "Webhook attempts that failed", registry=r)
        self.deliveries_dead = Counter("lace_alerts_dead_lettered", "Deliveries dead-lettered", registry=r)
        self.delivery_latency = Histogram(
            "lace_delivery_latency_seconds",
            "Alert recorded -> webhook acknowledged, seconds",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=r,
        )
        self.delivery_mark = Histogram(
            "lace_delivery_mark_seconds",
            "Receiver's answer -> its outcome committed (the window in which a crash resends a delivery), seconds",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        self.circuits_opened = Counter("lace_webhook_circuits_opened", "Webhook circuits opened", registry=r)
        self.delivery_claims = Counter(
            "lace_delivery_claims", "Dispatcher claims that leased at least one delivery", registry=r
        )
        self.deliveries_claimed = Counter("lace_deliveries_claimed", "Deliveries leased by the dispatcher", registry=r)
        self.partial_matches = Gauge("lace_partial_matches", "Partial matches in memory (all live queries)", registry=r)
        self.partial_matches_spilled = Gauge(
            "lace_partial_matches_spilled", "Partial matches spilled to the store (all live queries)", registry=r
        )
        self.query_partial_matches = Gauge(
            "lace_query_partial_matches", "Partial matches of a query, in memory or spilled", ["query", "where"],
            registry=r,
        )
        self.query_pm_events = Gauge(
            "lace_query_pm_events", "Partial-match buffer events of a query since it started: spilled, reloaded, "
            "misses", ["query", "kind"], registry=r,
        )
        self.query_archive_requests = Gauge(
            "lace_query_archive_requests", "Archive requests of a live-and-archived query since it started",
            ["query"], registry=r,
        )
        self.query_pending_instances = Gauge(
            "lace_query_pending_live_instances", "Live instances of a live-and-archived query waiting for the "
            "archive (open subwindows and requests in flight)", ["query"], registry=r,
        )
        self.archive_request_seconds = Histogram(
            "lace_archive_request_seconds", "Wall time of one archive read for live-and-archived queries "
            "(a shared read of the scheduler, or one request of a query run on a thread)",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 120),
            registry=r,
        )
        self.archive_reads = Gauge(
            "lace_archive_reads", "Reads of the shared archive request scheduler (each at most one Spark job) since "
            "the service started", registry=r,
        )
        self.archive_reads_requests = Gauge(
            "lace_archive_read_requests", "Archive requests of live-and-archived queries those reads answered",
            registry=r,
        )
        self.archive_decoded_bytes = Gauge(
            "lace_archive_decoded_bytes", "Bytes of archive files kept decoded for those reads (LACE_ARCHIVE_CACHE_MB)",
            registry=r,
        )
        self.archive_decoded_files = Gauge(
            "lace_archive_decoded_files", "Files those reads found decoded (hit) or decoded (miss) since the service "
            "started", ["outcome"], registry=r,
        )
        self.live_queries = Gauge("lace_live_queries", "Active live queries", registry=r)
        self.archive_buffered = Gauge("lace_archive_buffered_events", "Events not yet committed to Delta", registry=r)
        self.archive_lag = Gauge("lace_archive_lag_seconds", "Age of the oldest unflushed event, seconds", registry=r)
        self.archive_wal_bytes = Gauge("lace_archive_wal_bytes", "Bytes in the archive write-ahead log", registry=r)
        self.spark_jobs = Counter(
            "lace_spark_jobs", "Spark job groups run by the service (one per backfill started)", registry=r
        )
        self.backfills = Counter("lace_backfills", "Backfills ended, by final state", ["state"], registry=r)
        self.backfill_events = Counter(
            "lace_backfill_events_scanned", "Archived events read by succeeded backfills", registry=r
        )
        self.backfill_matches = Counter("lace_backfill_matches", "Matches found by succeeded backfills", registry=r)
        self.worker_restarts = Counter(
            "lace_worker_restarts", "Live-and-archived worker processes started again after they died", registry=r
        )
        self.replayed = Counter("lace_replayed_events", "Events replayed from the archive at start", registry=r)
        self.replay_cut = Counter(
            "lace_replay_cut",
            "Restart replays cut short by LACE_REPLAY_MAX_S for a query without a recorded resume point "
            "(partial matches older than the limit are lost), by query",
            ["query"],
            registry=r,
        )
        self.replay_cut_seconds = Counter(
            "lace_replay_cut_seconds",
            "Event time the restart replay did not go back over because of LACE_REPLAY_MAX_S, seconds, by query "
            "(a query without WITHIN counts the limit itself: how far its state reached back is unbounded)",
            ["query"],
            registry=r,
        )
        self._collectors: list[Callable[[], None]] = []

    def on_collect(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` before each scrape (to refresh gauges)."""
        self._collectors.append(fn)

    def render(self) -> bytes:
        for fn in self._collectors:
            fn()
        return generate_latest(self.registry)
