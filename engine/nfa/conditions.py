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


def expr_cost(expr: Expr) -> int:
    """Rough evaluation cost: number of nodes. Used to order conjuncts cheap-first."""
    if isinstance(expr, (Compare, BinOp)):
        return 1 + expr_cost(expr.left) + expr_cost(expr.right)
    if isinstance(expr, BoolOp):
        return 1 + sum(expr_cost(e) for e in expr.operands)
    if isinstance(expr, (Not, Neg)):
        return 1 + expr_cost(expr.operand)
    return 1


def selectivity_rank(expr: Expr) -> int:
    """0 for equalities (usually the most selective), 1 for ranges, 2 for the rest."""
    if isinstance(expr, Compare):
        return 0 if expr.op == "=" else 1
    return 2
