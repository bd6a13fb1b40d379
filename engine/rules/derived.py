"""Derived streams (``EMIT INTO T``): the schema of a derived event type and the events a statement emits.

003 section 3 (the capture and continuous-query layers feed later layers through derived streams);
docs/architecture.md section 7.9. A statement's results become events of type ``T``:

- a pattern (or live-and-archived) statement: ts = the match's end (the event that completed it),
  attributes = its RETURN fields;
- an ``AGGREGATE`` statement: ts = the window start, attributes = the RETURN fields and ``window_end``
  (the window's exclusive end, int microseconds);
- an interval statement (``INTERVAL``, 002): ts = the interval start, ts_end = its end.

**Ids** (issue 24): a derived event's id is a function of what made it, :func:`derived_event_id`: the emitting
statement's identity and version and the identity of the result (the ids of its input events; for a window result,
its bounds, its group and its first and last events). A restart that replays the same input through the same
statement derives the same events under the same ids, so everything downstream (a reader's alerts, de-duplicated by
(query, event ids)) recognises them. The ids are 62-bit hashes with bit 62 set, ``[2^62, 2^63)``
(:data:`DERIVED_ID_MIN`): ingested events have ids below 2^62 (the service refuses a producer id from 2^62 on and
numbers the others from the wall clock in microseconds, about 2^51), so the two never meet. Two different results
get the same id with probability about n^2 / 2^63 for n results (a 64-bit hash truncated to 62 bits).

Timestamps are int microseconds UTC.
"""
from __future__ import annotations

import hashlib
from typing import Any

import orjson

from engine.events import Event
from engine.lql import ast
from engine.lql.checks import VarInfo, declared_vars, infer_type
from engine.lql.errors import QueryError
from engine.match import Match

WINDOW_END = "window_end"
"""The attribute every window result carries: the window's exclusive end (int microseconds UTC)."""

DERIVED_ID_MIN = 1 << 62
"""The smallest id of a derived event (bit 62 set); every ingested event's id is below it."""
_HASH_MASK = DERIVED_ID_MIN - 1

_SCHEMA_OF = {"duration": "int", "number": "float", None: "float"}


def _scope(query: Any) -> dict[str, VarInfo]:
    if isinstance(query, ast.PatternQuery):
        return declared_vars(query.pattern)
    if isinstance(query, ast.LiveArchivedQuery):
        return {**declared_vars(query.live.pattern), **declared_vars(query.archived.pattern)}
    if isinstance(query, ast.AggregateQuery):
        return {query.var: VarInfo(query.var, "kleene", {query.type}, query.pos)}
    var, type_name = getattr(query, "var", None), getattr(query, "type", None)
    if isinstance(var, str) and isinstance(type_name, str):  # INTERVAL (002): the run's events, as a group
        return {var: VarInfo(var, "kleene", {type_name}, query.pos)}
    return {}


def derived_schema(query: Any, schemas: ast.Schema | None) -> dict[str, str]:
    """The attributes of the event type a statement emits into: {RETURN alias -> type name}.

    Types are those of :func:`engine.lql.checks.infer_type` (a number of unknown kind is ``float``,
    a duration ``int``); window results add ``window_end`` (timestamp).

    Raises
    ------
    QueryError
        When the statement has EMIT INTO but no RETURN (a derived event needs attributes).
    """
    returns: tuple[ast.ReturnItem, ...] = getattr(query, "returns", ())
    if not returns:
        raise QueryError.at(
            query.pos, f"EMIT INTO {query.emit_into} needs a RETURN clause (its fields are the derived attributes)"
        )
    scope = _scope(query)
    out: dict[str, str] = {}
    for item in returns:
        expr = item.expr
        if isinstance(query, ast.AggregateQuery) and isinstance(expr, ast.AttrRef):
            scope_single = {query.var: VarInfo(query.var, "single", {query.type}, query.pos)}
            t = infer_type(expr, scope_single, schemas)
        else:
            try:
                t = infer_type(expr, scope, schemas)
            except QueryError:
                t = None
        out[item.alias] = _SCHEMA_OF.get(t, t) if t not in ("int", "float", "string", "bool", "timestamp") else t  # type: ignore[assignment]
    if isinstance(query, ast.AggregateQuery):
        out[WINDOW_END] = "timestamp"
    return out


def emits_at_start(query: Any) -> bool:
    """Whether the statement's derived events are stamped with the result's start (windows, intervals)."""
    return not isinstance(query, (ast.PatternQuery, ast.LiveArchivedQuery))


def derived_event_id(statement: str, version: int, match: Match) -> int:
    """The id of the event that ``match`` becomes: a pure function of its inputs (module docstring, "Ids").

    Parameters
    ----------
    statement : str
        The emitting statement's identity, stable across restarts (the service: its query id; ``lace match``:
        its NAME).
    version : int
        The statement's version (a changed statement derives other events).
    match : Match
        The result: its variable -> input event ids (``match.ids()``), ``start``/``end`` (int microseconds), and
        for a window result, which binds no event, ``match.window_key`` (its group and the (ts, id) of its first
        and last events): two groups of one window, or two count windows with the same bounds, differ there.

    Returns
    -------
    int
        In ``[2^62, 2^63)`` (:data:`DERIVED_ID_MIN` set, 62 bits of BLAKE2b): the same for the same arguments in
        every process.

    >>> m = Match("hi", {"x": (Event(7, "s", 5, {}),)}, 5, 5)
    >>> i = derived_event_id("1", 1, m)
    >>> i == derived_event_id("1", 1, m) and i >= DERIVED_ID_MIN and i != derived_event_id("1", 2, m)
    True
    """
    ids = sorted((var, ev) for var, ev in match.ids().items() if ev)
    body = orjson.dumps(
        [statement, version, match.start, match.end, ids, match.window_key],
        option=orjson.OPT_NON_STR_KEYS,
        default=repr,  # a group value orjson does not know (a plug-in's): its repr, the same in every process
    )
    h = int.from_bytes(hashlib.blake2b(body, digest_size=8).digest(), "big")
    return DERIVED_ID_MIN | (h & _HASH_MASK)


def derived_event(query: Any, match: Match, event_id: int) -> Event:
    """The event of type ``query.emit_into`` that ``match`` (a result of ``query``) becomes.

    Parameters
    ----------
    query : statement syntax tree with ``emit_into`` set
    match : Match
        One result: ``start``/``end`` int microseconds, ``fields`` the RETURN fields.
    event_id : int
        The new event's id (:func:`derived_event_id` in a rule graph).
    """
    assert query.emit_into is not None
    ts = match.start if emits_at_start(query) else match.end
    end = match.end if isinstance(query, ast.IntervalRule) else None  # interval events (002, issue 15)
    return Event(event_id, query.emit_into, ts, dict(match.fields), end)


__all__ = [
    "DERIVED_ID_MIN",
    "WINDOW_END",
    "derived_event",
    "derived_event_id",
    "derived_schema",
    "emits_at_start",
]
