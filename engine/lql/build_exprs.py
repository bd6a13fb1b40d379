"""Syntax-tree builders of LQL expressions, part of the LQL parser (:mod:`engine.lql.parser`;
docs/architecture.md section 7.4, reference docs/lql.md): boolean and arithmetic operators, comparisons,
literals (duration literals in int microseconds), attribute references with their Kleene indexes (``i``,
``i-1``, ``last``, a number from 1), aggregates, and calls of the plug-in functions and aggregates (issue 16,
looked up in :func:`engine.plugins.registry.registry`). A malformed form raises
:class:`~engine.lql.errors.QueryError` with its position and a one-line reason.
"""
from __future__ import annotations

import re
from typing import Any

from lark import Token, v_args
from lark.tree import Meta

from engine.lql import ast
from engine.lql.build_common import _number, _pos, _TreeBuilder
from engine.lql.errors import QueryError

_COMPARE_OPS = {"=": "=", "==": "=", "!=": "!=", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def _unescape(tok: Token) -> str:
    body = str(tok)[1:-1]
    return re.sub(r"\\(.)", lambda m: m.group(1) if m.group(1) in "\\'\"" else m.group(0), body)


def _binop(op: ast.ArithOp) -> Any:
    def build(self: Any, meta: Meta, ch: list[Any]) -> ast.BinOp:
        return ast.BinOp(op, ch[0], ch[1], _pos(meta))

    return build


def _constant(value: bool) -> Any:
    def build(self: Any, meta: Meta, ch: list[Any]) -> ast.Literal:
        return ast.Literal(value, _pos(meta))

    return build


@v_args(meta=True)
class _ExprBuilders(_TreeBuilder):
    """Expressions, references and calls (module docstring)."""

    add, sub, mul, div = (_binop(op) for op in ("+", "-", "*", "/"))
    true, false = _constant(True), _constant(False)

    # ---------------------------------------------------------------- expressions
    def or_expr(self, meta: Meta, ch: list[Any]) -> ast.BoolOp:
        return self._flat("or", meta, ch)

    def and_expr(self, meta: Meta, ch: list[Any]) -> ast.BoolOp:
        return self._flat("and", meta, ch)

    @staticmethod
    def _flat(op: str, meta: Meta, ch: list[Any]) -> ast.BoolOp:
        operands: list[ast.Expr] = []
        for item in ch:
            if isinstance(item, ast.BoolOp) and item.op == op:
                operands.extend(item.operands)
            else:
                operands.append(item)
        return ast.BoolOp(op, tuple(operands), _pos(meta))  # type: ignore[arg-type]

    def not_op(self, meta: Meta, ch: list[Any]) -> ast.Not:
        return ast.Not(ch[0], _pos(meta))

    def compare(self, meta: Meta, ch: list[Any]) -> ast.Compare:
        left, op, right = ch
        return ast.Compare(_COMPARE_OPS[str(op)], left, right, _pos(meta))  # type: ignore[arg-type]

    def neg_op(self, meta: Meta, ch: list[Any]) -> ast.Neg:
        return ast.Neg(ch[0], _pos(meta))

    def number(self, meta: Meta, ch: list[Any]) -> ast.Literal:
        return ast.Literal(_number(ch[0]), _pos(meta))

    def duration(self, meta: Meta, ch: list[Any]) -> ast.Literal:
        return ast.Literal(self._us(ch[0], ch[1]), _pos(meta), is_duration=True)

    def string(self, meta: Meta, ch: list[Any]) -> ast.Literal:
        return ast.Literal(_unescape(ch[0]), _pos(meta))

    def bare_name(self, meta: Meta, ch: list[Any]) -> ast.Expr:
        name = str(ch[0])
        raise QueryError.at(_pos(meta), f"'{name}' needs its variable, e.g. v.{name}")

    def equivalence(self, meta: Meta, ch: list[Any]) -> ast.Equivalence:
        return ast.Equivalence(str(ch[0]), _pos(meta))

    def plain_ref(self, meta: Meta, ch: list[Any]) -> ast.AttrRef:
        return ast.AttrRef(str(ch[0]), str(ch[1]), None, _pos(meta))

    def indexed_ref(self, meta: Meta, ch: list[Any]) -> ast.AttrRef:
        return ast.AttrRef(str(ch[0]), str(ch[2]), ch[1], _pos(meta))

    def index_name(self, meta: Meta, ch: list[Any]) -> ast.Index:
        name = str(ch[0]).lower()
        if name in ("i", "last"):
            return ast.Index(name)  # type: ignore[arg-type]
        raise QueryError.at(_pos(meta), f"unknown index '{ch[0]}' (use i, i-1, last or a number from 1)")

    def index_minus(self, meta: Meta, ch: list[Any]) -> ast.Index:
        if str(ch[0]).lower() != "i" or str(ch[1]) != "1":
            raise QueryError.at(_pos(meta), f"unsupported index '{ch[0]}-{ch[1]}' (only i-1 is allowed)")
        return ast.Index("prev")

    def index_number(self, meta: Meta, ch: list[Any]) -> ast.Index:
        k = _number(ch[0])
        if not isinstance(k, int) or k < 1:
            raise QueryError.at(_pos(meta), f"index '{ch[0]}' must be a whole number from 1")
        return ast.Index("first") if k == 1 else ast.Index("at", k)

    # ---------------------------------------------------------------- plug-ins (issue 16)
    def call_var(self, meta: Meta, ch: list[Any]) -> ast.Expr:
        """``name(v)``: an aggregate over a whole variable (``count(b)``)."""
        func_tok, var = ch
        func = str(func_tok).lower()
        pos = _pos(meta)
        if func == "count":
            return ast.Aggregate("count", str(var), None, pos)
        if func in ast.AGG_FUNCS or _plugin("aggregate", func) is not None:
            raise QueryError.at(pos, f"{func}() needs an attribute, e.g. {func}({var}.price)")
        if _plugin("function", func) is not None:
            raise QueryError.at(_pos(var), f"'{var}' needs its variable, e.g. v.{var}")
        raise QueryError.at(pos, _unknown_function(func_tok))

    def call(self, meta: Meta, ch: list[Any]) -> ast.Expr:
        """``name(expr, ...)``: a Kleene aggregate, a plug-in aggregate or a scalar function."""
        func_tok, *rest = ch
        args = [a for a in rest if a is not None]
        func = str(func_tok).lower()
        pos = _pos(meta)
        plugin_agg = func not in ast.AGG_FUNCS and _plugin("aggregate", func) is not None
        if func in ast.AGG_FUNCS or plugin_agg:
            if len(args) != 1 or not isinstance(args[0], ast.AttrRef):
                if func == "count":
                    raise QueryError.at(pos, "count() takes a Kleene variable, e.g. count(b)")
                raise QueryError.at(pos, f"{func}() takes one attribute of a Kleene variable, e.g. {func}(b.price)")
            arg = args[0]
            if func == "count":
                raise QueryError.at(pos, f"count() takes a Kleene variable, e.g. count({arg.var})")
            if arg.index is not None:
                raise QueryError.at(
                    arg.pos, f"an aggregate takes the whole variable: write {func}({arg.var}.{arg.attr})"
                )
            return ast.Aggregate(func, arg.var, arg.attr, pos, plugin=plugin_agg)  # type: ignore[arg-type]
        plugin = _plugin("function", func)
        if plugin is None:
            raise QueryError.at(pos, _unknown_function(func_tok))
        if plugin.error is not None:
            raise QueryError.at(pos, f"function '{func}' ({plugin.source}) is broken: {plugin.error}")
        spec = plugin.obj
        low = len(spec.params) if spec.min_args is None else spec.min_args
        if not low <= len(args) <= len(spec.params):
            want = str(low) if low == len(spec.params) else f"{low} to {len(spec.params)}"
            raise QueryError.at(pos, f"{func}() takes {want} argument(s), got {len(args)}: {plugin.signature}")
        return ast.Call(func, tuple(args), pos)

    def neg_number(self, meta: Meta, ch: list[Any]) -> ast.Literal:
        return ast.Literal(-_number(ch[0]), _pos(meta))


def _plugin(kind: str, name: str) -> Any:
    from engine.plugins.registry import registry

    return registry().get(kind, name)


def _installed(kind: str) -> str:
    from engine.plugins.registry import registry

    return ", ".join(registry().names(kind)) or "none"


def _unknown_function(tok: Token) -> str:
    return (
        f"unknown function '{tok}' (aggregates: {', '.join(ast.AGG_FUNCS)}; installed functions: "
        f"{_installed('function')}; `lace operators` lists them)"
    )
