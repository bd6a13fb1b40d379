"""Where the window operator (:mod:`engine.rules.windows`) keeps complete panes: the Two-Stacks FIFO
aggregator of one group's panes (sliding windows of many panes) and a COUNT window's per-group state
(003 section 5; docs/semantics.md section 8). Panes hold :class:`~engine.rules.window_plan._Partial`
aggregates, merged with the query's :class:`~engine.rules.window_plan._Plan`.
"""
from __future__ import annotations

from typing import Any

from engine.rules.window_plan import _Partial, _Plan


class _TwoStacks:
    """FIFO aggregation of one group's complete pane partials (Two-Stacks: Tangwongsan, Hirzel, Schneider,
    "Sliding-window aggregation algorithms", Encyclopedia of Big Data Technologies, 2019): ``query`` merges
    two partials and each pane is merged about twice in all, instead of ``d / gcd`` merges per window.

    ``back``: panes pushed since the last flip, with ``back_agg`` their merge; ``front``: older panes as a
    stack (oldest last), each with the merge of itself and every newer pane of the front.
    """

    __slots__ = ("front", "back", "back_agg")

    def __init__(self) -> None:
        self.front: list[tuple[int, _Partial]] = []
        self.back: list[tuple[int, _Partial]] = []
        self.back_agg: _Partial | None = None

    def push(self, p: int, part: _Partial, plan: _Plan) -> None:
        self.back.append((p, part))
        self.back_agg = part if self.back_agg is None else plan.merge([self.back_agg, part])

    def evict(self, lo: int, plan: _Plan) -> None:
        """Drop the panes with index < ``lo``."""
        while True:
            if not self.front:
                if not self.back or self.back[0][0] >= lo:
                    return
                agg: _Partial | None = None
                for p, part in reversed(self.back):
                    agg = part if agg is None else plan.merge([part, agg])
                    self.front.append((p, agg))
                self.back = []
                self.back_agg = None
            if self.front[-1][0] >= lo:
                return
            self.front.pop()

    def query(self, plan: _Plan) -> _Partial | None:
        a = self.front[-1][1] if self.front else None
        b = self.back_agg
        if a is None or b is None:
            return a if b is None else b
        return plan.merge([a, b])


class _CountGroup:
    """One group's state under a COUNT window: its next position and the partials of its open panes."""

    __slots__ = ("key", "serial", "pos", "panes", "starts", "stacks")

    def __init__(self, key: tuple[Any, ...], serial: int, stacks: bool) -> None:
        self.key = key
        self.serial = serial
        self.pos = 0  # events of the group placed so far (final positions)
        self.panes: dict[int, _Partial] = {}  # panes still filling (all open panes without stacks)
        self.starts: dict[int, int] = {}  # open window k -> ts of its first event
        self.stacks = _TwoStacks() if stacks else None  # complete panes (windows of many panes)
