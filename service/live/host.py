"""What several parts of the live runtime read of it alike (docs/architecture.md section 1): the registered event
types, who emits derived types, event time, the ingest order, the archive, the rule graph, the running statements
and the recording of results. :class:`StreamState` is that common part; the ingest path (``IngestHost``), the warm
start (``WarmHost``) and the recovery (``RecoveryHost``) each add what only they need.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from engine.event_type import EventType
    from engine.rules.graph import RuleGraph
    from service.live.event_time import EventTime
    from service.live.ingest_order import IngestOrder
    from service.live.live_query import LiveQuery
    from service.live.results import Results


class StreamState(Protocol):
    """The runtime's stream state as its parts read it (:class:`~service.live.runtime.LiveRuntime` is one)."""

    @property
    def types(self) -> Mapping[str, EventType]:
        """The registered event types."""

    @property
    def emitters(self) -> Mapping[str, set[int]]:
        """Derived event type -> the queries that EMIT INTO it."""

    @property
    def event_time(self) -> EventTime:
        """Per event type: the newest ts accepted and its watermark."""

    @property
    def order(self) -> IngestOrder:
        """The durable ingest order (positions, checkpoints)."""

    @property
    def archive(self) -> Any:
        """The archive writer (``append``, ``buffer``, ``root``; None: no archive)."""

    @property
    def graph(self) -> RuleGraph:
        """The rule graph (FILTER rules, statements)."""

    @property
    def queries(self) -> Mapping[int, LiveQuery]:
        """The running statements, by id."""

    @property
    def results(self) -> Results:
        """Records results as alerts."""


__all__ = ["StreamState"]
