"""Semantic checks of a parsed LQL query (docs/semantics.md, docs/lql.md "Errors").

Each check raises :class:`QueryError` at the offending node's position with a one-line reason.
The order is fixed (pattern shape, event types, PARTITION BY, WHERE, JOIN, RETURN) so that a
query with several problems always reports the same one.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from engine.lql import ast
from engine.lql.errors import QueryError

__all__ = [
    "PartitionRef",
    "VarInfo",
    "check_query",
    "conjuncts",
    "declared_vars",
    "grouping_aggregates",
    "infer_type",
    "read_types",
]


@dataclass(frozen=True, slots=True)
class PartitionRef:
    """One ``PARTITION BY`` item as written: ``attr`` or ``var.attr``, with its position."""

    var: str | None
    attr: str
    pos: ast.Pos = ast.NOPOS


@dataclass(slots=True)
class VarInfo:
    """A pattern variable: ``kind`` is single, kleene or neg; ``types`` its event types."""

    name: str
    kind: str
    types: set[str] = field(default_factory=set)
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


# ------------------------------------------------------------------------------ types

_NUMERIC = {"int", "float", "duration", "number"}
_HEADER_TYPES = {"ts": "timestamp", "id": "int", "type": "string", "ts_end": "timestamp", "duration": "duration"}
"""Header fields every event has; ``ts_end`` (= ``ts`` for a point event) and ``duration`` (``ts_end - ts``,
int microseconds) come from issue 15 (interval events)."""
_SCHEMA_TYPES = {"string", "int", "float", "bool", "timestamp"}


def _attr_type(
    var: str, attr: str, pos: ast.Pos, scope: Mapping[str, VarInfo], schemas: ast.Schema | None
) -> str | None:
    if attr in _HEADER_TYPES:
        return _HEADER_TYPES[attr]
    if schemas is None:
        return None
    found: set[str | None] = set()
    for type_name in sorted(scope[var].types):
        attrs = schemas.get(type_name)
        if attrs is None:
            continue
        if attr not in attrs:
            raise QueryError.at(pos, f"event type '{type_name}' has no attribute '{attr}'")
        found.add(attrs[attr] if attrs[attr] in _SCHEMA_TYPES else None)
    if len(found) == 1:
        return found.pop()
    return "float" if found and found <= {"int", "float"} else None


def _compatible(a: str | None, b: str | None) -> bool:
    if a is None or b is None or a == b or {a, b} <= _NUMERIC:
        return True
    return "timestamp" in (a, b) and {a, b} - {"timestamp"} <= {"int", "duration", "number"}


def _arith_type(op: str, left: str | None, right: str | None) -> str:
    # "number": a number of unknown kind (an attribute without a schema); never a condition.
    if left == "timestamp" or right == "timestamp":
        if left == right:
            return "duration" if op == "-" else "number"
        return "timestamp" if op in "+-" else "number"
    if left in (None, "number") or right in (None, "number"):
        return "number"
    if "duration" in (left, right):
        return "duration"
    return "float" if op == "/" or "float" in (left, right) else "int"


def infer_type(expr: ast.Expr, scope: Mapping[str, VarInfo], schemas: ast.Schema | None) -> str | None:
    """Type of an expression: string, int, float, bool, timestamp, duration, or None (unknown).

    Raises
    ------
    QueryError
        On an unknown attribute (with ``schemas``), incompatible comparison operands, arithmetic on a
        string/bool, or sum/avg of a non-number.
    """
    if isinstance(expr, ast.Literal):
        if isinstance(expr.value, bool):
            return "bool"
        if isinstance(expr.value, str):
            return "string"
        return "duration" if expr.is_duration else type(expr.value).__name__
    if isinstance(expr, ast.AttrRef):
        return _attr_type(expr.var, expr.attr, expr.pos, scope, schemas)
    if isinstance(expr, ast.Call):
        return _call_type(expr, [infer_type(a, scope, schemas) for a in expr.args])
    if isinstance(expr, ast.Aggregate):
        if expr.attr is None:
            return "int"
        t = _attr_type(expr.var, expr.attr, expr.pos, scope, schemas)
        if expr.plugin:
            return _plugin_aggregate_type(expr, t)
        if expr.func in ("sum", "avg") and t not in (None, "int", "float"):
            raise QueryError.at(expr.pos, f"{expr.func}() needs a number; '{expr.var}.{expr.attr}' is {t}")
        return "float" if expr.func == "avg" else t
    if isinstance(expr, (ast.Neg, ast.BinOp)):
        operands = (expr.operand,) if isinstance(expr, ast.Neg) else (expr.left, expr.right)
        types = [infer_type(o, scope, schemas) for o in operands]
        for operand, t in zip(operands, types, strict=True):
            if t in ("string", "bool"):
                raise QueryError.at(operand.pos, f"arithmetic on a {t} is not allowed")
        if isinstance(expr, ast.Neg):
            return "number" if types[0] in (None, "timestamp") else types[0]
        return _arith_type(expr.op, types[0], types[1])
    if isinstance(expr, ast.Compare):
        left, right = infer_type(expr.left, scope, schemas), infer_type(expr.right, scope, schemas)
        if not _compatible(left, right):
            raise QueryError.at(expr.pos, f"cannot compare {left} with {right}")
        return "bool"
    if isinstance(expr, ast.BoolOp):
        for operand in expr.operands:
            require_condition(operand, scope, schemas, expr.op.upper())
        return "bool"
    if isinstance(expr, ast.Not):
        require_condition(expr.operand, scope, schemas, "NOT")
        return "bool"
    return "bool"  # Equivalence


# ---- plug-ins (issue 16): declared types of functions, aggregates and operators ---------------

_PLUGIN_TO_CHECK = {"number": "number", "any": None}
"""A plug-in's declared type -> the checker's (``number``: int or float of unknown kind; ``any``: unknown)."""


def _accepts_type(declared: str, actual: str | None) -> bool:
    """Whether an argument of inferred type ``actual`` (None: unknown) may be passed as ``declared``."""
    if actual is None or declared == "any" or actual == declared:
        return True
    if declared in ("number", "float"):
        return actual in _NUMERIC
    if declared == "int":
        return actual in ("int", "number", "duration")
    if declared in ("timestamp", "duration"):
        return actual in ("int", "number", declared)
    return False


def _call_type(call: ast.Call, args: list[str | None]) -> str | None:
    from engine.plugins.registry import registry

    plugin = registry().get("function", call.name)
    if plugin is None or plugin.error is not None:
        raise QueryError.at(call.pos, f"function '{call.name}' is not installed or broken")
    spec = plugin.obj
    for arg, declared, actual in zip(call.args, spec.params, args, strict=False):
        if not _accepts_type(declared, actual):
            raise QueryError.at(arg.pos, f"{call.name}() needs a {declared} here, found {actual}: {plugin.signature}")
    return _PLUGIN_TO_CHECK.get(spec.returns, spec.returns)


def _plugin_aggregate_type(agg: ast.Aggregate, t: str | None) -> str | None:
    from engine.plugins.registry import registry

    plugin = registry().get("aggregate", agg.func)
    if plugin is None or plugin.error is not None:
        raise QueryError.at(agg.pos, f"aggregate '{agg.func}' is not installed or broken")
    declared = plugin.obj.arg_type
    if not _accepts_type(declared, t):
        raise QueryError.at(agg.pos, f"{agg.func}() needs a {declared}; '{agg.var}.{agg.attr}' is {t}")
    return _PLUGIN_TO_CHECK.get(plugin.obj.returns, plugin.obj.returns)


def operator_uses(node: ast.PatternNode) -> list[ast.OperatorUse]:
    """The operator components' operators of a pattern, left to right (one per distinct use)."""
    return list(dict.fromkeys(c.operator for c in ast.components(node) if c.operator is not None))


