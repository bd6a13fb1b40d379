"""Matches: complete instances of a pattern (the engine's output)."""
from __future__ import annotations

from typing import Any

from engine.events import Event


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
    window_key : tuple | None
        A window result's identity within its bounds (an AGGREGATE binds no events):
        ``(group key values, (ts, id) of its first event, (ts, id) of its last event)``;
        None for a result that binds events. Derived event ids are made from it
        (:func:`engine.rules.derived.derived_event_id`); it is not part of equality.

    The engine builds ``events`` lazily from its binding (``layout`` + ``env``):
    most matches of a high-rate query are counted or serialized once.
    """

    __slots__ = ("query", "start", "end", "_fields", "_events", "_layout", "_env", "window_key")

    # defaults for the slot-state pickles written before __reduce__ (see engine.events.Event.__init__)
    def __init__(
        self,
        query: str | None = None,
        events: dict[str, tuple[Event, ...]] | None = None,
        start: int = 0,
        end: int = 0,
        fields: dict[str, Any] | None = None,
        layout: Any = None,
        env: tuple[Any, ...] | None = None,
        window_key: tuple[Any, ...] | None = None,
    ) -> None:
        self.query = query
        self.start = start
        self.end = end
        self._fields = fields
        self._events = events
        self._layout = layout
        self._env = env
        self.window_key = window_key

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its constructor's arguments (the binding as it is: ``events`` built or not), without the
        slot names the default repeats in every pickle; with :meth:`Event.__reduce__`, a three-event match is about
        60 % of the default's size and time (``lace stream``'s results table holds one pickle per match)."""
        return self.__class__, (
            self.query, self._events, self.start, self.end, self._fields, self._layout, self._env, self.window_key,
        )

    def __setstate__(self, state: Any) -> None:
        """Loads the slot-state pickles written before :meth:`__reduce__`: ``(None, {slot: value})``."""
        for name, value in state[1].items():
            setattr(self, name, value)

    @property
    def fields(self) -> dict[str, Any]:
        if self._fields is None:
            self._fields = {}
        return self._fields

    @property
    def events(self) -> dict[str, tuple[Event, ...]]:
        if self._events is None:
            variables, slot_vars, kleene = self._layout
            events: dict[str, tuple[Event, ...]] = dict.fromkeys(variables, ())
            for var, k, bound in zip(slot_vars, kleene, self._env):  # type: ignore[arg-type]
                events[var] = bound if k else (bound,)
            self._events = events
        return self._events

    def first_event(self) -> Event | None:
        """The first event bound, slot by slot, without building :attr:`events` (None: no event): the event of a
        match of a one-event pattern (:func:`engine.lql.pattern_checks.single_event_var`)."""
        if self._events is not None:
            for evs in self._events.values():
                if evs:
                    return evs[0]
            return None
        _, _, kleene = self._layout
        for k, bound in zip(kleene, self._env):  # type: ignore[arg-type]
            if not k:
                if bound is not None:
                    return bound
            elif bound:
                return bound[0]
        return None

    def ids(self) -> dict[str, list[int]]:
        """Variable name -> event ids (the ``events`` object of ``lace match`` output)."""
        return {var: [e.id for e in evs] for var, evs in self.events.items()}

    def key(self) -> frozenset[tuple[str, tuple[int, ...]]]:
        """A hashable identity: the set of (variable, event ids) pairs with at least one event."""
        return frozenset((var, tuple(e.id for e in evs)) for var, evs in self.events.items() if evs)

    def to_json(self) -> dict[str, Any]:
        """The JSON object of docs/architecture.md section 7.12: query, events (ids), start, end, fields."""
        return {
            "query": self.query,
            "events": self.ids(),
            "start": self.start,
            "end": self.end,
            "fields": self.fields,
        }

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Match)
            and self.query == other.query
            and self.start == other.start
            and self.end == other.end
            and self.events == other.events
            and self.fields == other.fields
        )

    def __repr__(self) -> str:
        return (
            f"Match(query={self.query!r}, events={self.ids()!r}, start={self.start}, end={self.end}, "
            f"fields={self.fields!r})"
        )
