"""What one AGGREGATE statement needs from each event, and how merged partials become its results: the
evaluation plan of the window operator (:mod:`engine.rules.windows`; 003 section 3.3, docs/semantics.md
section 8).

:class:`_Partial` is the partial aggregate of one group over some events (a pane, or a merged window): the
count, the first and last event by (ts, id) with the values ``first``/``last`` read from them, one
:class:`~engine.rules.window_accumulators._Acc` per attribute of ``sum``/``avg``/``min``/``max``, and the
(ts, id, value) of each non-None value of an aggregate plug-in (issue 16: no merge in its protocol, folded in
(ts, id) order at firing). :class:`_Plan` adds an event to a partial, merges partials and turns a merged one
into a :class:`~engine.match.Match` (RETURN fields plus ``window_end``; None when HAVING rejects it).
Timestamps are int microseconds UTC.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.events import Event
from engine.lql import ast
from engine.match import Match
from engine.nfa.conditions import Fn, compile_bool, compile_value
from engine.rules.derived import WINDOW_END
from engine.rules.window_accumulators import _Acc, _merge_accs

_HEADER = ("ts", "id", "type")
_FAR_FUTURE = (1 << 63) - 1


def _getter(attr: str) -> Callable[[Event], Any]:
    if attr in _HEADER:
        return lambda e: e.get(attr)
    return lambda e: e.attrs.get(attr)


class _Partial:
    """Partial aggregates of one group over some events: count, first/last by (ts, id), per-attribute _Acc."""

    __slots__ = ("count", "first", "first_vals", "last", "last_vals", "accs", "pvals")

    def __init__(self, orders: tuple[bool, ...], n_plugin: int = 0) -> None:
        self.count = 0
        self.first: tuple[int, int] = (_FAR_FUTURE, 0)
        self.first_vals: tuple[Any, ...] = ()
        self.last: tuple[int, int] = (-_FAR_FUTURE, 0)
        self.last_vals: tuple[Any, ...] = ()
        self.accs = [_Acc(o) for o in orders]
        # aggregate plug-ins (no merge in their protocol): the (ts, id, value) of each non-None value
        self.pvals: list[list[tuple[int, int, Any]]] = [[] for _ in range(n_plugin)]


class _Plan:
    """What the query needs from each event and how a merged partial becomes a result."""

    def __init__(self, query: ast.AggregateQuery) -> None:
        aggs: list[ast.Aggregate] = []
        for expr in [item.expr for item in query.returns] + ([query.having] if query.having is not None else []):
            _collect(expr, aggs)
        acc_attrs: list[str] = []  # attributes of sum/avg/min/max
        edge_attrs: list[str] = []  # attributes of first/last
        keys: list[tuple[str, str | None]] = []
        plugin_attrs: list[str] = []  # attributes of aggregate plug-ins
        plugin_funcs: set[str] = set()
        for a in aggs:
            k = (a.func, a.attr if a.func != "count" or a.plugin else None)
            if k in keys:
                continue
            keys.append(k)
            if a.plugin:
                plugin_funcs.add(a.func)
                if a.attr not in plugin_attrs:
                    plugin_attrs.append(a.attr or "")
                continue
            if a.func in ("sum", "avg", "min", "max") and a.attr not in acc_attrs:
                acc_attrs.append(a.attr)  # type: ignore[arg-type]
            if a.func in ("first", "last") and a.attr not in edge_attrs:
                edge_attrs.append(a.attr)  # type: ignore[arg-type]
        self.agg_keys = keys
        self.acc_getters = [_getter(a) for a in acc_attrs]
        self.orders = tuple(any(f in ("min", "max") and a == attr for f, a in keys) for attr in acc_attrs)
        self.plugin_getters = [_getter(a) for a in plugin_attrs]
        self.n_plugin = len(plugin_attrs)
        self.edge_getters = [_getter(a) for a in edge_attrs]
        self.need_edges = bool(edge_attrs)
        # value of each aggregate from a merged partial
        self.value_fns: list[Callable[[_Partial], Any]] = []
        for func, attr in keys:
            if func in plugin_funcs:
                self.value_fns.append(_plugin_value_fn(func, plugin_attrs.index(attr or "")))
            else:
                self.value_fns.append(_value_fn(func, attr, acc_attrs, edge_attrs))
        group_by = query.group_by
        var = query.var

        def resolve(ref: ast.AttrRef | ast.Aggregate) -> Fn:
            if isinstance(ref, ast.Aggregate):
                i = keys.index((ref.func, ref.attr if ref.func != "count" or ref.plugin else None))
                return lambda a, b, c: a[i]
            assert ref.var == var and ref.attr in group_by  # the checks refuse the rest
            j = group_by.index(ref.attr)
            return lambda a, b, c: b[j]

        self.having = compile_bool(query.having, resolve) if query.having is not None else None
        self.returns = [(item.alias, compile_value(item.expr, resolve)) for item in query.returns]

    def add(self, p: _Partial, e: Event) -> None:
        p.count += 1
        k = (e.ts, e.id)
        if self.need_edges:
            if k < p.first:
                p.first = k
                p.first_vals = tuple(g(e) for g in self.edge_getters)
            if k > p.last:
                p.last = k
                p.last_vals = tuple(g(e) for g in self.edge_getters)
        else:
            if k < p.first:
                p.first = k
            if k > p.last:
                p.last = k
        for acc, g in zip(p.accs, self.acc_getters):
            acc.add(g(e))
        if self.n_plugin:
            for vals, g in zip(p.pvals, self.plugin_getters):
                v = g(e)
                if v is not None:
                    vals.append((e.ts, e.id, v))

    def merge(self, parts: list[_Partial]) -> _Partial:
        if len(parts) == 1:
            return parts[0]
        out = _Partial(())
        count = 0
        first = last = parts[0]
        for p in parts:
            count += p.count
            if p.first < first.first:
                first = p
            if p.last > last.last:
                last = p
        out.count = count
        out.first, out.first_vals = first.first, first.first_vals
        out.last, out.last_vals = last.last, last.last_vals
        out.accs = [_merge_accs([p.accs[j] for p in parts], order) for j, order in enumerate(self.orders)]
        out.pvals = [[x for p in parts for x in p.pvals[j]] for j in range(self.n_plugin)]
        return out

    def result(self, name: str | None, p: _Partial, key: tuple[Any, ...], start: int, end: int) -> Match | None:
        values = [f(p) for f in self.value_fns]
        if self.having is not None and not self.having(values, key, None):
            return None
        fields = {alias: fn(values, key, None) for alias, fn in self.returns}
        fields[WINDOW_END] = end
        return Match(name, {}, start, end, fields, window_key=(key, p.first, p.last))


def _collect(expr: ast.Expr, out: list[ast.Aggregate]) -> None:
    if isinstance(expr, ast.Aggregate):
        out.append(expr)
        return
    for name in ("left", "right", "operand"):
        sub = getattr(expr, name, None)
        if sub is not None:
            _collect(sub, out)
    for sub in (getattr(expr, "operands", ()) or ()) + (getattr(expr, "args", ()) or ()):
        _collect(sub, out)


def _plugin_value_fn(func: str, j: int) -> Callable[[_Partial], Any]:
    """An aggregate plug-in (issue 16) folded with init/add/value over the window's values in (ts, id) order."""
    from engine.plugins.evaluate import group_aggregate

    fold = group_aggregate(func)
    return lambda p: fold(v for _, _, v in sorted(p.pvals[j], key=lambda x: (x[0], x[1])))


def _value_fn(func: str, attr: str | None, acc_attrs: list[str], edge_attrs: list[str]) -> Callable[[_Partial], Any]:
    if func == "count":
        return lambda p: p.count
    if func in ("first", "last"):
        j = edge_attrs.index(attr)  # type: ignore[arg-type]
        if func == "first":
            return lambda p: p.first_vals[j] if p.first_vals else None
        return lambda p: p.last_vals[j] if p.last_vals else None
    i = acc_attrs.index(attr)  # type: ignore[arg-type]
    if func == "sum":
        return lambda p: p.accs[i].total()
    if func == "avg":
        return lambda p: p.accs[i].mean()
    if func == "min":
        return lambda p: None if p.accs[i].unordered else p.accs[i].mn
    return lambda p: None if p.accs[i].unordered else p.accs[i].mx
