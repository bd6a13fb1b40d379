"""An archived pattern's single-event conditions as an Arrow filter (issue 25, cheaper jobs).

A live-and-archived query's archived side is most often one event: ``SEQ(traffic c) WHERE c.vehicle_count > 0
AND c.avg_speed < 0.5 * c.ndt_kmh``. Its WHERE then decides alone which archived events can be matches, so the
rows that fail it need never become :class:`engine.events.Event` objects. :func:`single_event_filter` turns
what it can of that WHERE into a ``pyarrow.compute`` expression over the extractor's output-shaped rows
(attributes by name, timestamps as int microseconds); the matcher still evaluates the whole WHERE on the rows
that pass.

The filter keeps **at least** every row the engine's conditions accept (``engine.nfa.conditions``: a missing
value or a type error makes a comparison false, arithmetic with a missing value is missing): comparisons of
attributes and literals of the same kind, arithmetic, ``AND`` and ``OR``. A conjunct it cannot translate
exactly (functions, ``NOT``, comparisons across kinds, booleans used bare) is left out, which only keeps more
rows. Comparisons over arithmetic or between an int and a float are evaluated in float64 with a relative
margin of :data:`MARGIN` (the engine computes on Python ints and floats), so rounding never drops a row.

Patterns of more than one event, negations, Kleene closures or operators give no filter (None): which of
their events matter depends on the others.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from engine.lql.ast import AttrRef, BinOp, BoolOp, Compare, Expr, Literal, Neg, PatternQuery
from engine.lql.pattern_checks import single_event_var

if TYPE_CHECKING:
    from engine.event_type import EventType

MARGIN = 1e-9  # relative slack of approximate (float64) comparisons
_TS_ATTRS = {"ts": "int", "id": "int"}  # columns of every output row besides the attributes


@dataclass(frozen=True, slots=True)
class _Value:
    expr: pc.Expression
    kind: str  # "int" | "float" | "str" | "bool"
    exact: bool  # no arithmetic: compared as stored, no float64 rounding


def single_event_filter(query: PatternQuery, types: Sequence[EventType]) -> pc.Expression | None:
    """The pushable part of a one-event archived pattern's WHERE over ``types`` (None: no filter).

    Parameters
    ----------
    query : PatternQuery
        The archived side (``LiveArchivedQuery.archived``, or a compiled query's ``ast``).
    types : sequence of EventType
        The types the pattern's events come from (their attributes give each column's kind).
    """
    var = single_event_var(query)
    if var is None or query.where is None:
        return None
    kinds = _attribute_kinds(types)
    parts = [p for p in (_bool(c, var, kinds) for c in _conjuncts(query.where)) if p is not None]
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out = out & p
    return out


def apply_filter(table: pa.Table, where: pc.Expression | None) -> pa.Table:
    """``table``'s rows that pass ``where`` (all of them for None)."""
    return table if where is None or table.num_rows == 0 else table.filter(where)


def _attribute_kinds(types: Iterable[EventType]) -> dict[str, str]:
    kinds: dict[str, str] = dict(_TS_ATTRS)
    for t in types:
        for attr, kind in t.attributes.items():
            k = "int" if kind == "timestamp" else kind
            if kinds.setdefault(attr, k) != k:
                kinds[attr] = "mixed"
    return kinds


def _conjuncts(expr: Expr) -> list[Expr]:
    if isinstance(expr, BoolOp) and expr.op == "and":
        return [c for operand in expr.operands for c in _conjuncts(operand)]
    return [expr]


def _bool(expr: Expr, var: str, kinds: dict[str, str]) -> pc.Expression | None:
    """A filter true wherever the engine's ``expr`` is (None: not translatable)."""
    if isinstance(expr, BoolOp):
        parts = [_bool(e, var, kinds) for e in expr.operands]
        if expr.op == "and":
            kept = [p for p in parts if p is not None]  # an untranslated conjunct keeps every row
            if not kept:
                return None
        elif any(p is None for p in parts):
            return None  # an untranslated disjunct could hold anywhere
        else:
            kept = [p for p in parts if p is not None]
        out = kept[0]
        for p in kept[1:]:
            out = (out & p) if expr.op == "and" else (out | p)
        return out
    if isinstance(expr, Compare):
        return _compare(expr, var, kinds)
    return None


def _compare(expr: Compare, var: str, kinds: dict[str, str]) -> pc.Expression | None:
    left, right = _value(expr.left, var, kinds), _value(expr.right, var, kinds)
    if left is None or right is None:
        return None
    numeric = {left.kind, right.kind} <= {"int", "float"}
    if not numeric and left.kind != right.kind:
        return None  # the engine's comparison across kinds: not translated
    if left.kind == "bool" and expr.op not in ("=", "!="):
        return None
    exact = left.exact and right.exact and (not numeric or left.kind == right.kind)
    op = expr.op
    if exact:
        x, y = left.expr, right.expr
        out = {
            "=": x == y, "!=": x != y, "<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y,
        }[op]
        return pc.coalesce(out, pc.scalar(False))  # a missing value: the engine's comparison is false
    if op == "!=":
        return None  # approximately equal values may differ exactly
    x, y = left.expr.cast(pa.float64(), safe=False), right.expr.cast(pa.float64(), safe=False)
    slack = (pc.abs(x) + pc.abs(y)) * MARGIN
    out = {
        "=": pc.abs(x - y) <= slack,
        "<": x < y + slack,
        "<=": x <= y + slack,
        ">": x + slack > y,
        ">=": x + slack >= y,
    }[op]
    # a side float64 cannot hold (an overflow the engine's Python ints do not have) keeps the row; a missing
    # side (null: a missing attribute, a division by zero) drops it, as the engine's comparison is false
    out = out | pc.invert(pc.is_finite(x)) | pc.invert(pc.is_finite(y))
    return pc.coalesce(out, pc.scalar(False))


def _value(expr: Expr, var: str, kinds: dict[str, str]) -> _Value | None:
    if isinstance(expr, Literal):
        v = expr.value
        if isinstance(v, bool):
            return _Value(pc.scalar(v), "bool", True)
        if isinstance(v, int):
            if abs(v) >= 1 << 63:
                return None
            return _Value(pc.scalar(pa.scalar(v, pa.int64())), "int", True)
        if isinstance(v, float):
            return _Value(pc.scalar(v), "float", True)
        if isinstance(v, str):
            return _Value(pc.scalar(v), "str", True)
        return None
    if isinstance(expr, AttrRef):
        kind = kinds.get(expr.attr)
        if expr.var != var or expr.index is not None or kind not in ("int", "float", "str", "bool", "string"):
            return None
        return _Value(pc.field(expr.attr), "str" if kind == "string" else str(kind), True)
    if isinstance(expr, Neg):
        inner = _value(expr.operand, var, kinds)
        if inner is None or inner.kind not in ("int", "float"):
            return None
        return _Value(pc.negate(inner.expr.cast(pa.float64(), safe=False)), "float", False)
    if isinstance(expr, BinOp):
        left, right = _value(expr.left, var, kinds), _value(expr.right, var, kinds)
        if left is None or right is None or {left.kind, right.kind} - {"int", "float"}:
            return None
        x, y = left.expr.cast(pa.float64(), safe=False), right.expr.cast(pa.float64(), safe=False)
        if expr.op == "/":
            # the engine: a division by zero is missing; float64 would give inf or nan
            y = pc.if_else(y == 0.0, pc.scalar(pa.scalar(None, pa.float64())), y)
        out = {"+": x + y, "-": x - y, "*": x * y, "/": x / y}[expr.op]
        return _Value(out, "float", False)
    return None
