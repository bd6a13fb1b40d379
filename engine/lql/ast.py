"""Syntax tree of LQL, the LACE query language (docs/architecture.md section 7.4).

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

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal as TLiteral
from typing import Union

from engine.options import Strategy as StrategyName

Strategy = TLiteral[
    "skip_till_any_match", "skip_till_next_match", "strict_contiguity", "partition_contiguity"
]
STRATEGIES: tuple[str, ...] = tuple(s.value for s in StrategyName)
DEFAULT_STRATEGY: Strategy = "skip_till_any_match"
# plans (issue 16): the PLAN clause
PLANS: tuple[str, ...] = ("auto", "nfa", "tree")
"""``PLAN auto`` (default: the cost model picks), ``nfa`` (the linear NFA), ``tree`` (a tree plan,
skip_till_any_match only; :mod:`engine.nfa.tree`)."""


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
    plugin: bool = False
    """True for an aggregate from the ``lace.aggregates`` entry points (``func`` is then its name,
    evaluated with :mod:`engine.plugins`'s init/add/value protocol); the seven above are built in."""


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


# ---- plug-ins (issue 16) -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Call:
    """A scalar function call ``name(arg, ...)``: a function from the ``lace.functions`` entry points
    (:mod:`engine.plugins`), e.g. ``hour_of_day(a.ts)``, ``round(b[i].price, 2)``. ``name`` is lower case."""

    name: str
    args: tuple[Expr, ...]
    pos: Pos = NOPOS


@dataclass(frozen=True, slots=True)
class OperatorUse:
    """An operator component's operator: ``name(Type, param, ...)`` (entry point group ``lace.operators``).

    ``input_types`` are the event types the operator consumes; ``params`` its literal parameters
    (numbers, strings, durations in int microseconds). The component binds the operator's composite
    events, whose event type is :attr:`derived_type`.
    """

    name: str
    input_types: tuple[str, ...]
    params: tuple[int | float | str, ...] = ()

    @property
    def derived_type(self) -> str:
        """The event type of the composite events: ``name(T1,T2,p1,...)`` (one per distinct use)."""
        return f"{self.name}({','.join([*self.input_types, *map(repr, self.params)])})"


Expr = Union[Literal, AttrRef, Aggregate, BinOp, Neg, Compare, BoolOp, Not, Equivalence, Call]  # noqa: UP007


def references(expr: Expr) -> Iterator[AttrRef | Aggregate | Equivalence]:
    """Every leaf of ``expr`` that reads events, left to right: attribute references, aggregates and
    equivalence tests ``[attr]``, through operators and function-call arguments (the one walker)."""
    if isinstance(expr, (AttrRef, Aggregate, Equivalence)):
        yield expr
    elif isinstance(expr, BoolOp):
        for operand in expr.operands:
            yield from references(operand)
    elif isinstance(expr, (Not, Neg)):
        yield from references(expr.operand)
    elif isinstance(expr, (BinOp, Compare)):
        yield from references(expr.left)
        yield from references(expr.right)
    elif isinstance(expr, Call):
        for arg in expr.args:
            yield from references(arg)


def variable_refs(expr: Expr) -> list[AttrRef | Aggregate]:
    """The variable references of ``expr`` (:func:`references` without the equivalence tests)."""
    return [r for r in references(expr) if not isinstance(r, Equivalence)]

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
    operator: OperatorUse | None = None
    """Set for an operator component ``name(Type, ...) v`` (kind ``single``); ``types`` is then
    ``(operator.derived_type,)``."""

    @property
    def is_kleene(self) -> bool:
        return self.kind in ("plus", "star")


@dataclass(frozen=True, slots=True)
class Seq:
    """``SEQ(p1, p2, ...)``: the parts in this order (strictly increasing (ts_end, id), the matcher's
    order; (ts, id) for point events).

    ``by`` (issue 15, 002's ``by <relation>``): every two consecutive bound events of the SEQ, inside a
    Kleene run too, satisfy this relation (:func:`engine.lql.relations.by_conjuncts`).
    """

    items: tuple[PatternNode, ...]
    pos: Pos = NOPOS
    by: Relation | None = None


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


# ----------------------------------------------------------------- Allen's relations (issue 15)


@dataclass(frozen=True, slots=True)
class Relation:
    """An interval relation as written: ``BEFORE``, ``OVERLAPS(0 s, 30 min)``... (issue 15).

    ``name`` is canonical and lower case (``includes`` -> ``contains``, ``coincides`` -> ``equals``);
    ``args`` are the tolerances in int microseconds (>= 0). The formulas are in
    :mod:`engine.lql.relations`; in WHERE/JOIN a relation is rewritten into comparisons of ``ts`` and
    ``ts_end`` by the parser, so only ``Seq.by`` keeps a Relation in the syntax tree.
    """

    name: str
    args: tuple[int, ...] = ()
    pos: Pos = NOPOS

    def text(self) -> str:
        """LQL text, e.g. ``OVERLAPS(0 s, 30 min)``."""
        args = ", ".join(duration_text(a) if a else "0 s" for a in self.args)
        return self.name.upper() + (f"({args})" if self.args else "")

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
    emit_into: str | None = None
    """``EMIT INTO T``: each match becomes an event of the derived type ``T`` (ts = the match's end,
    attributes = the RETURN fields) instead of an alert (layered rules, 003; docs/architecture.md section 7.9)."""
    # plans (issue 16): PLAN clause and where it is (for errors)
    plan: str = "auto"
    plan_pos: Pos = NOPOS


@dataclass(frozen=True, slots=True)
class LiveArchivedQuery:
    """``LIVE ... ARCHIVED ... LOOKBACK d JOIN cond RETURN ...`` (docs/architecture.md section 7.4).

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
    emit_into: str | None = None
    """``EMIT INTO T``: each result becomes an event of the derived type ``T`` (ts = the live match's end)."""


# --------------------------------------------------------------------------- layered rules (003)


@dataclass(frozen=True, slots=True)
class DropDuplicate:
    """``DROP DUPLICATE a1, a2 WITHIN d``: drop an event when an earlier kept event of the same type has
    equal values of every attribute ``attrs`` (``ts`` included when named) and lies within ``within_us``
    microseconds of it in event time."""

    attrs: tuple[str, ...]
    within_us: int
    pos: Pos = NOPOS


@dataclass(frozen=True, slots=True)
class FilterRule:
    """``FILTER Type v DROP DUPLICATE ... DROP WHEN cond``: the first layer of 003 (section 3.1).

    It runs on validated events of ``type`` before any other statement and before the archive: a
    dropped event is counted per rule, reported with the rule's name, and never archived. ``drop_when``
    is a condition over ``var`` (a missing value makes a comparison false, so the event is kept).
    """

    type: str
    var: str
    duplicate: DropDuplicate | None = None
    drop_when: Expr | None = None
    name: str | None = None
    pos: Pos = NOPOS
    emit_into: str | None = None  # always None: a filter never emits (kept so every statement has it)


WindowKind = TLiteral["tumbling", "sliding", "count"]


@dataclass(frozen=True, slots=True)
class WindowSpec:
    """``WINDOW TUMBLING d`` / ``WINDOW SLIDING d EVERY s`` / ``WINDOW COUNT n [EVERY m]``.

    Time windows (event time, aligned to the epoch): window k covers ``[k*slide, k*slide + size)``
    microseconds; a tumbling window has ``slide == size``. Count windows: ``size`` events, a new window
    every ``slide`` events (``slide == size`` without EVERY), per group.
    """

    kind: WindowKind
    size: int
    slide: int
    pos: Pos = NOPOS


@dataclass(frozen=True, slots=True)
class AggregateQuery:
    """``AGGREGATE Type v [WHERE c] [GROUP BY a, ...] WINDOW ... [HAVING c] RETURN ...``: a continuous
    query over event-time (or count) windows (003, the continuous-query layer; Esper's windowed
    ``select ... group by ... having``).

    ``where`` filters input events (a condition over ``var``); RETURN and HAVING use aggregates over
    ``var`` (``count(v)``, ``sum(v.x)``, ... :data:`AGG_FUNCS`) and the GROUP BY attributes (``v.key``).
    Each window that holds at least one event and passes HAVING gives one result per group.
    """

    type: str
    var: str
    window: WindowSpec
    returns: tuple[ReturnItem, ...]
    where: Expr | None = None
    group_by: tuple[str, ...] = ()
    having: Expr | None = None
    name: str | None = None
    pos: Pos = NOPOS
    emit_into: str | None = None


@dataclass(frozen=True, slots=True)
class IntervalRule:
    """``INTERVAL Type v WHEN cond [PARTITION BY a, ...] COVER d [MAX GAP g] [MIN DURATION m] [RETURN ...]``
    (issue 15; 002's interval events derived from point streams).

    Per partition key, in (ts, id) order, a maximal run of events of ``type`` for which ``when`` holds,
    with gaps between consecutive events <= ``max_gap_us`` (None: ``cover_us``), gives the interval
    ``[first.ts, last.ts + cover_us)``; intervals shorter than ``min_duration_us`` are dropped. RETURN
    sees ``var`` as the run's events, as a Kleene variable (``count(v)``, ``min(v.x)``, ``v[1].x``).
    Durations in int microseconds. Run by :class:`engine.intervals.derive.IntervalDeriver`.
    """

    type: str
    var: str
    when: Expr | None
    cover_us: int
    max_gap_us: int | None = None
    min_duration_us: int = 0
    partition_by: tuple[str, ...] = ()
    returns: tuple[ReturnItem, ...] = ()
    name: str | None = None
    pos: Pos = NOPOS
    emit_into: str | None = None

    @property
    def gap_us(self) -> int:
        """MAX GAP, COVER when absent (int microseconds)."""
        return self.cover_us if self.max_gap_us is None else self.max_gap_us


Query = Union[PatternQuery, LiveArchivedQuery, FilterRule, AggregateQuery, IntervalRule]  # noqa: UP007


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
    if isinstance(expr, Call):
        return f"{expr.name}({', '.join(expr_text(a) for a in expr.args)})"
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
