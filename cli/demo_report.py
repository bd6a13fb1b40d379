"""What ``lace demo`` prints (:mod:`cli.demo`; docs/architecture.md section 7.13): alert fields and times in
words (UTC), nearest-rank percentiles, and the summary at the end (alerts, verified webhook deliveries and
archive requests per query, ingest-to-webhook latency p50/p99 in ms, the live posting rate, each step's wall
time), which :func:`cli.demo.run_demo` also returns as a dict.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from engine.events import Event

if TYPE_CHECKING:  # rich is imported where the demo draws, not by every `lace` command
    from rich.console import Console

    from cli.demo_client import QueryRun


def _fmt_time(ts_us: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts_us // 1_000_000))


def _fmt_fields(fields: dict[str, Any]) -> str:
    parts = []
    for k, v in fields.items():
        if isinstance(v, int) and not isinstance(v, bool) and v > 10**15:  # a timestamp in microseconds
            v = _fmt_time(v)
        elif isinstance(v, float):
            v = f"{v:.4g}"
        parts.append(f"{k}={v}")
    return " ".join(parts)


def _iso_us(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1_000_000)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank ``q`` quantile (0..1) of ``values``; 0.0 when empty."""
    if not values:
        return 0.0
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def _summary(
    console: Console, runs: list[QueryRun], stats: dict[str, dict[str, Any]], alerts: dict[str, int], receiver: Any,
    seconds: dict[str, float], events: list[Event], archived: list[Event], live: list[Event], ended: list[str],
    tolerance_s: float,
) -> dict[str, Any]:
    from rich.table import Table

    table = Table(title="summary (webhooks: verified deliveries; p50/p99: ingest-to-webhook latency)")
    for col in ("query", "kind", "alerts", "webhooks", "archive req.", "p50 ms", "p99 ms"):
        table.add_column(col, justify="left" if col in ("query", "kind") else "right", no_wrap=col in ("query", "kind"))
    requests: dict[str, int] = {}
    per_query_latency: dict[str, dict[str, float]] = {}
    for run in runs:
        name = run.query.name
        la = stats[name].get("live_archived")
        if la is not None:
            requests[name] = la["archive_requests"]
        lat = {"p50": percentile(run.latency_s, 0.5) * 1e3, "p99": percentile(run.latency_s, 0.99) * 1e3}
        per_query_latency[name] = lat
        table.add_row(
            name, "live+archived" if la is not None else "live", f"{alerts[name]:,}", f"{len(run.received):,}",
            f"{la['archive_requests']:,}" if la is not None else "-", f"{lat['p50']:,.0f}", f"{lat['p99']:,.0f}",
        )
    console.print(table)
    latencies = [x for r in runs for x in r.latency_s]
    lat_ms = {"p50": percentile(latencies, 0.5) * 1e3, "p99": percentile(latencies, 0.99) * 1e3, "n": len(latencies)}
    rc = receiver.counts
    rate = len(live) / seconds["live"] if seconds["live"] > 0 else 0.0
    console.print(
        f"events: {len(events):,} ({len(archived):,} archived part, {len(live):,} live part); streams ended: "
        f"{', '.join(ended) or 'none'} (POST /event-types/{{name}}/end), "
        f"all through POST /events; archive requests: {sum(requests.values()):,} (SLLAA, T_L = {tolerance_s:g} s)"
    )
    console.print(
        f"webhook deliveries: {rc.received:,} received, {rc.verified:,} signature-verified alerts, "
        f"{rc.refused} refused, {rc.redelivered} redelivered; ingest-to-webhook latency p50 {lat_ms['p50']:,.0f} ms, "
        f"p99 {lat_ms['p99']:,.0f} ms"
    )
    console.print(
        f"time: service start {seconds['service_start']:.1f} s, archived part {seconds['archived']:.1f} s, "
        f"live part {seconds['live']:.1f} s ({rate:,.0f} events/s), finishing {seconds['finish']:.1f} s, "
        f"stop {seconds['stop']:.1f} s, total {seconds['total']:.1f} s"
    )
    return {
        "events": len(events),
        "archived": len(archived),
        "live": len(live),
        "ended": list(ended),
        "alerts": alerts,
        "delivered": {r.query.name: len(r.received) for r in runs},
        "received": {r.query.name: r.received for r in runs},
        "archive_requests": requests,
        "webhooks": {"received": rc.received, "verified": rc.verified, "refused": rc.refused,
                     "redelivered": rc.redelivered},
        "latency_ms": {**lat_ms, "queries": per_query_latency},
        "live_events_per_s": rate,
        "seconds": seconds,
    }
