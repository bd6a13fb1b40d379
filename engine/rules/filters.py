"""Filter rules (``FILTER Type v DROP DUPLICATE ... DROP WHEN ...``): the first layer of 003 (section 3.1).

A filter rule runs on validated events of its type before every other statement and before the
archive. :meth:`CompiledFilter.check` says whether an event is dropped and why; a dropped event is
counted per rule and never archived or matched.

Duplicates: an event is a duplicate when an earlier *kept* event of the rule's type has equal values
of every ``DROP DUPLICATE`` attribute (``ts`` included when named) and lies within ``WITHIN d`` of it in
event time (``|ts - kept.ts| <= d``). The rule keeps, per key, the event times of kept events not older
than ``watermark - d`` (:meth:`CompiledFilter.advance` forgets the older ones), so its state is bounded by
the events of the last ``d`` plus the allowed lateness. Timestamps are int microseconds UTC.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from engine.events import Event
from engine.lql import ast
from engine.lql.errors import QueryError
from engine.nfa.compiler import pick_attr
from engine.nfa.conditions import Fn, compile_bool


def single_event_resolver(var: str) -> Any:
    """A resolver for :func:`engine.nfa.conditions.compile_bool` over one event: ``f(event, None, None)``.

    Raises
    ------
    QueryError
        For a reference to another variable, an index or an aggregate (the checks refuse them first).
    """

    def resolve(ref: ast.AttrRef | ast.Aggregate) -> Fn:
        if isinstance(ref, ast.Aggregate) or ref.var != var or ref.index is not None:
            raise QueryError.at(ref.pos, f"only attributes of '{var}' can be used here")
        return pick_attr(0, ref.attr)  # the matcher's getter of the first argument (header fields too)

    return resolve


@dataclass(slots=True)
class CompiledFilter:
    """A compiled FILTER rule with its per-rule state and counters.

    Attributes
    ----------
    rule : FilterRule
        The validated syntax tree.
    name : str
        The rule's NAME (``filter`` when it has none).
    dropped_duplicate, dropped_when, kept : int
        Counters of the events checked.
    """

    rule: ast.FilterRule
    name: str = ""
    dropped_duplicate: int = 0
    dropped_when: int = 0
    kept: int = 0
    _when: Fn | None = None
    _seen: dict[Hashable, deque[int]] = field(default_factory=dict)
    _order: deque[tuple[int, Hashable]] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.name = self.rule.name or "filter"
        if self.rule.drop_when is not None:
            self._when = compile_bool(self.rule.drop_when, single_event_resolver(self.rule.var))

    kind = "filter"
    """The statement kind (``queries.kind``)."""
    reads_archive = False
    backfills = False
    """It runs live only (before the archive: what it drops is never archived)."""
    chooses_plan = False
    emits_intervals = False
    archive_key_attr = None
    read_by_ingest = True
    """The ingest path applies it to each event before the archive."""
    runs_alone = False
    patterns: ClassVar[tuple[Any, ...]] = ()
    """No pattern: no partial matches, no query limits."""

    @property
    def type(self) -> str:
        """The event type the rule reads."""
        return self.rule.type

    @property
    def stream_types(self) -> frozenset[str]:
        """The event types the rule reads (as on every compiled statement)."""
        return frozenset({self.rule.type})

    @property
    def window_us(self) -> int | None:
        """The duplicate window (DROP DUPLICATE ... WITHIN), int microseconds, or None."""
        return None if self.rule.duplicate is None else self.rule.duplicate.within_us

    @property
    def state_span_us(self) -> int:
        """How far back its state reaches, int microseconds: the duplicate window, 0 without one (a filter of
        single events keeps nothing)."""
        return self.window_us or 0

    @property
    def emit_into(self) -> None:
        """A filter never emits."""
        return None

    def _key(self, event: Event) -> Hashable:
        dup = self.rule.duplicate
        assert dup is not None
        return tuple(event.get(a) for a in dup.attrs)

    def check(self, event: Event) -> str | None:
        """None when ``event`` is kept (and remembered for duplicate detection), else the reason it is dropped.

        The reason names the rule: ``"dropped by filter clean_traffic: duplicate of (key, ts) within 1 h"``.
        """
        when = self._when
        if when is not None and when(event, None, None):
            self.dropped_when += 1
            return f"dropped by filter {self.name}: DROP WHEN {ast.expr_text(self.rule.drop_when)}"  # type: ignore[arg-type]
        dup = self.rule.duplicate
        if dup is not None:
            key = self._key(event)
            times = self._seen.get(key)
            if times is not None and any(abs(event.ts - t) <= dup.within_us for t in times):
                self.dropped_duplicate += 1
                return (
                    f"dropped by filter {self.name}: duplicate of ({', '.join(dup.attrs)}) within "
                    f"{ast.duration_text(dup.within_us)}"
                )
            if times is None:
                times = self._seen[key] = deque()
            times.append(event.ts)
            self._order.append((event.ts, key))
        self.kept += 1
        return None

    def advance(self, watermark_us: int) -> None:
        """Forget kept events older than ``watermark_us - WITHIN``: no later event can duplicate them."""
        dup = self.rule.duplicate
        if dup is None:
            return
        horizon = watermark_us - dup.within_us
        order, seen = self._order, self._seen
        while order and order[0][0] < horizon:
            ts, key = order.popleft()
            times = seen.get(key)
            if times is None:
                continue
            try:
                times.remove(ts)
            except ValueError:  # pragma: no cover - defensive
                pass
            if not times:
                del seen[key]

    def stats(self) -> dict[str, Any]:
        """Counters (JSON-ready): kept, dropped (by duplicate / by DROP WHEN), keys remembered."""
        return {
            "kept": self.kept,
            "dropped_duplicate": self.dropped_duplicate,
            "dropped_when": self.dropped_when,
            "dropped": self.dropped_duplicate + self.dropped_when,
            "duplicate_keys": len(self._seen),
        }


__all__ = ["CompiledFilter", "single_event_resolver"]
