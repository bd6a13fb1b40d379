"""The entries of a statement in the rule index (:mod:`engine.rules.index`; 003's CQ index, issue 14 "The rule
index"): per (component variable, event type it reads), the conjunction of the variable's *single-variable
conjuncts* of WHERE, a necessary condition for binding an event to the variable (docs/semantics.md sections 3
and 5, "Which statements an event reaches"), and the access path of each entry: its constant equalities
``v.a = c`` and the constant range it is stored under (:func:`_choose_range`).

Statements under strict or partition contiguity, FILTER rules and kinds the index does not know are always
reached by their types (:func:`statement_entries`); a live-and-archived query is indexed by its LIVE side, an
AGGREGATE statement by its WHERE. Timestamps (``v.ts``) are int microseconds UTC.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.events import attr_getter
from engine.lql import ast
from engine.lql.checks import conjuncts, read_types
from engine.lql.errors import QueryError
from engine.nfa.conditions import Fn, compile_value
from engine.rules.index_tree import _NUM, _kind

CONTIGUOUS = frozenset({"strict_contiguity", "partition_contiguity"})
"""Selection strategies under which every event of the statement's types matters (it breaks runs)."""

_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "="}


def _own(ref: ast.Expr, var: str, kleene: bool) -> bool:
    """Whether ``ref`` reads the event being bound to ``var`` (``v.attr``; ``v[i].attr`` for a Kleene ``v``)."""
    if not isinstance(ref, ast.AttrRef) or ref.var != var:
        return False
    if kleene:
        return ref.index is not None and ref.index.kind == "i"
    return ref.index is None


def single_variable_conjuncts(where: ast.Expr | None, var: str, kleene: bool = False) -> list[ast.Expr]:
    """The top-level AND parts of ``where`` that reference only the event bound to ``var``.

    For a Kleene variable only ``var[i].attr`` counts (``var[1]``, ``var[last]``, ``var[i-1]`` name
    other elements). A conjunct with no reference at all is not one (it names no variable).
    """
    if where is None:
        return []
    out = []
    for conjunct in conjuncts(where):
        refs = list(ast.references(conjunct))
        if refs and all(_own(r, var, kleene) for r in refs):
            out.append(conjunct)
    return out


@dataclass(frozen=True, slots=True)
class EntrySpec:
    """One entry of a statement before compilation: ``type`` and ``var`` it indexes, and the
    single-variable conjuncts (empty: the entry holds for every event of the type)."""

    type: str
    var: str
    kleene: bool
    conjuncts: tuple[ast.Expr, ...]


def statement_entries(query: Any) -> tuple[frozenset[str], list[EntrySpec]]:
    """``(always_types, entries)`` of a statement (module docstring).

    ``always_types``: the event types every event of which reaches the statement; ``entries``: the
    filtered entries. A pattern query under strict or partition contiguity, a FILTER rule and any
    statement kind not listed here are always reached by the types :func:`read_types` gives.
    """
    if isinstance(query, ast.LiveArchivedQuery):
        return statement_entries(query.live)
    if isinstance(query, ast.PatternQuery):
        comps = ast.components(query.pattern)
        if query.strategy in CONTIGUOUS:
            return frozenset(t for c in comps for t in c.types), []
        specs: list[EntrySpec] = []
        for c in comps:
            own = tuple(single_variable_conjuncts(query.where, c.var, c.is_kleene))
            specs.extend(EntrySpec(t, c.var, c.is_kleene, own) for t in c.types)
        return frozenset(), specs
    if isinstance(query, ast.AggregateQuery):
        own = tuple(single_variable_conjuncts(query.where, query.var, False))
        return frozenset(), [EntrySpec(query.type, query.var, False, own)]
    return read_types(query), []  # FILTER rules, and kinds this index does not know


def entry_resolver(var: str, kleene: bool) -> Any:
    """A resolver for :func:`compile_bool` reading the one event ``f(event, None, None)`` bound to ``var``.

    Raises
    ------
    QueryError
        For a reference to anything but ``var`` (``var[i]`` for a Kleene variable).
    """

    def resolve(ref: ast.AttrRef | ast.Aggregate) -> Fn:
        if not _own(ref, var, kleene):
            raise QueryError.at(ref.pos, f"the rule index reads only attributes of '{var}'")
        assert isinstance(ref, ast.AttrRef)
        get = attr_getter(ref.attr)
        return lambda e, b, c: get(e)

    return resolve


def _constant(expr: ast.Expr) -> tuple[bool, Any]:
    """``(True, value)`` when ``expr`` has no reference and folds to an int, float, str or bool (not NaN)."""
    if any(True for _ in ast.references(expr)) or isinstance(expr, (ast.Compare, ast.BoolOp, ast.Not)):
        return False, None

    def no_refs(ref: Any) -> Fn:  # pragma: no cover - guarded by the _refs test above
        raise ValueError("not a constant")

    value = compile_value(expr, no_refs)(None, None, None)
    if _kind(value) is None:
        return False, None
    return True, value


def _path_conjunct(conjunct: ast.Expr, var: str, kleene: bool) -> tuple[str, str, Any] | None:
    """``(attr, op, constant)`` for ``v.attr op c`` or ``c op v.attr`` with op in ``= < <= > >=``, else None."""
    if not isinstance(conjunct, ast.Compare) or conjunct.op == "!=":
        return None
    left, right = conjunct.left, conjunct.right
    op: str = conjunct.op
    if not (isinstance(left, ast.AttrRef) and _own(left, var, kleene)):
        left, right, op = right, left, _FLIP[op]
    if not (isinstance(left, ast.AttrRef) and _own(left, var, kleene)):
        return None
    ok, value = _constant(right)
    return (left.attr, op, value) if ok else None


def _choose_range(ranges: list[tuple[str, str, Any]]) -> tuple[str, Any, Any]:
    """The range access path of an entry: ``(attr, lo, hi)`` (one of lo/hi may be None).

    A two-sided numeric range on one attribute first (attributes in name order), else the first
    one-sided bound. Bounds stay inclusive here: the compiled conjunction decides equality at a bound.
    """
    by_attr: dict[str, tuple[Any, Any]] = {}
    for attr, op, value in sorted(ranges, key=lambda r: r[0]):
        lo, hi = by_attr.get(attr, (None, None))
        if op in (">", ">=") and lo is None:
            lo = value
        elif op in ("<", "<=") and hi is None:
            hi = value
        by_attr[attr] = (lo, hi)
    for attr, (lo, hi) in by_attr.items():
        if lo is not None and hi is not None and _kind(lo) == _NUM and _kind(hi) == _NUM:
            return attr, lo, hi
    attr, (lo, hi) = next(iter(by_attr.items()))
    return (attr, lo, None) if lo is not None else (attr, None, hi)