def operator_schema(use: ast.OperatorUse, schemas: ast.Schema, pos: ast.Pos) -> dict[str, str]:
    """Attribute types of ``use``'s composite events: the operator's ``schema`` (Z, 004 Definition 1)
    over its input types' schemas, plus ``ts_start``/``ts_end`` (timestamps).

    Raises
    ------
    QueryError
        For an unknown input type, or when the operator rejects the input schemas or misbehaves.
    """
    from engine.plugins.registry import registry

    children = []
    for t in use.input_types:
        if t not in schemas:
            raise QueryError.at(pos, f"unknown event type '{t}'")
        children.append(dict(schemas[t]))
    plugin = registry().get("operator", use.name)
    assert plugin is not None and plugin.error is None  # the parser checked it
    try:
        out = plugin.obj(*use.params).schema(children)
    except Exception as err:
        raise QueryError.at(pos, f"operator '{use.name}' ({plugin.source}): {err}") from None
    if not isinstance(out, dict) or not all(isinstance(k, str) and v in _SCHEMA_TYPES for k, v in out.items()):
        raise QueryError.at(
            pos, f"operator '{use.name}' ({plugin.source}): schema() must return attribute -> {sorted(_SCHEMA_TYPES)}"
        )
    return {**out, "ts_start": "timestamp", "ts_end": "timestamp"}


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


def require_condition(expr: ast.Expr, scope: Mapping[str, VarInfo], schemas: ast.Schema | None, where: str) -> None:
    """Raise QueryError unless ``expr`` is (or may be) a true/false condition."""
    t = infer_type(expr, scope, schemas)
    if t not in (None, "bool"):
        raise QueryError.at(expr.pos, f"{where} needs a true/false condition, found a value of type {t}")


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


# ------------------------------------------------------------------------------ layered rules (003)


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
