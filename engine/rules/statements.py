"""Compiled statements of the kinds layered rules add (003), with the attributes every statement has.

Every compiled statement answers ``name``, ``stream_types`` (the event types it reads), ``window_us``
(its span: WITHIN or the window size; None when unbounded) and ``emit_into`` (its derived type or None),
as :class:`engine.compiler.CompiledQuery` and :class:`engine.live_archived.plan.LiveArchivedPlan` do, so
the service and the rule graph hold any statement without asking its kind.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.lql import ast


@dataclass(frozen=True, slots=True)
class AggregateStatement:
    """A compiled ``AGGREGATE ... WINDOW ...`` statement (continuous query, 003).

    ``make_detector()`` builds its :class:`engine.rules.windows.WindowedAggregate`; the statement itself
    holds no state.
    """

    ast: ast.AggregateQuery
    allowed_lateness_us: int = 0

    @property
    def name(self) -> str | None:
        return self.ast.name

    @property
    def stream_types(self) -> frozenset[str]:
        return frozenset({self.ast.type})

    @property
    def window_us(self) -> int | None:
        w = self.ast.window
        return w.size if w.kind != "count" else None

    @property
    def emit_into(self) -> str | None:
        return self.ast.emit_into

    def make_detector(self, allowed_lateness_us: int | dict[str, int] | None = None) -> Any:
        """A new :class:`engine.rules.windows.WindowedAggregate` running this statement."""
        from engine.rules.windows import WindowedAggregate

        lateness = self.allowed_lateness_us if allowed_lateness_us is None else allowed_lateness_us
        if isinstance(lateness, dict):
            lateness = lateness.get(self.ast.type, 0)
        return WindowedAggregate(self.ast, allowed_lateness_us=lateness)


__all__ = ["AggregateStatement"]
