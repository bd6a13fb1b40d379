"""Evaluating aggregate plug-ins over a group of values (RETURN over a Kleene variable).

:func:`group_aggregate` folds values with the plug-in's ``init``/``add``/``value`` (paper-free: the
protocol of :class:`engine.plugins.api.AggregateProtocol`); windowed aggregates use ``remove`` too.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from engine.plugins.api import PluginError, value_has_type
from engine.plugins.registry import registry


def group_aggregate(name: str) -> Callable[[Iterable[Any]], Any]:
    """``fold(values) -> result`` for the aggregate plug-in ``name``.

    None values and values not of the declared ``arg_type`` are skipped (null rules); an empty group
    gives ``value(init())``.

    Raises
    ------
    KeyError
        When ``name`` is not a working aggregate plug-in (the query checks report it first).
    PluginError
        From ``fold``, when the plug-in raises or returns a value of another type than declared.
    """
    plugin = registry().get("aggregate", name)
    if plugin is None or plugin.error is not None:
        raise KeyError(name)
    agg, source = plugin.obj, plugin.source
    arg_type, returns = agg.arg_type, agg.returns

    def fold(values: Iterable[Any]) -> Any:
        try:
            state = agg.init()
            for v in values:
                if v is not None and value_has_type(v, arg_type):
                    state = agg.add(state, v)
            out = agg.value(state)
        except Exception as err:
            raise PluginError("aggregate", name, source, f"raised {type(err).__name__}: {err}") from err
        if out is not None and not value_has_type(out, returns):
            raise PluginError("aggregate", name, source, f"returned {type(out).__name__}, declared {returns}")
        return out

    return fold
