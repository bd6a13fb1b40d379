"""Semantic checks of a parsed LQL query (docs/semantics.md, docs/lql.md "Errors").

Each check raises :class:`QueryError` at the offending node's position with a one-line reason.
The order is fixed (pattern shape, event types, PARTITION BY, WHERE, JOIN, RETURN) so that a
query with several problems always reports the same one.

The checks of each statement kind live beside this entry point: pattern statements in
:mod:`engine.lql.pattern_checks`, FILTER, AGGREGATE and INTERVAL in :mod:`engine.lql.rule_checks`, and the types
of expressions (with the plug-ins' declared types) in :mod:`engine.lql.expr_types`; every public name stays
importable from here.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from engine.lql import ast
from engine.lql.errors import QueryError
from engine.lql.expr_types import VarInfo, infer_type, operator_schema, operator_uses, require_condition
from engine.lql.pattern_checks import (
    PartitionRef,
    _check_grouped_return,
    _check_returns,
    _check_side,
    _walk_refs,
    _with_operator_schemas,
    conjuncts,
    declared_vars,
    grouping_aggregates,
)
from engine.lql.rule_checks import _check_aggregate, _check_filter, _check_interval

__all__ = [
    "PartitionRef",
    "VarInfo",
    "check_query",
    "conjuncts",
    "declared_vars",
    "grouping_aggregates",
    "infer_type",
    "operator_schema",
    "operator_uses",
    "read_types",
    "require_condition",
]


# ------------------------------------------------------------------------------ entry point


def check_query(
    query: ast.Query,
    schemas: ast.Schema | None = None,
    *,
    partitions: Mapping[str, Sequence[PartitionRef]] | None = None,
) -> None:
    """Run every semantic check on a parsed query.

    Parameters
    ----------
    query : PatternQuery or LiveArchivedQuery
        The syntax tree from :func:`engine.lql.parser.parse`.
    schemas : dict, optional
        Event type -> {attribute -> string|int|float|bool|timestamp}; enables the type checks.
    partitions : mapping, optional
        The PARTITION BY items as written, keyed ``"query"`` (single query) or ``"live"`` /
        ``"archived"``, for exact error positions; by default the query position is used.

    Raises
    ------
    QueryError
        At the first failed check, with the offending node's line and column.
    """
    parts = partitions or {}
    _check_emit(query)
    if isinstance(query, ast.FilterRule):
        _check_filter(query, schemas, parts.get("duplicate"))
        return
    if isinstance(query, ast.AggregateQuery):
        _check_aggregate(query, schemas, parts.get("group"))
        return
    if isinstance(query, ast.IntervalRule):
        _check_interval(query, schemas, parts.get("query"))
        return
    if isinstance(query, ast.PatternQuery):
        schemas = _with_operator_schemas(query, schemas)
        scope = _check_side(query, schemas, parts.get("query"), {}, "")
        _check_returns(query.returns, scope, schemas)
        return
    for side in (query.live, query.archived):
        for comp in ast.components(side.pattern):
            if comp.operator is not None:
                raise QueryError.at(comp.pos, "operator components are only allowed in live-only queries (PATTERN ...)")
    live_vars = declared_vars(query.live.pattern)
    archived_vars = declared_vars(query.archived.pattern)
    for name, info in archived_vars.items():
        if name in live_vars:
            raise QueryError.at(info.pos, f"variable '{name}' is declared in both the LIVE and the ARCHIVED pattern")
    _check_side(query.live, schemas, parts.get("live"), archived_vars, "LIVE")
    _check_side(query.archived, schemas, parts.get("archived"), live_vars, "ARCHIVED")
    if query.lookback_us <= 0:
        raise QueryError.at(query.pos, "LOOKBACK must be a duration greater than zero")
    scope = {**live_vars, **archived_vars}
    if query.join is not None:
        _walk_refs(query.join, scope, "JOIN", False, {}, "")
        used = {ref.var for ref in ast.variable_refs(query.join)}
        if not (used & live_vars.keys() and used & archived_vars.keys()):
            raise QueryError.at(query.join.pos, "JOIN must relate the live and the archived pattern")
        require_condition(query.join, scope, schemas, "JOIN")
    _check_returns(query.returns, scope, schemas, frozenset(archived_vars))
    _check_grouped_return(query.returns, frozenset(archived_vars))


def read_types(query: ast.Query) -> frozenset[str]:
    """Every event type a statement reads (its input streams)."""
    if isinstance(query, (ast.FilterRule, ast.AggregateQuery)):
        return frozenset({query.type})
    if isinstance(query, ast.PatternQuery):
        return frozenset(t for c in ast.components(query.pattern) for t in c.types)
    if isinstance(query, ast.LiveArchivedQuery):
        return read_types(query.live) | read_types(query.archived)
    type_name = getattr(query, "type", None)  # statements added later (INTERVAL) read one type
    return frozenset({type_name}) if isinstance(type_name, str) else frozenset()


def _check_emit(query: ast.Query) -> None:
    target = query.emit_into
    if target is None:
        return
    if not getattr(query, "returns", ()):
        raise QueryError.at(
            query.pos, f"EMIT INTO {target} needs a RETURN clause: its fields are the derived event's attributes"
        )
    if isinstance(query, ast.LiveArchivedQuery):
        raise QueryError.at(
            query.pos, "EMIT INTO is not supported on live-and-archived queries yet: emit from a live statement"
        )
    if target in read_types(query):
        raise QueryError.at(query.pos, f"EMIT INTO {target} would create a cycle {target} \u2192 {target}")
