"""Semantic checks of pattern statements (``PATTERN ...``, and each side of ``LIVE ... ARCHIVED ...``), for
:func:`engine.lql.checks.check_query` (docs/semantics.md sections 3 to 6, docs/lql.md "Errors";
docs/architecture.md section 7.4).

A side is checked in a fixed order (:func:`_check_side`: pattern shape, event types, PARTITION BY, WHERE), then
RETURN (:func:`_check_returns`), so that a query with several problems always reports the same one. Each check
raises :class:`~engine.lql.errors.QueryError` at the offending node's position with a one-line reason. Variables
in scope are :class:`~engine.lql.expr_types.VarInfo`; expression types come from :mod:`engine.lql.expr_types`.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from engine.lql import ast
from engine.lql.errors import QueryError
from engine.lql.expr_types import _HEADER_TYPES, VarInfo, infer_type, operator_schema, require_condition


@dataclass(frozen=True, slots=True)
class PartitionRef:
    """One ``PARTITION BY`` item as written: ``attr`` or ``var.attr``, with its position."""

    var: str | None
    attr: str
    pos: ast.Pos = ast.NOPOS


def _kind(component: ast.Component) -> str:
    return "kleene" if component.is_kleene else component.kind


def declared_vars(node: ast.PatternNode) -> dict[str, VarInfo]:
    """Variables of a pattern tree.

    Raises
    ------
    QueryError
        When a variable is declared twice in one SEQ/AND (OR branches may reuse a name, with the
        same kind).
    """
    if isinstance(node, ast.Component):
        return {node.var: VarInfo(node.var, _kind(node), set(node.types), node.pos)}
    out: dict[str, VarInfo] = {}
    for item in node.items:
        for name, info in declared_vars(item).items():
            seen = out.get(name)
            if seen is None:
                out[name] = info
            elif not isinstance(node, ast.Or):
                raise QueryError.at(info.pos, f"duplicate variable '{name}'")
            elif seen.kind != info.kind:
                raise QueryError.at(info.pos, f"variable '{name}' is declared as {seen.kind} and as {info.kind}")
            else:
                seen.types |= info.types
    return out


# ------------------------------------------------------------------------------ pattern shape


def _check_negation_placement(node: ast.PatternNode) -> None:
    if isinstance(node, ast.Component):
        return
    for item in node.items:
        if isinstance(item, ast.Component) and item.kind == "neg" and not isinstance(node, ast.Seq):
            raise QueryError.at(item.pos, "negation is only allowed inside SEQ")
        _check_negation_placement(item)


def _nullable(node: ast.PatternNode) -> bool:
    """True when the node can bind no event (a Kleene star, or built only of such)."""
    if isinstance(node, ast.Component):
        return node.kind == "star"
    if isinstance(node, ast.Or):
        return any(_nullable(i) for i in node.items)
    return all(_nullable(i) for i in node.items)


def _edge(node: ast.PatternNode, first: bool) -> Iterator[ast.Component]:
    """Components that can come first (``first``) or last in a linear plan of ``node``."""
    if isinstance(node, ast.Component):
        yield node
    elif isinstance(node, ast.Seq):
        for item in node.items if first else reversed(node.items):
            yield from _edge(item, first)
            if not _nullable(item):
                break
    else:
        for item in node.items:
            yield from _edge(item, first)


def _check_pattern(query: ast.PatternQuery) -> None:
    pattern = query.pattern
    _check_negation_placement(pattern)
    if all(c.kind == "neg" for c in ast.components(pattern)):
        raise QueryError.at(pattern.pos, "a pattern needs at least one event that is not negated")
    for comp in _edge(pattern, first=True):
        if comp.kind == "neg":
            raise QueryError.at(comp.pos, "a pattern cannot start with a negation")
    if query.within_us is None:
        for comp in _edge(pattern, first=False):
            if comp.kind == "neg":
                raise QueryError.at(comp.pos, "a trailing negation needs WITHIN")
    if query.within_us is not None and query.within_us <= 0:
        raise QueryError.at(query.pos, "WITHIN must be a duration greater than zero")


def _check_event_types(query: ast.PatternQuery, schemas: ast.Schema) -> None:
    for comp in ast.components(query.pattern):
        for type_name in comp.types:
            if type_name not in schemas:
                raise QueryError.at(comp.pos, f"unknown event type '{type_name}'")


def _check_attr_everywhere(
    attr: str, pos: ast.Pos, query: ast.PatternQuery, schemas: ast.Schema | None, what: str
) -> None:
    if schemas is None or attr in _HEADER_TYPES:
        return
    for comp in ast.components(query.pattern):
        for type_name in comp.types:
            if attr not in schemas.get(type_name, {attr: ""}):
                raise QueryError.at(pos, f"{what} attribute '{attr}' is missing from event type '{type_name}'")


# ------------------------------------------------------------------------------ expressions


def _unknown(name: str, pos: ast.Pos, other: Mapping[str, VarInfo], side: str) -> QueryError:
    if name in other:
        return QueryError.at(pos, f"unknown variable '{name}': the {side} pattern's WHERE sees only its own variables")
    return QueryError.at(pos, f"unknown variable '{name}'")


def _walk_refs(
    expr: ast.Expr,
    scope: Mapping[str, VarInfo],
    clause: str,
    top: bool,
    other: Mapping[str, VarInfo],
    side: str,
    grouped: frozenset[str] = frozenset(),
) -> None:
    """Check variables, indexes, aggregates and ``[attr]`` placement in one expression.

    ``grouped``: variables an aggregate may take even when single (the archived variables of a
    live-and-archived RETURN, aggregated over the joined archived instances).
    """
    if isinstance(expr, ast.AttrRef):
        info = scope.get(expr.var)
        if info is None:
            raise _unknown(expr.var, expr.pos, other, side)
        if info.kind == "neg" and clause != "WHERE":
            raise QueryError.at(expr.pos, f"negated variable '{expr.var}' cannot be used in {clause}")
        if info.kind != "kleene" and expr.index is not None:
            raise QueryError.at(expr.pos, f"'{expr.var}' is not a Kleene variable and cannot be indexed")
        if info.kind == "kleene" and expr.index is None:
            v = expr.var
            if clause == "RETURN":
                hint = f"{v}[1] or an aggregate such as count({v})"
            elif clause == "WHERE":
                hint = f"{v}[i] or {v}[1]"
            else:
                hint = f"{v}[1] or {v}[last]"
            raise QueryError.at(expr.pos, f"Kleene variable '{expr.var}' needs an index such as {hint}")
        if expr.index is not None and expr.index.kind in ("i", "prev") and clause != "WHERE":
            raise QueryError.at(expr.pos, f"{ast.expr_text(expr)} is only allowed in WHERE")
    elif isinstance(expr, ast.Aggregate):
        if clause != "RETURN":
            raise QueryError.at(expr.pos, "aggregates are only allowed in RETURN")
        info = scope.get(expr.var)
        if info is None:
            raise _unknown(expr.var, expr.pos, other, side)
        if info.kind == "neg":
            raise QueryError.at(expr.pos, f"negated variable '{expr.var}' cannot be used in {clause}")
        if info.kind != "kleene" and expr.var not in grouped:
            raise QueryError.at(expr.pos, f"{expr.func}() needs a Kleene variable; '{expr.var}' is not one")
    elif isinstance(expr, ast.Equivalence):
        if clause != "WHERE" or not top:
            raise QueryError.at(expr.pos, f"[{expr.attr}] is only allowed as a top-level AND condition of WHERE")
    elif isinstance(expr, ast.BoolOp):
        for operand in expr.operands:
            _walk_refs(operand, scope, clause, top and expr.op == "and", other, side, grouped)
    elif isinstance(expr, (ast.Not, ast.Neg)):
        _walk_refs(expr.operand, scope, clause, False, other, side, grouped)
    elif isinstance(expr, (ast.BinOp, ast.Compare)):
        _walk_refs(expr.left, scope, clause, False, other, side, grouped)
        _walk_refs(expr.right, scope, clause, False, other, side, grouped)
    elif isinstance(expr, ast.Call):
        for arg in expr.args:
            _walk_refs(arg, scope, clause, False, other, side, grouped)


def single_event_var(query: ast.PatternQuery) -> str | None:
    """The variable of a pattern of one event (``SEQ(T x)`` or ``T x``: one component, no Kleene closure, no
    negation, no operator), else None. Each match of such a pattern is one event matched on its own, so its matches
    over any events are the union of each event's (the archive's pushdown and the live-and-archived runners' reuse
    of archived instances rely on it)."""
    node: object = query.pattern
    while isinstance(node, ast.Seq) and len(node.items) == 1 and node.by is None:
        node = node.items[0]
    if isinstance(node, ast.Component) and node.kind == "single" and node.operator is None:
        return node.var
    return None


def conjuncts(expr: ast.Expr) -> tuple[ast.Expr, ...]:
    """Top-level AND parts of a WHERE expression."""
    if isinstance(expr, ast.BoolOp) and expr.op == "and":
        return expr.operands
    return (expr,)


def _check_iteration(where: ast.Expr) -> None:
    for conjunct in conjuncts(where):
        iterated: str | None = None
        for ref in ast.variable_refs(conjunct):
            if isinstance(ref, ast.AttrRef) and ref.index is not None and ref.index.kind in ("i", "prev"):
                if iterated is not None and ref.var != iterated:
                    raise QueryError.at(
                        ref.pos,
                        f"a condition can index only one Kleene variable with i (found '{iterated}' and '{ref.var}')",
                    )
                iterated = ref.var


def _check_where(
    query: ast.PatternQuery,
    scope: dict[str, VarInfo],
    schemas: ast.Schema | None,
    other: Mapping[str, VarInfo],
    side: str,
) -> None:
    if query.where is None:
        return
    _walk_refs(query.where, scope, "WHERE", True, other, side)
    _check_iteration(query.where)
    for conjunct in conjuncts(query.where):
        if isinstance(conjunct, ast.Equivalence):
            _check_attr_everywhere(conjunct.attr, conjunct.pos, query, schemas, f"[{conjunct.attr}]:")
    require_condition(query.where, scope, schemas, "WHERE")


def _check_partitions(
    query: ast.PatternQuery,
    scope: dict[str, VarInfo],
    schemas: ast.Schema | None,
    refs: Sequence[PartitionRef] | None,
) -> None:
    items = refs if refs is not None else [PartitionRef(None, a, query.pos) for a in query.partition_by]
    for ref in items:
        if ref.var is not None and ref.var not in scope:
            raise QueryError.at(ref.pos, f"unknown variable '{ref.var}'")
        _check_attr_everywhere(ref.attr, ref.pos, query, schemas, "PARTITION BY")


def _check_returns(
    returns: Sequence[ast.ReturnItem],
    scope: dict[str, VarInfo],
    schemas: ast.Schema | None,
    grouped: frozenset[str] = frozenset(),
) -> None:
    aliases: set[str] = set()
    for item in returns:
        _walk_refs(item.expr, scope, "RETURN", False, {}, "", grouped)
        infer_type(item.expr, scope, schemas)
        if item.alias in aliases:
            raise QueryError.at(item.pos, f"duplicate RETURN name '{item.alias}'")
        aliases.add(item.alias)


def _check_side(
    query: ast.PatternQuery,
    schemas: ast.Schema | None,
    refs: Sequence[PartitionRef] | None,
    other: Mapping[str, VarInfo],
    side: str,
) -> dict[str, VarInfo]:
    scope = declared_vars(query.pattern)
    _check_pattern(query)
    if schemas is not None:
        _check_event_types(query, schemas)
    _check_partitions(query, scope, schemas, refs)
    _check_where(query, scope, schemas, other, side)
    return scope


def _with_operator_schemas(query: ast.PatternQuery, schemas: ast.Schema | None) -> ast.Schema | None:
    if schemas is None:
        return None
    extra = {}
    for comp in ast.components(query.pattern):
        if comp.operator is not None:
            derived = operator_schema(comp.operator, schemas, comp.pos)
            for attr in query.partition_by:  # the engine copies the partition key onto composites
                for t in comp.operator.input_types:
                    if attr in schemas.get(t, {}):
                        derived.setdefault(attr, schemas[t][attr])
            extra[comp.operator.derived_type] = derived
    return {**schemas, **extra} if extra else schemas


def grouping_aggregates(returns: Sequence[ast.ReturnItem], archived: frozenset[str]) -> list[ast.Aggregate]:
    """The aggregates over archived variables in a live-and-archived RETURN (non-empty: grouped form).

    A RETURN with such an aggregate gives one result per live instance, aggregated over the archived
    instances joined with it (docs/semantics.md section 6, "One result per live instance").
    """
    found = (r for item in returns for r in ast.variable_refs(item.expr))
    return [r for r in found if isinstance(r, ast.Aggregate) and r.var in archived]


def _check_grouped_return(returns: Sequence[ast.ReturnItem], archived: frozenset[str]) -> None:
    """SQL's GROUP BY rule: in the grouped form, an archived value must be aggregated."""
    aggregates = grouping_aggregates(returns, archived)
    if not aggregates:
        return
    first = ast.expr_text(aggregates[0])
    for item in returns:
        for ref in ast.variable_refs(item.expr):
            if isinstance(ref, ast.AttrRef) and ref.var in archived:
                attr = ref.attr
                raise QueryError.at(
                    ref.pos,
                    f"{ast.expr_text(ref)} must be aggregated, e.g. min({ref.var}.{attr}) or last({ref.var}.{attr}):"
                    f" RETURN aggregates an archived variable ({first}), so it gives one result per live instance",
                )
