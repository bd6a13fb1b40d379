"""Semantic checks of the layered rules of 003, ``FILTER`` (DROP DUPLICATE, DROP WHEN) and ``AGGREGATE ...
WINDOW`` (WHERE, GROUP BY, RETURN, HAVING), and of ``INTERVAL`` (002, issue 15: WHEN, PARTITION BY, RETURN over
the run), for :func:`engine.lql.checks.check_query` (docs/lql.md "Errors"; docs/architecture.md section 7.9).

Each of these statements reads one event type through one variable: its conditions are over one event (no
index, no aggregate, no ``[attr]``), and the RETURN of an AGGREGATE or INTERVAL sees the variable as a group of
events (as a Kleene variable's: aggregates over it), with GROUP BY attributes as single values. Each check
raises :class:`~engine.lql.errors.QueryError` at the offending node's position with a one-line reason.
"""
from __future__ import annotations

from collections.abc import Sequence

from engine.lql import ast
from engine.lql.errors import QueryError
from engine.lql.expr_types import _HEADER_TYPES, VarInfo, infer_type, require_condition
from engine.lql.pattern_checks import PartitionRef, _check_returns, conjuncts


def _single_scope(type_name: str, var: str, pos: ast.Pos, schemas: ast.Schema | None) -> dict[str, VarInfo]:
    if schemas is not None and type_name not in schemas:
        raise QueryError.at(pos, f"unknown event type '{type_name}'")
    return {var: VarInfo(var, "single", {type_name}, pos)}


def _check_attrs(
    refs: Sequence[PartitionRef] | None, var: str, type_name: str, schemas: ast.Schema | None, clause: str
) -> None:
    for ref in refs or ():
        if ref.var is not None and ref.var != var:
            raise QueryError.at(ref.pos, f"unknown variable '{ref.var}' in {clause} (the statement reads '{var}')")
        if schemas is not None and ref.attr not in _HEADER_TYPES and ref.attr not in schemas.get(type_name, {}):
            raise QueryError.at(ref.pos, f"{clause}: event type '{type_name}' has no attribute '{ref.attr}'")


def _check_single_condition(expr: ast.Expr, scope: dict[str, VarInfo], schemas: ast.Schema | None, clause: str) -> None:
    for ref in ast.variable_refs(expr):
        if isinstance(ref, ast.Aggregate):
            raise QueryError.at(ref.pos, f"aggregates are not allowed in {clause}")
        if ref.var not in scope:
            raise QueryError.at(ref.pos, f"unknown variable '{ref.var}'")
        if ref.index is not None:
            raise QueryError.at(ref.pos, f"'{ref.var}' is one event here and cannot be indexed")
    if any(isinstance(c, ast.Equivalence) for c in conjuncts(expr)):
        raise QueryError.at(expr.pos, f"[attr] equivalence tests are not allowed in {clause}")
    require_condition(expr, scope, schemas, clause)


def _check_filter(rule: ast.FilterRule, schemas: ast.Schema | None, refs: Sequence[PartitionRef] | None) -> None:
    scope = _single_scope(rule.type, rule.var, rule.pos, schemas)
    _check_attrs(refs, rule.var, rule.type, schemas, "DROP DUPLICATE")
    if rule.drop_when is not None:
        _check_single_condition(rule.drop_when, scope, schemas, "DROP WHEN")


def _check_grouped_expr(expr: ast.Expr, query: ast.AggregateQuery, clause: str) -> None:
    """RETURN / HAVING of an AGGREGATE: every attribute outside an aggregate must be a GROUP BY attribute."""
    for ref in ast.variable_refs(expr):
        if ref.var != query.var:
            raise QueryError.at(ref.pos, f"unknown variable '{ref.var}'")
        if isinstance(ref, ast.AttrRef):
            if ref.index is not None:
                raise QueryError.at(ref.pos, f"'{ref.var}' cannot be indexed in {clause}; use an aggregate")
            if ref.attr not in query.group_by:
                raise QueryError.at(
                    ref.pos,
                    f"{ast.expr_text(ref)} must be aggregated (e.g. last({ref.var}.{ref.attr})) or be a GROUP BY"
                    " attribute",
                )


