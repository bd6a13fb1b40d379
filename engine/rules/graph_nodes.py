"""The nodes of the rule graph (:mod:`engine.rules.graph`; 003 sections 3 and 4, docs/architecture.md section
7.9): a non-filter statement with its detector (:class:`engine.detector.Detector`), the event types it reads,
the derived type it emits into (``EMIT INTO``), its inbox and its input watermark.

A node's *output watermark* bounds the ts of every derived event it may still emit: its detector's
``output_watermark(w)`` when it has one (a window operator), else the watermark it consumed, less its window
when the pattern has a negation (whose matches are emitted when the window closes). Timestamps are int
microseconds UTC; :data:`NEVER` is the watermark before any event, :data:`END_OF_TIME` the one after the last.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.compiler import CompiledQuery
from engine.events import END_OF_TIME, Event
from engine.lql import ast
from engine.rules.filters import CompiledFilter

NEVER = -(1 << 63)
"""The watermark before any event: nothing is known to be complete."""

Factory = Callable[[Any], Any]
"""Compiled statement -> its detector (``push``/``advance``/``flush``/``stats``/``next_deadline``)."""


def default_factory(statement: Any, allowed_lateness_us: int = 0) -> Any:
    """The detector of a compiled statement: a Matcher for a pattern query, a WindowedAggregate for an
    AGGREGATE statement, ``statement.make_detector()`` for other kinds that provide it.

    Raises
    ------
    TypeError
        For a statement kind that has no detector here (a live-and-archived plan needs an archive:
        the service runs it).
    """
    if isinstance(statement, CompiledQuery):
        from engine.matcher import Matcher

        return Matcher(statement, allowed_lateness_us=allowed_lateness_us)
    make = getattr(statement, "make_detector", None)
    if callable(make):
        return make(allowed_lateness_us)
    raise TypeError(f"no detector for a statement of kind {type(statement).__name__} in a rule graph")


def statement_ast(statement: Any) -> Any:
    """The syntax tree of a compiled statement (CompiledQuery.ast, CompiledFilter.rule, or itself)."""
    if isinstance(statement, CompiledFilter):
        return statement.rule
    return getattr(statement, "ast", statement)


@dataclass(slots=True, eq=False)
class Node:
    """One non-filter statement of the graph with its detector and its place in the flow.

    ``reads``: the event types it reads; ``emit_into``: its derived type (None: it ends in results);
    ``buffered``: whether its input goes through the (ts, id)-ordered inbox (it reads a derived type);
    ``consumed``: the input watermark it has been advanced to; ``identity`` and ``version``: what its derived
    events' ids are made from (:func:`engine.rules.derived.derived_event_id`).
    """

    name: str
    statement: Any
    detector: Any
    reads: frozenset[str]
    emit_into: str | None
    identity: str = ""
    version: int = 1
    negation_slack_us: int = 0
    buffered: bool = False
    consumed: int = NEVER
    inbox: list[tuple[int, int, int, Event]] = field(default_factory=list)
    results: int = 0
    cpu_s: float = 0.0
    failed: str | None = None
    """Why the node stopped: a plug-in its statement names misbehaved (issue 16); it gets no more events."""

    def output_watermark(self) -> int:
        """A bound below the ts of every derived event this node may still emit."""
        out_wm = getattr(self.detector, "output_watermark", None)
        if callable(out_wm):
            return int(out_wm(self.consumed))
        return self.consumed - self.negation_slack_us if self.consumed > NEVER else NEVER


def _negation_slack(statement: Any) -> int:
    if isinstance(statement, CompiledQuery):
        has_neg = any(c.kind == "neg" for c in ast.components(statement.ast.pattern))
        if has_neg:
            return statement.window_us if statement.window_us is not None else END_OF_TIME // 2
    return 0


def _timed(node: Node) -> bool:
    """Whether a node's detector acts on time (windows, interval derivation): it is advanced as the watermark moves."""
    return not isinstance(node.statement, CompiledQuery) or node.negation_slack_us > 0
