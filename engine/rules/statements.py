"""Compiled statements of the kinds layered rules add (003), with the attributes every statement has.

Every compiled statement answers ``name``, ``stream_types`` (the event types it reads), ``window_us``
(its span: WITHIN or the window size; None when unbounded) and ``emit_into`` (its derived type or None),
as :class:`engine.compiler.CompiledQuery` and :class:`engine.live_archived.plan.LiveArchivedPlan` do, so
the service and the rule graph hold any statement without asking its kind.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from engine.lql import ast


class OneTypeStatement:
    """What a compiled statement over one event type answers from its syntax tree (``ast.name``, ``ast.type``,
    ``ast.emit_into``): shared by :class:`AggregateStatement` and
    :class:`engine.intervals.derive.IntervalStatement` (frozen dataclasses with ``ast`` and
    ``allowed_lateness_us``)."""

    __slots__ = ()
    ast: Any
    allowed_lateness_us: int
    reads_archive = False
    chooses_plan = False
    archive_key_attr = None
    read_by_ingest = False
    runs_alone = False
    patterns: ClassVar[tuple[Any, ...]] = ()
    """No pattern: no partial matches, no query limits (what every statement declares, see
    :attr:`engine.compiler.CompiledQuery.patterns`)."""

    @property
    def name(self) -> str | None:
        return self.ast.name

    @property
    def stream_types(self) -> frozenset[str]:
        return frozenset({self.ast.type})

    @property
    def emit_into(self) -> str | None:
        return self.ast.emit_into

    @property
    def state_span_us(self) -> int | None:
        """How far before its newest event its state may depend on events, int microseconds: its window (None:
        unbounded, a count window or an interval run). The detector contract's restart horizon
        (docs/architecture.md section 4)."""
        return self.window_us  # type: ignore[attr-defined]

    def lateness_us(self, allowed_lateness_us: int | dict[str, int] | None) -> int:
        """The allowed lateness of its type, int microseconds: ``allowed_lateness_us`` (one value, or one per
        event type) when given, else the statement's own."""
        lateness = self.allowed_lateness_us if allowed_lateness_us is None else allowed_lateness_us
        return lateness.get(self.ast.type, 0) if isinstance(lateness, dict) else lateness


@dataclass(frozen=True, slots=True)
class AggregateStatement(OneTypeStatement):
    """A compiled ``AGGREGATE ... WINDOW ...`` statement (continuous query, 003).

    ``make_detector()`` builds its :class:`engine.rules.windows.WindowedAggregate`; the statement itself
    holds no state.
    """

    ast: ast.AggregateQuery
    allowed_lateness_us: int = 0

    kind = "aggregate"
    """The statement kind the service records (``queries.kind``)."""

    backfills = False
    """It runs live only."""
    emits_intervals = False
    """Its derived events (EMIT INTO) are point events."""

    @property
    def window_us(self) -> int | None:
        w = self.ast.window
        return w.size if w.kind != "count" else None

    def make_detector(self, allowed_lateness_us: int | dict[str, int] | None = None) -> Any:
        """A new :class:`engine.rules.windows.WindowedAggregate` running this statement."""
        from engine.rules.windows import WindowedAggregate

        return WindowedAggregate(self.ast, allowed_lateness_us=self.lateness_us(allowed_lateness_us))


__all__ = ["AggregateStatement", "OneTypeStatement"]