def _check_interval(query: ast.IntervalRule, schemas: ast.Schema | None, refs: Sequence[PartitionRef] | None) -> None:
    """INTERVAL (issue 15): WHEN is a condition over one event; RETURN sees the run as a Kleene variable."""
    scope = _single_scope(query.type, query.var, query.pos, schemas)
    _check_attrs(refs, query.var, query.type, schemas, "PARTITION BY")
    if query.when is not None:
        _check_single_condition(query.when, scope, schemas, "WHEN")
    run = {query.var: VarInfo(query.var, "kleene", {query.type}, query.pos)}
    _check_returns(query.returns, run, schemas)


def _check_aggregate(
    query: ast.AggregateQuery, schemas: ast.Schema | None, refs: Sequence[PartitionRef] | None
) -> None:
    scope = _single_scope(query.type, query.var, query.pos, schemas)
    _check_attrs(refs, query.var, query.type, schemas, "GROUP BY")
    if query.where is not None:
        _check_single_condition(query.where, scope, schemas, "WHERE")
    # aggregates see the variable as a group of events (as a Kleene variable's)
    grouped = {query.var: VarInfo(query.var, "kleene", {query.type}, query.pos)}
    aliases: set[str] = set()
    for item in query.returns:
        _check_grouped_expr(item.expr, query, "RETURN")
        _types_with_groups(item.expr, query, grouped, scope, schemas)
        if item.alias in aliases:
            raise QueryError.at(item.pos, f"duplicate RETURN name '{item.alias}'")
        aliases.add(item.alias)
    if "window_end" in aliases:
        raise QueryError.at(query.pos, "RETURN name 'window_end' is reserved (every window result carries it)")
    if query.having is not None:
        _check_grouped_expr(query.having, query, "HAVING")
        t = _types_with_groups(query.having, query, grouped, scope, schemas)
        if t not in (None, "bool"):
            raise QueryError.at(query.having.pos, f"HAVING needs a true/false condition, found a value of type {t}")


def _types_with_groups(
    expr: ast.Expr,
    query: ast.AggregateQuery,
    grouped: dict[str, VarInfo],
    scope: dict[str, VarInfo],
    schemas: ast.Schema | None,
) -> str | None:
    """Type of a RETURN/HAVING expression: aggregates typed over the group, GROUP BY attributes as single."""
    if isinstance(expr, ast.Aggregate):
        return infer_type(expr, grouped, schemas)
    if isinstance(expr, ast.AttrRef):
        return infer_type(expr, scope, schemas)
    if isinstance(expr, (ast.Neg, ast.BinOp, ast.Compare, ast.BoolOp, ast.Not)):
        # rebuild the type bottom-up with the same rules as infer_type: aggregates are leaves
        return infer_type(_typed_leaves(expr, grouped, scope, schemas), {}, None)
    return infer_type(expr, scope, schemas)


def _typed_leaves(
    expr: ast.Expr, grouped: dict[str, VarInfo], scope: dict[str, VarInfo], schemas: ast.Schema | None
) -> ast.Expr:
    """``expr`` with each aggregate / attribute replaced by a literal of its type (for :func:`infer_type`)."""
    from dataclasses import replace

    if isinstance(expr, (ast.Aggregate, ast.AttrRef)):
        t = infer_type(expr, grouped if isinstance(expr, ast.Aggregate) else scope, schemas)
        sample: dict[str | None, ast.Expr] = {
            "int": ast.Literal(0, expr.pos), "float": ast.Literal(0.0, expr.pos), "string": ast.Literal("", expr.pos),
            "bool": ast.Literal(True, expr.pos), "timestamp": ast.Literal(0, expr.pos, is_duration=True),
        }
        return sample.get(t, ast.AttrRef("?", "?", None, expr.pos))
    if isinstance(expr, ast.BoolOp):
        return replace(expr, operands=tuple(_typed_leaves(o, grouped, scope, schemas) for o in expr.operands))
    if isinstance(expr, (ast.Not, ast.Neg)):
        return replace(expr, operand=_typed_leaves(expr.operand, grouped, scope, schemas))
    if isinstance(expr, (ast.BinOp, ast.Compare)):
        return replace(
            expr,
            left=_typed_leaves(expr.left, grouped, scope, schemas),
            right=_typed_leaves(expr.right, grouped, scope, schemas),
        )
    return expr
