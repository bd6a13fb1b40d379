"""Compile validated LQL expressions into Python closures (never ``eval``).

Every compiled expression has the signature ``f(a, b, c)``; what the three
arguments mean is decided by the *resolver* that turns each variable reference
into a getter (Flink CEP's split of simple and iterative conditions):

- edge form ``f(prev_event, event, None)``: a condition on the event being bound
  and the event bound just before it (:mod:`engine.nfa.compiler`);
- general form ``f(env, i, x)``: ``env`` the tuple of bound slots (an Event per
  single variable, a tuple of Events per Kleene variable), ``i`` the 0-based
  position of ``b[i]``, ``x`` the candidate event of a negation.

Null rules (docs/semantics.md section 3): a missing value is ``None``;
arithmetic with ``None``, a type error or a division by zero gives ``None``;
a comparison with ``None`` or between incomparable types is false (``!=`` between
a string and a number is true).
"""
from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from engine.lql.ast import (
    Aggregate,
    AttrRef,
    BinOp,
    BoolOp,
    Call,
    Compare,
    Equivalence,
    Expr,
    Literal,
    Neg,
    Not,
)

Fn = Callable[[Any, Any, Any], Any]
Resolver = Callable[[AttrRef | Aggregate], Fn]

_ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
_CMP = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def compile_value(expr: Expr, resolve: Resolver) -> Fn:
    """Compile a value expression (attribute, literal, arithmetic, aggregate) into ``f(a, b, c)``."""
    if isinstance(expr, Literal):
        value = expr.value
        return lambda a, b, c: value
    if isinstance(expr, (AttrRef, Aggregate)):
        return resolve(expr)
    if isinstance(expr, Neg):
        inner = compile_value(expr.operand, resolve)

        def neg(a: Any, b: Any, c: Any) -> Any:
            v = inner(a, b, c)
            try:
                return None if v is None else -v
            except TypeError:
                return None

        return neg
    if isinstance(expr, BinOp):
        return _arith(_ARITH[expr.op], compile_value(expr.left, resolve), compile_value(expr.right, resolve))
    if isinstance(expr, Call):
        return compile_call(expr, [compile_value(a, resolve) for a in expr.args])
    # a boolean used as a value (RETURN a.x > 3)
    return compile_bool(expr, resolve)


def _arith(op: Callable[[Any, Any], Any], left: Fn, right: Fn) -> Fn:
    def arith(a: Any, b: Any, c: Any) -> Any:
        x = left(a, b, c)
        y = right(a, b, c)
        if x is None or y is None:
            return None
        try:
            return op(x, y)
        except (TypeError, ZeroDivisionError, OverflowError):
            return None

    return arith


def compile_bool(expr: Expr, resolve: Resolver) -> Fn:
    """Compile a boolean expression into ``f(a, b, c) -> bool``.

    ``Equivalence`` must have been rewritten into comparisons before (the compiler does it per plan).
    """
    if isinstance(expr, Compare):
        return _compare(expr.op, compile_value(expr.left, resolve), compile_value(expr.right, resolve))
    if isinstance(expr, BoolOp):
        parts = [compile_bool(e, resolve) for e in expr.operands]
        if expr.op == "and":
            if len(parts) == 2:
                p, q = parts
                return lambda a, b, c: p(a, b, c) and q(a, b, c)
            return lambda a, b, c: all(p(a, b, c) for p in parts)
        if len(parts) == 2:
            p, q = parts
            return lambda a, b, c: p(a, b, c) or q(a, b, c)
        return lambda a, b, c: any(p(a, b, c) for p in parts)
    if isinstance(expr, Not):
        inner = compile_bool(expr.operand, resolve)
        return lambda a, b, c: not inner(a, b, c)
    if isinstance(expr, Literal):
        value = bool(expr.value)
        return lambda a, b, c: value
    if isinstance(expr, Equivalence):  # pragma: no cover - rewritten by the compiler
        raise ValueError("equivalence tests are rewritten before compilation")
    value_fn = compile_value(expr, resolve)
    return lambda a, b, c: value_fn(a, b, c) is True


SAME = "same"
"""Internal comparison of the ``[attr]`` equivalence test: equal values, where None equals None
(a missing attribute is a partition value of its own, as under PARTITION BY)."""


def _compare(op_name: str, left: Fn, right: Fn) -> Fn:
    if op_name == SAME:
        return lambda a, b, c: bool(left(a, b, c) == right(a, b, c))
    op = _CMP[op_name]
    if op_name in ("=", "!="):
        if op_name == "=":

            def eq(a: Any, b: Any, c: Any) -> bool:
                x = left(a, b, c)
                y = right(a, b, c)
                return x is not None and y is not None and bool(x == y)

            return eq

        def ne(a: Any, b: Any, c: Any) -> bool:
            x = left(a, b, c)
            y = right(a, b, c)
            return x is not None and y is not None and bool(x != y)

        return ne

    def cmp(a: Any, b: Any, c: Any) -> bool:
        x = left(a, b, c)
        y = right(a, b, c)
        if x is None or y is None:
            return False
        try:
            return op(x, y)
        except TypeError:
            return False

    return cmp


