"""Types of LQL expressions, for the semantic checks (:mod:`engine.lql.checks`; docs/semantics.md, docs/lql.md
"Errors"; docs/architecture.md section 7.4).

:func:`infer_type` gives an expression's type (string, int, float, bool, timestamp, duration, ``number`` for a
number of unknown kind, or None: unknown) from the variables in scope (:class:`VarInfo`) and, when given, the
event types' schemas; it raises :class:`~engine.lql.errors.QueryError` at the offending node for an unknown
attribute, incompatible comparison operands, arithmetic on a string/bool, or sum/avg of a non-number.
Plug-ins (issue 16) are typed by their declared signatures: functions, aggregates, and the composite events of
operators (:func:`operator_schema`, 004 Definition 1). Timestamps are int microseconds UTC (``ts``, ``ts_end``;
``duration`` = ``ts_end - ts``).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.lql import ast
from engine.lql.errors import QueryError


@dataclass(slots=True)
class VarInfo:
    """A pattern variable: ``kind`` is single, kleene or neg; ``types`` its event types."""

    name: str
    kind: str
    types: set[str] = field(default_factory=set)
    pos: ast.Pos = ast.NOPOS


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


def require_condition(expr: ast.Expr, scope: Mapping[str, VarInfo], schemas: ast.Schema | None, where: str) -> None:
    """Raise QueryError unless ``expr`` is (or may be) a true/false condition."""
    t = infer_type(expr, scope, schemas)
    if t not in (None, "bool"):
        raise QueryError.at(expr.pos, f"{where} needs a true/false condition, found a value of type {t}")
