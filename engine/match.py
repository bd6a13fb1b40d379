"""Matches: complete instances of a pattern (the engine's output)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.events import Event


@dataclass(slots=True)
class Match:
    """One complex event found by a query.

    Attributes
    ----------
    query : str | None
        The query's NAME.
    events : dict[str, tuple[Event, ...]]
        Variable name -> the events bound to it, in (ts, id) order: one event for a
        single variable, one or more for a Kleene variable, none for a Kleene-star
        variable that matched nothing or a variable of an OR branch not taken.
        Negated variables never appear.
    start, end : int
        ts of the first and last event, int microseconds UTC.
    fields : dict[str, Any]
        The RETURN fields, by alias (empty when the query has no RETURN).
    """

    query: str | None
    events: dict[str, tuple[Event, ...]]
    start: int
    end: int
    fields: dict[str, Any] = field(default_factory=dict)

    def ids(self) -> dict[str, list[int]]:
        """Variable name -> event ids (the ``events`` object of ``lace match`` output)."""
        return {var: [e.id for e in evs] for var, evs in self.events.items()}

    def key(self) -> frozenset[tuple[str, tuple[int, ...]]]:
        """A hashable identity: the set of (variable, event ids) pairs with at least one event."""
        return frozenset((var, tuple(e.id for e in evs)) for var, evs in self.events.items() if evs)

    def to_json(self) -> dict[str, Any]:
        """The JSON object of DESIGN.md section 12: query, events (ids), start, end, fields."""
        return {
            "query": self.query,
            "events": self.ids(),
            "start": self.start,
            "end": self.end,
            "fields": self.fields,
        }