# ---- plug-ins (issue 16): scalar function calls -----------------------------------------------


def compile_call(call: Call, args: list[Fn]) -> Fn:
    """Compile ``name(args...)`` to ``f(a, b, c)`` calling the ``lace.functions`` plug-in ``name``.

    Null rules as for arithmetic: an argument that is None or not of the declared type makes the call
    None without calling the plug-in. A plug-in that raises or returns a value of another type than
    it declares raises :class:`engine.plugins.api.PluginError` naming it.

    Raises
    ------
    QueryError
        When ``name`` is not an installed, working function (the checks report it first).
    """
    from engine.lql.errors import QueryError
    from engine.plugins.api import PluginError, value_has_type
    from engine.plugins.registry import registry

    plugin = registry().get("function", call.name)
    if plugin is None or plugin.error is not None:
        reason = "not installed" if plugin is None else plugin.error
        raise QueryError.at(call.pos, f"function '{call.name}' cannot be used: {reason}")
    spec = plugin.obj
    fn, name, source, returns = spec.fn, call.name, plugin.source, spec.returns
    types = spec.params[: len(args)]

    def run(values: tuple[Any, ...]) -> Any:
        for v, t in zip(values, types, strict=True):
            if v is None or not value_has_type(v, t):
                return None
        try:
            out = fn(*values)
        except Exception as err:
            raise PluginError("function", name, source, f"raised {type(err).__name__}: {err}") from err
        if out is not None and not value_has_type(out, returns):
            raise PluginError("function", name, source, f"returned {type(out).__name__}, declared {returns}")
        return out

    if len(args) == 1:
        (g,) = args
        t0 = types[0]
        if t0 == "timestamp" or t0 == "int":  # the common one-argument case, inlined

            def call1(a: Any, b: Any, c: Any) -> Any:
                v = g(a, b, c)
                if v.__class__ is not int:
                    return run((v,))
                try:
                    out = fn(v)
                except Exception as err:
                    raise PluginError("function", name, source, f"raised {type(err).__name__}: {err}") from err
                if out is not None and not value_has_type(out, returns):
                    raise PluginError("function", name, source, f"returned {type(out).__name__}, declared {returns}")
                return out

            return call1
        return lambda a, b, c: run((g(a, b, c),))
    if len(args) == 2:
        g, h = args
        return lambda a, b, c: run((g(a, b, c), h(a, b, c)))
    return lambda a, b, c: run(tuple(g(a, b, c) for g in args))


def expr_cost(expr: Expr) -> int:
    """Rough evaluation cost: number of nodes. Used to order conjuncts cheap-first."""
    if isinstance(expr, Call):
        return 2 + sum(expr_cost(a) for a in expr.args)
    if isinstance(expr, (Compare, BinOp)):
        return 1 + expr_cost(expr.left) + expr_cost(expr.right)
    if isinstance(expr, BoolOp):
        return 1 + sum(expr_cost(e) for e in expr.operands)
    if isinstance(expr, (Not, Neg)):
        return 1 + expr_cost(expr.operand)
    return 1


def default_pass(expr: Expr) -> float:
    """Prior pass probability of a conjunct with no statistics (System R-style defaults).

    ``=`` (and the ``[attr]`` equality): 0.1; ``!=``: 0.9; ``<``, ``<=``, ``>``, ``>=``: 1/3; anything else: 0.5.
    """
    if isinstance(expr, Compare):
        if expr.op in ("=", SAME):
            return 0.1
        if expr.op == "!=":
            return 0.9
        return 1 / 3
    return 0.5


def order_rank(cost: float, pass_probability: float) -> float:
    """Sort key of a conjunct: ``cost / (1 - p)``, ascending is the cheapest expected order.

    For independent conjuncts evaluated with short-circuit AND, evaluating them by ascending
    ``c_i / (1 - p_i)`` minimises ``sum_i c_i * prod_{k<i} p_k``; with equal costs this is
    004's Strategy 1 (lowest pass probability first, section 4.1.2, formula (9)).
    A conjunct that always passes (p = 1) goes last.
    """
    if pass_probability >= 1.0:
        return float("inf")
    return cost / (1.0 - max(pass_probability, 0.0))


def expected_cost(costs: list[float], probabilities: list[float]) -> float:
    """``sum_i c_i * prod_{k<i} p_k``: expected cost of evaluating conjuncts in this order (004, formula (9))."""
    total = 0.0
    reach = 1.0
    for c, p in zip(costs, probabilities):
        total += c * reach
        reach *= p
    return total


def selectivity_rank(expr: Expr) -> int:
    """0 for equalities (usually the most selective), 1 for ranges, 2 for the rest."""
    if isinstance(expr, Compare):
        return 0 if expr.op == "=" else 1
    return 2
