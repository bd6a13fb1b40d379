"""Syntax tree of LQL, the LACE query language (DESIGN.md section 4).

The parser (:mod:`engine.lql.parser`) turns query text into these immutable
dataclasses; the semantic checks validate them; the NFA compiler
(:mod:`engine.nfa.compiler`) and the test oracle read them. Nothing here is
ever evaluated with ``eval``/``exec``.

Every node carries ``pos`` (1-based line and column of its first token) so
that later checks can raise a :class:`engine.lql.errors.QueryError` pointing
at the offending text.

Units: durations and timestamps are int microseconds (UTC for timestamps).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal as TLiteral
from typing import Union

from engine.options import Strategy as StrategyName

Strategy = TLiteral[
    "skip_till_any_match", "skip_till_next_match", "strict_contiguity", "partition_contiguity"
]
STRATEGIES: tuple[str, ...] = tuple(s.value for s in StrategyName)
DEFAULT_STRATEGY: Strategy = "skip_till_any_match"


@dataclass(frozen=True, slots=True)
class Pos:
    """A source position: 1-based ``line`` and ``column``."""

    line: int = 0
    column: int = 0


NOPOS = Pos(0, 0)

# --------------------------------------------------------------------------- expressions


@dataclass(frozen=True, slots=True)
class Literal:
    """A constant: int, float, str or bool.

    ``is_duration`` marks a duration literal (``10 min``); its ``value`` is
    then int microseconds.
    """

    value: int | float | str | bool
    pos: Pos = NOPOS
    is_duration: bool = False


IndexKind = TLiteral["i", "prev", "first", "last", "at"]


@dataclass(frozen=True, slots=True)
class Index:
    """An index into a Kleene variable.

    kind:
      - ``"i"``     ``b[i]``     the current element (the conjunct holds for every element)
      - ``"prev"``  ``b[i-1]``   the element before the current one (conjunct applies from i = 2)
      - ``"first"`` ``b[1]``     the first element
      - ``"last"``  ``b[last]``  the last element
      - ``"at"``    ``b[k]``     the k-th element, ``k >= 2`` in ``at`` (``b[1]`` is ``first``)
    """

    kind: IndexKind
    at: int = 0


@dataclass(frozen=True, slots=True)
class AttrRef:
    """``var.attr`` or ``var[index].attr``.

    ``attr`` may be ``"ts"`` (event time, int microseconds), ``"id"`` or
    ``"type"`` besides the event type's attributes. ``index`` is None for a
    single variable (and for a Kleene variable used bare inside an aggregate).
    """

    var: str
    attr: str
    index: Index | None = None
    pos: Pos = NOPOS


AggFunc = TLiteral["count", "sum", "avg", "min", "max", "first", "last"]
AGG_FUNCS: tuple[str, ...] = ("count", "sum", "avg", "min", "max", "first", "last")


@dataclass(frozen=True, slots=True)
class Aggregate:
    """``func(var)`` or ``func(var.attr)`` over a Kleene variable (RETURN only).

    ``count(b)`` has ``attr`` None; the others need an attribute.
    """

    func: AggFunc
    var: str
    attr: str | None = None
    pos: Pos = NOPOS


ArithOp = TLiteral["+", "-", "*", "/"]
CompareOp = TLiteral["=", "!=", "<", "<=", ">", ">="]


@dataclass(frozen=True, slots=True)
class BinOp:
    """Arithmetic ``left op right`` with op in ``+ - * /``."""

    op: ArithOp
    left: Expr
    right: Expr
    pos: Pos = NOPOS


@dataclass(frozen=True, slots=True)
class Neg:
    """Unary minus."""

    operand: Expr
    pos: Pos = NOPOS


@dataclass(frozen=True, slots=True)
class Compare:
    """``left op right`` with op in ``= != < <= > >=`` (``==`` and ``<>`` are parsed as ``=``/``!=``)."""

    op: CompareOp
    left: Expr
    right: Expr
    pos: Pos = NOPOS


@dataclass(frozen=True, slots=True)
class BoolOp:
    """``AND`` / ``OR`` over two or more operands (flattened)."""

    op: TLiteral["and", "or"]
    operands: tuple[Expr, ...]
    pos: Pos = NOPOS


@dataclass(frozen=True, slots=True)
class Not:
    """``NOT operand``."""

    operand: Expr
    pos: Pos = NOPOS


@dataclass(frozen=True, slots=True)
class Equivalence:
    """``[attr]``: every event of the match (negated ones included) has the same ``attr``."""

    attr: str
    pos: Pos = NOPOS


Expr = Union[Literal, AttrRef, Aggregate, BinOp, Neg, Compare, BoolOp, Not, Equivalence]  # noqa: UP007

# --------------------------------------------------------------------------- patterns

ComponentKind = TLiteral["single", "plus", "star", "neg"]


@dataclass(frozen=True, slots=True)
class Component:
    """One pattern component.

    kind:
      - ``"single"``: ``Type v``            one event
      - ``"plus"``:   ``Type+ v[]``          Kleene plus, one or more events
      - ``"star"``:   ``Type* v[]``          Kleene star, zero or more events
      - ``"neg"``:    ``!Type v``            negation: no such event between the neighbours
    ``types`` holds one type, or several for ``ANY(T1, T2) v``.
    """

    kind: ComponentKind
    types: tuple[str, ...]
    var: str
    pos: Pos = NOPOS

    @property
    def is_kleene(self) -> bool:
        return self.kind in ("plus", "star")


@dataclass(frozen=True, slots=True)
class Seq:
    """``SEQ(p1, p2, ...)``: the parts in this order (strictly increasing (ts, id))."""

    items: tuple[PatternNode, ...]
    pos: Pos = NOPOS


@dataclass(frozen=True, slots=True)
class And:
    """``AND(p1, p2, ...)``: all parts, in any order (each part's events form a block)."""

    items: tuple[PatternNode, ...]
    pos: Pos = NOPOS


@dataclass(frozen=True, slots=True)
class Or:
    """``OR(p1, p2, ...)``: any one part."""

    items: tuple[PatternNode, ...]
    pos: Pos = NOPOS


PatternNode = Union[Component, Seq, And, Or]  # noqa: UP007

# --------------------------------------------------------------------------- queries


@dataclass(frozen=True, slots=True)
class ReturnItem:
    """One RETURN field: ``expr AS alias`` (alias defaults to the expression text)."""

    expr: Expr
    alias: str
    pos: Pos = NOPOS


@dataclass(frozen=True, slots=True)
class PatternQuery:
    """A live-only query, or one side of a live-and-archived query.

    ``within_us`` is the window in microseconds (None when absent);
    ``partition_by`` the attribute names of the partition key (empty: no partitioning).
    """

    pattern: PatternNode
    where: Expr | None = None
    partition_by: tuple[str, ...] = ()
    strategy: Strategy = DEFAULT_STRATEGY
    within_us: int | None = None
    returns: tuple[ReturnItem, ...] = ()
    name: str | None = None
    pos: Pos = NOPOS


@dataclass(frozen=True, slots=True)
class LiveArchivedQuery:
    """``LIVE ... ARCHIVED ... LOOKBACK d JOIN cond RETURN ...`` (DESIGN.md section 4).

    ``lookback_us``: the archive access range of a live instance I is
    ``[I.start - lookback_us, I.start)``.
    """

    live: PatternQuery
    archived: PatternQuery
    lookback_us: int
    join: Expr | None
    returns: tuple[ReturnItem, ...] = ()
    name: str | None = None
    pos: Pos = NOPOS


Query = Union[PatternQuery, LiveArchivedQuery]  # noqa: UP007


@dataclass(frozen=True, slots=True)
class AttrType:
    """A declared attribute type for schema checks: one of string, int, float, bool, timestamp."""

    name: TLiteral["string", "int", "float", "bool", "timestamp"]


Schema = dict[str, dict[str, str]]
"""Event type name -> {attribute name -> type name (string|int|float|bool|timestamp)}."""


def components(node: PatternNode) -> list[Component]:
    """All components of a pattern tree, left to right."""
    if isinstance(node, Component):
        return [node]
    out: list[Component] = []
    for item in node.items:
        out.extend(components(item))
    return out


# --------------------------------------------------------------------------- text of expressions

_UNITS_US: tuple[tuple[str, int], ...] = (
    ("d", 86_400_000_000),
    ("h", 3_600_000_000),
    ("min", 60_000_000),
    ("s", 1_000_000),
    ("ms", 1_000),
)


def duration_text(us: int) -> str:
    """``us`` microseconds as LQL text in the largest exact unit, e.g. ``600000000`` -> ``'10 min'``."""
    for unit, size in _UNITS_US:
        if us and us % size == 0:
            return f"{us // size} {unit}"
    return f"{us} us"


def _precedence(expr: Expr) -> int:
    if isinstance(expr, BoolOp):
        return 1 if expr.op == "or" else 2
    if isinstance(expr, Not):
        return 3
    if isinstance(expr, Compare):
        return 4
    if isinstance(expr, BinOp):
        return 5 if expr.op in "+-" else 6
    if isinstance(expr, Neg):
        return 7
    return 8


def _index_text(index: Index) -> str:
    return {"i": "i", "prev": "i-1", "first": "1", "last": "last"}.get(index.kind, str(index.at))


def expr_text(expr: Expr) -> str:
    """Normalized LQL text of an expression (the default RETURN alias).

    Keywords are upper case, binary operators are surrounded by single spaces, parentheses appear
    only where precedence needs them, strings use single quotes, durations the largest exact unit:
    ``a.price``, ``count(b)``, ``min(b.price)``, ``b[i-1].price``, ``(a.x + 1) * 2``, ``10 min``.
    """
    if isinstance(expr, Literal):
        if expr.is_duration:
            return duration_text(int(expr.value))
        if isinstance(expr.value, bool):
            return "true" if expr.value else "false"
        if isinstance(expr.value, str):
            return "'" + expr.value.replace("\\", "\\\\").replace("'", "\\'") + "'"
        return repr(expr.value)
    if isinstance(expr, AttrRef):
        index = "" if expr.index is None else f"[{_index_text(expr.index)}]"
        return f"{expr.var}{index}.{expr.attr}"
    if isinstance(expr, Aggregate):
        return f"{expr.func}({expr.var}{'' if expr.attr is None else '.' + expr.attr})"
    if isinstance(expr, Equivalence):
        return f"[{expr.attr}]"
    mine = _precedence(expr)

    def sub(child: Expr, strict: bool) -> str:
        text = expr_text(child)
        theirs = _precedence(child)
        return f"({text})" if theirs < mine or (strict and theirs == mine) else text

    if isinstance(expr, Neg):
        return "-" + sub(expr.operand, isinstance(expr.operand, Neg))
    if isinstance(expr, Not):
        return "NOT " + sub(expr.operand, False)
    if isinstance(expr, BoolOp):
        return f" {expr.op.upper()} ".join(sub(o, True) for o in expr.operands)
    if isinstance(expr, (BinOp, Compare)):
        return f"{sub(expr.left, isinstance(expr, Compare))} {expr.op} {sub(expr.right, True)}"
    raise TypeError(f"not an LQL expression: {expr!r}")
