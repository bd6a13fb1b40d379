"""The live runtime's gauges, refreshed when Prometheus collects (``GET /metrics``): partial matches per
statement (in memory, spilled), spill counters, live-and-archived requests and pending instances, archive
buffer, WAL bytes and lag, the archive files kept decoded."""
from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from service.core.metrics import Metrics
    from service.live.archive_scheduler import ArchiveScheduler
    from service.live.live_query import LiveQuery


class GaugeSource(Protocol):
    """What the gauges read (:class:`~service.live.runtime.LiveRuntime` is one): the metrics, the running
    statements, the archive scheduler and the archive."""

    @property
    def metrics(self) -> Metrics:
        """Where the gauges are."""

    @property
    def queries(self) -> Mapping[int, LiveQuery]:
        """The running statements, by id."""

    @property
    def scheduler(self) -> ArchiveScheduler | None:
        """The shared archive scheduler (None: none)."""

    @property
    def archive(self) -> Any:
        """The archive writer (``stats()``, ``buffer``; None: no archive)."""

    @property
    def source(self) -> Any:
        """The live-and-archived queries' archive source (the service's is an
        :class:`archive.archived_source.LazyArchiveSource`; None: none)."""


def refresh_gauges(rt: GaugeSource) -> None:
    """Set every gauge from ``rt``'s statements and archive."""
    m = rt.metrics
    total = spilled = 0
    for lq in list(rt.queries.values()):
        s = lq.stats()
        pm = s.get("live_matcher", s)
        total += pm.get("live_partial_matches", 0)
        spilled += pm.get("spilled_now", 0)
        m.query_partial_matches.labels(lq.name, "memory").set(pm.get("live_partial_matches", 0))
        m.query_partial_matches.labels(lq.name, "spilled").set(pm.get("spilled_now", 0))
        for kind in ("spilled", "reloaded", "misses"):
            m.query_pm_events.labels(lq.name, kind).set(pm.get(kind, 0))
        load = lq.archive_load(s)
        if load is not None:  # it reads the archive
            m.query_archive_requests.labels(lq.name).set(load[0])
            m.query_pending_instances.labels(lq.name).set(load[1])
    m.partial_matches.set(total)
    m.partial_matches_spilled.set(spilled)
    rt.metrics.live_queries.set(len(rt.queries))
    if rt.scheduler is not None:
        reads = rt.scheduler.stats()
        m.archive_reads.set(reads["reads"])
        m.archive_reads_requests.set(reads["requests"])
    from archive.archived_source import LazyArchiveSource

    decoded = rt.source.decoded_files() if isinstance(rt.source, LazyArchiveSource) else None
    if decoded is not None:
        m.archive_decoded_bytes.set(decoded.nbytes)
        m.archive_decoded_files.labels("hit").set(decoded.hits)
        m.archive_decoded_files.labels("miss").set(decoded.misses)
    if rt.archive is not None:
        stats = rt.archive.stats()
        rt.metrics.archive_buffered.set(stats.get("buffered", 0))
        rt.metrics.archive_wal_bytes.set(stats.get("wal_bytes", 0))
        oldest = rt.archive.buffer.oldest_s()
        rt.metrics.archive_lag.set(max(time.monotonic() - oldest, 0.0) if oldest is not None else 0.0)
