"""Counters of a live-and-archived run (docs/architecture.md section 7.7).

Every algorithm reports the same counters, so runs compare like for like: archive requests,
archived events scanned, archived instances found, join pairs tried, results, wall time, and the
response delay of every result (result emitted minus live instance completed), in event time
(int microseconds) and in wall time (seconds).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def quantile(xs: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of the sorted, non-empty ``xs``, interpolated linearly between ranks.

    >>> quantile([1, 2, 3, 4], 0.5), quantile([10], 0.99)
    (2.5, 10.0)
    """
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary(values: list[float]) -> dict[str, float]:
    """``n``, ``mean``, ``p50``, ``p95``, ``max`` of ``values`` (all 0 when empty).

    >>> s = summary([1, 2, 3, 4])
    >>> s["n"], s["mean"], s["p50"], s["max"]
    (4, 2.5, 2.5, 4)
    """
    if not values:
        return {"n": 0, "mean": 0, "p50": 0, "p95": 0, "max": 0}
    xs = sorted(values)
    return {"n": len(xs), "mean": sum(xs) / len(xs), "p50": quantile(xs, 0.5), "p95": quantile(xs, 0.95), "max": xs[-1]}


@dataclass(slots=True)
class RunCounters:
    """What one run of an algorithm did.

    Attributes
    ----------
    algorithm : str
        ``alaa``, ``llaa``, ``ollaa`` or ``sllaa``.
    live_events : int
        Events offered to the run (the live stream).
    live_instances : int
        Matches of ``P_L`` (complete live instances).
    archive_requests : int
        Archive requests (one extractor call each; statistics not included).
    stat_requests : int
        Statistics requests (OLLAA's counts and selectivity estimates).
    archived_events_scanned : int
        Events the archive requests returned.
    archived_instances : int
        Matches of ``P_A`` found over what was scanned (an instance found by two requests counts twice).
    join_pairs_tried : int
        (live, archived) pairs whose JOIN was evaluated (SLLAA's hash join on JOIN's equalities tries only the pairs
        whose values are equal).
    results : int
        Results emitted: joined pairs, or live instances in the grouped form (one per live instance
        that joins something, :attr:`engine.live_archived.plan.LiveArchivedPlan.grouped`).
    wall_s : float
        Wall time from the first event to the end of :meth:`flush`, seconds.
    """

    algorithm: str
    live_events: int = 0
    live_instances: int = 0
    archive_requests: int = 0
    stat_requests: int = 0
    archived_events_scanned: int = 0
    archived_instances: int = 0
    join_pairs_tried: int = 0
    results: int = 0
    wall_s: float = 0.0
    delay_event_us: list[int] = field(default_factory=list)
    delay_wall_s: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The counters as JSON-ready values; delays as :func:`summary` dicts."""
        out: dict[str, Any] = {
            name: getattr(self, name)
            for name in (
                "algorithm",
                "live_events",
                "live_instances",
                "archive_requests",
                "stat_requests",
                "archived_events_scanned",
                "archived_instances",
                "join_pairs_tried",
                "results",
            )
        }
        out["wall_s"] = round(self.wall_s, 6)
        out["delay_event_us"] = summary([float(d) for d in self.delay_event_us])
        wall = summary(self.delay_wall_s)
        out["delay_wall_s"] = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in wall.items()}
        return out
