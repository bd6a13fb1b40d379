"""Reading the values of bound events for compiled conditions and RETURN (docs/architecture.md section 7.5):
:func:`pick_attr`, the getter of one attribute from one argument of ``f(a, b, c)`` (the header fields ``ts``,
``id``, ``type``, ``ts_end`` and ``duration`` = ``ts_end - ts``, int microseconds, read directly; any other
attribute from ``attrs``, None when missing), and :func:`_aggregate`, a RETURN aggregate over a slot of the
binding (count, first, last, sum, avg, min, max, or an aggregate plug-in of issue 16).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from engine.events import attr_getter
from engine.lql.ast import Aggregate
from engine.nfa.conditions import Fn


def pick_attr(pos: int, attr: str) -> Fn:
    """Getter of ``attr`` from argument ``pos`` (0, 1 or 2) of ``f(a, b, c)``."""
    if attr == "ts":
        return (lambda a, b, c: a.ts, lambda a, b, c: b.ts, lambda a, b, c: c.ts)[pos]
    if attr == "id":
        return (lambda a, b, c: a.id, lambda a, b, c: b.id, lambda a, b, c: c.id)[pos]
    if attr == "type":
        return (lambda a, b, c: a.type, lambda a, b, c: b.type, lambda a, b, c: c.type)[pos]
    if attr == "ts_end":
        return (lambda a, b, c: a.ts_end, lambda a, b, c: b.ts_end, lambda a, b, c: c.ts_end)[pos]
    if attr == "duration":
        return (
            lambda a, b, c: a.ts_end - a.ts,
            lambda a, b, c: b.ts_end - b.ts,
            lambda a, b, c: c.ts_end - c.ts,
        )[pos]
    return (
        lambda a, b, c: a.attrs.get(attr),
        lambda a, b, c: b.attrs.get(attr),
        lambda a, b, c: c.attrs.get(attr),
    )[pos]


def _aggregate(agg: Aggregate, slot: int, kleene: bool) -> Fn:
    """RETURN aggregate over a Kleene slot ``env[slot]`` (a single variable counts as one element)."""
    get = attr_getter(agg.attr) if agg.attr else None
    func = agg.func
    if agg.plugin:  # an aggregate plug-in (issue 16)
        from engine.plugins.evaluate import group_aggregate

        fold, getp = group_aggregate(func), attr_getter(agg.attr or "")

        def plugin_aggregate(env: Any, i: int, x: Any) -> Any:
            bound: Any = env[slot] if slot < len(env) else ()
            return fold(map(getp, bound if kleene else (bound,)))

        return plugin_aggregate

    def aggregate(env: Any, i: int, x: Any) -> Any:
        bound: Any = env[slot] if slot < len(env) else ()
        return fold_events(func, get, bound if kleene else (bound,))

    return aggregate


def fold_events(func: str, get: Callable[[Any], Any] | None, seq: Sequence[Any]) -> Any:
    """A built-in RETURN aggregate (``count``, ``first``, ``last``, ``sum``, ``avg``, ``min``, ``max``) of
    ``get`` (an attribute getter; None for ``count``) over the events ``seq``. None when no event has the
    attribute (``first``/``last``: when the first/last one has none) or the values cannot be added or compared.
    The NFA's RETURN and a live-and-archived query's RETURN (:mod:`engine.live_archived.plan`) both fold here."""
    if func == "count":
        return len(seq)
    assert get is not None
    values = [v for v in map(get, seq) if v is not None]
    if not values:
        return None
    if func == "first":
        return get(seq[0])
    if func == "last":
        return get(seq[-1])
    try:
        if func == "sum":
            return sum(values)
        if func == "avg":
            return sum(values) / len(values)
        return min(values) if func == "min" else max(values)
    except TypeError:
        return None
