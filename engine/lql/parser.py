"""LQL text -> syntax tree (:mod:`engine.lql.ast`), then the semantic checks.

The grammar lives in ``grammar.lark`` and is parsed with lark's LALR(1) parser and contextual
lexer. Query text is only ever tokenized and parsed: nothing is evaluated with ``eval``/``exec``.
Every syntax error and every failed check becomes a :class:`QueryError` with the 1-based line and
column of the offending token and a one-line reason.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError
from lark.tree import Meta

from engine.durations import MAX_DURATION_US, UNIT_US
from engine.lql import ast
from engine.lql.checks import PartitionRef, check_query
from engine.lql.errors import QueryError

__all__ = ["parse", "parse_expression", "parse_unchecked"]

_GRAMMAR_PATH = Path(__file__).with_name("grammar.lark")

_UNIT_US = UNIT_US  # one unit table for LQL, the CLI and the REST API
_COMPARE_OPS = {"=": "=", "==": "=", "!=": "!=", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_DURATION_HINT = "expected a duration such as '10 min'"
MAX_DEPTH = 128
"""Deepest syntax tree accepted (nested patterns, operators and clauses): the transformer, the checks
and the compiler recurse over it, so a deeper one is a :class:`QueryError`, not a RecursionError."""


@lru_cache(maxsize=1)
def _lark() -> Lark:
    grammar = _GRAMMAR_PATH.read_text(encoding="utf-8")
    return Lark(
        grammar,
        parser="lalr",
        lexer="contextual",
        start=["start", "expr"],
        propagate_positions=True,
        maybe_placeholders=True,
    )


def _pos(item: Token | Meta) -> ast.Pos:
    return ast.Pos(getattr(item, "line", 0) or 0, getattr(item, "column", 0) or 0)


def _number(tok: Token) -> int | float:
    text = str(tok)
    return float(text) if any(c in text for c in ".eE") else int(text)


def _unescape(tok: Token) -> str:
    body = str(tok)[1:-1]
    return re.sub(r"\\(.)", lambda m: m.group(1) if m.group(1) in "\\'\"" else m.group(0), body)


@dataclass(frozen=True, slots=True)
class _Duration:
    us: int | None  # None: the number had no unit
    pos: ast.Pos  # where the duration text starts (the sign or the number)


@dataclass(frozen=True, slots=True)
class _Part:
    """One ``PATTERN ...`` part before it becomes a PatternQuery."""

    query: ast.PatternQuery
    partitions: tuple[PartitionRef, ...]


def _first_child(self: Any, meta: Meta, ch: list[Any]) -> Any:
    return ch[0]


def _all_children(self: Any, meta: Meta, ch: list[Any]) -> tuple[Any, ...]:
    return tuple(ch)


def _component(kind: ast.ComponentKind) -> Any:
    def build(self: Any, meta: Meta, ch: list[Any]) -> ast.Component:
        return ast.Component(kind, ch[0], str(ch[1]), _pos(meta))

    return build


def _binop(op: ast.ArithOp) -> Any:
    def build(self: Any, meta: Meta, ch: list[Any]) -> ast.BinOp:
        return ast.BinOp(op, ch[0], ch[1], _pos(meta))

    return build


def _constant(value: bool) -> Any:
    def build(self: Any, meta: Meta, ch: list[Any]) -> ast.Literal:
        return ast.Literal(value, _pos(meta))

    return build


@v_args(meta=True)
class _ToAst(Transformer[Token, Any]):
    """Builds :mod:`engine.lql.ast` nodes; raises QueryError for forms the grammar accepts loosely."""

    def __init__(self) -> None:
        super().__init__()
        self.partitions: dict[str, tuple[PartitionRef, ...]] = {}

    name_clause = join_clause = call_var = _first_child
    return_clause = _all_children

    def where_clause(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, Any]:
        return ("WHERE", _pos(meta), ch[0])

    def partition_clause(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, Any]:
        return ("PARTITION BY", _pos(meta), list(ch))
    single, plus, star, neg = (_component(k) for k in ("single", "plus", "star", "neg"))
    add, sub, mul, div = (_binop(op) for op in ("+", "-", "*", "/"))
    true, false = _constant(True), _constant(False)

    # ---------------------------------------------------------------- queries
    def start(self, meta: Meta, ch: list[Any]) -> ast.Query:
        name, query = ch
        return replace(query, name=None if name is None else str(name), pos=_pos(meta))

    def single_query(self, meta: Meta, ch: list[Any]) -> ast.PatternQuery:
        part, returns = ch
        self.partitions["query"] = part.partitions
        return replace(part.query, returns=returns or ())

    def live_archived(self, meta: Meta, ch: list[Any]) -> ast.LiveArchivedQuery:
        live, archived, lookback, join, returns = ch
        self.partitions["live"] = live.partitions
        self.partitions["archived"] = archived.partitions
        return ast.LiveArchivedQuery(live.query, archived.query, lookback, join, returns or (), None, _pos(meta))

    def pattern_part(self, meta: Meta, ch: list[Any]) -> _Part:
        pattern, *clauses = ch
        seen: dict[str, Any] = {}
        for name, pos, value in clauses:
            if name in seen:
                raise QueryError.at(pos, f"duplicate {name} clause")
            seen[name] = value
        where, partitions = seen.get("WHERE"), seen.get("PARTITION BY")
        strategy, within = seen.get("STRATEGY"), seen.get("WITHIN")
        if isinstance(pattern, ast.Component):  # `PATTERN Pass p` means SEQ(Pass p)
            pattern = ast.Seq((pattern,), pattern.pos)
        partitions = tuple(partitions or ())
        query = ast.PatternQuery(
            pattern=pattern,
            where=where,
            partition_by=tuple(p.attr for p in partitions),
            strategy=strategy or ast.DEFAULT_STRATEGY,
            within_us=within,
            pos=_pos(meta),
        )
        return _Part(query, partitions)

    def partition_attr(self, meta: Meta, ch: list[Any]) -> PartitionRef:
        return PartitionRef(None, str(ch[0]), _pos(ch[0]))

    def partition_var_attr(self, meta: Meta, ch: list[Any]) -> PartitionRef:
        return PartitionRef(str(ch[0]), str(ch[1]), _pos(ch[0]))

    def strategy_clause(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, str]:
        tok = ch[0]
        name = str(tok).lower().replace("-", "_")
        if name not in ast.STRATEGIES:
            raise QueryError.at(_pos(tok), f"unknown strategy '{tok}' (use {', '.join(ast.STRATEGIES)})")
        return ("STRATEGY", _pos(meta), name)

    def within_clause(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, int]:
        return ("WITHIN", _pos(meta), self._positive(ch[0], "WITHIN"))

    def lookback_clause(self, meta: Meta, ch: list[Any]) -> int:
        return self._positive(ch[0], "LOOKBACK")

    @staticmethod
    def _positive(duration: _Duration, clause: str) -> int:
        if duration.us is None:
            raise QueryError.at(duration.pos, f"{_DURATION_HINT} after {clause}")
        if duration.us <= 0:
            raise QueryError.at(duration.pos, f"{clause} must be a duration greater than zero")
        return duration.us

    def duration_pos(self, meta: Meta, ch: list[Any]) -> _Duration:
        number, unit = ch
        return _Duration(None if unit is None else self._us(number, unit), _pos(number))

    def duration_neg(self, meta: Meta, ch: list[Any]) -> _Duration:
        number, unit = ch
        return _Duration(None if unit is None else -self._us(number, unit), _pos(meta))

    @staticmethod
    def _us(number: Token, unit: Token) -> int:
        value = _number(number)
        size = _UNIT_US[str(unit).lower()]
        us = value * size if isinstance(value, int) else value * size
        if not us <= MAX_DURATION_US:  # also catches inf and nan (e.g. 1e400 days)
            raise QueryError.at(
                _pos(number), f"the duration {number} {unit} is too long (at most 2^62 us, ~146,000 years)"
            )
        return us if isinstance(us, int) else round(us)

    def return_item(self, meta: Meta, ch: list[Any]) -> ast.ReturnItem:
        expr, alias = ch
        return ast.ReturnItem(expr, ast.expr_text(expr) if alias is None else str(alias), _pos(meta))

    # ---------------------------------------------------------------- patterns
    def seq(self, meta: Meta, ch: list[Any]) -> ast.Seq:
        return ast.Seq(tuple(ch), _pos(meta))

    def and_pattern(self, meta: Meta, ch: list[Any]) -> ast.And:
        return ast.And(tuple(ch), _pos(meta))

    def or_pattern(self, meta: Meta, ch: list[Any]) -> ast.Or:
        return ast.Or(tuple(ch), _pos(meta))

    def type_spec(self, meta: Meta, ch: list[Any]) -> tuple[str, ...]:
        return tuple(str(t) for t in ch)

    def neg_kleene(self, meta: Meta, ch: list[Any]) -> ast.Component:
        raise QueryError.at(_pos(meta), "a negation cannot be a Kleene closure: write '!Type v'")

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

    def call(self, meta: Meta, ch: list[Any]) -> ast.Aggregate:
        func_tok, arg = ch
        func = str(func_tok).lower()
        pos = _pos(meta)
        if func not in ast.AGG_FUNCS:
            raise QueryError.at(pos, f"unknown function '{func_tok}' (aggregates are {', '.join(ast.AGG_FUNCS)})")
        if isinstance(arg, Token):
            if func != "count":
                raise QueryError.at(pos, f"{func}() needs an attribute, e.g. {func}({arg}.price)")
            return ast.Aggregate("count", str(arg), None, pos)
        if func == "count":
            raise QueryError.at(pos, f"count() takes a Kleene variable, e.g. count({arg.var})")
        if arg.index is not None:
            raise QueryError.at(arg.pos, f"an aggregate takes the whole variable: write {func}({arg.var}.{arg.attr})")
        return ast.Aggregate(func, arg.var, arg.attr, pos)  # type: ignore[arg-type]


# -------------------------------------------------------------------- syntax error messages

_TERMINAL_TEXT = {
    "COMMA": "','", "RPAR": "')'", "LPAR": "'('", "DOT": "'.'", "LSQB": "'['", "RSQB": "']'",
    "PLUS": "'+'", "MINUS": "'-'", "STAR": "'*'", "SLASH": "'/'", "BANG": "'!'",
    "NUMBER": "a number", "STRING": "a string", "IDENT": "a name", "UNIT": "a time unit (us, ms, s, min, h, d)",
    "STRATEGY_NAME": "a strategy name such as skip_till_next_match", "_KW_PARTITION": "PARTITION BY",
    "$END": "end of query",
}
_OPERATORS = {"COMP_OP", "PLUS", "MINUS", "STAR", "SLASH"}
_ORDER = [
    "IDENT", "NUMBER", "STRING", "UNIT", "operator", "COMMA", "DOT", "LPAR", "RPAR", "LSQB", "RSQB", "PLUS", "STAR",
    "_KW_AND", "_KW_OR", "_KW_AS", "_KW_NAME", "_KW_LIVE", "_KW_PATTERN", "_KW_WHERE", "_KW_PARTITION",
    "_KW_BY", "_KW_STRATEGY", "STRATEGY_NAME", "_KW_WITHIN", "_KW_ARCHIVED", "_KW_LOOKBACK",
    "_KW_JOIN", "_KW_RETURN",
]


def _describe(name: str) -> str:
    if name == "operator":
        return "an operator"
    if name.startswith("_KW_"):
        return _TERMINAL_TEXT.get(name, name[4:])
    return _TERMINAL_TEXT.get(name, name)


def _expected(accepts: set[str]) -> str:
    if "BANG" in accepts:
        return "a component such as 'Type v' or 'SEQ(...)'"
    if {"NUMBER", "STRING", "IDENT", "LPAR"} <= accepts:
        return "an expression"
    if accepts == {"IDENT", "PLUS", "STAR"}:  # after a type name
        return "a variable name, or '+'/'*' for a Kleene closure"
    names = set(accepts)
    if names & _OPERATORS:
        names = (names - _OPERATORS) | {"operator"}
    ordered = sorted(names, key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))
    words = [_describe(n) for n in ordered if n != "$END"] + (["end of query"] if "$END" in names else [])
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _syntax_error(err: UnexpectedInput) -> QueryError:
    if isinstance(err, UnexpectedToken):
        tok = err.token
        try:
            accepts = set(err.interactive_parser.accepts())
        except Exception:  # pragma: no cover - lark could not simulate; fall back to the state's keys
            accepts = set(err.expected)
        if tok.type == "$END":
            line, col = (tok.end_line, tok.end_column) if tok.end_line else (tok.line or 1, tok.column or 1)
            return QueryError(f"unexpected end of query, expected {_expected(accepts)}", line, col)
        return QueryError(f"unexpected '{tok}', expected {_expected(accepts)}", tok.line, tok.column)
    if isinstance(err, UnexpectedCharacters):
        char = err.char
        reason = "unterminated string" if char in "'\"" else f"unexpected character '{char}'"
        return QueryError(reason, err.line, err.column)
    return QueryError(f"syntax error: {err}", getattr(err, "line", 0), getattr(err, "column", 0))


# -------------------------------------------------------------------- public entry points


def _check_depth(tree: Tree[Token], limit: int = MAX_DEPTH) -> None:
    """Raise a QueryError at the first node nested deeper than ``limit`` (iterative: no recursion)."""
    stack: list[tuple[Tree[Token], int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            meta = node.meta
            line, column = (meta.line, meta.column) if not meta.empty else (0, 0)
            reason = f"the query is nested too deeply (more than {limit} levels of patterns and operators)"
            raise QueryError(reason, line, column)
        # children pushed right to left: the leftmost node past the limit is the one reported
        stack.extend((child, depth + 1) for child in reversed(node.children) if isinstance(child, Tree))


def _run(text: str, start: str) -> tuple[Any, dict[str, tuple[PartitionRef, ...]]]:
    try:
        tree = _lark().parse(text, start=start)
    except UnexpectedInput as err:
        raise _syntax_error(err) from None
    _check_depth(tree)
    builder = _ToAst()
    try:
        return builder.transform(tree), builder.partitions
    except VisitError as err:
        if isinstance(err.orig_exc, QueryError):
            raise err.orig_exc from None
        raise


def parse_unchecked(text: str) -> ast.Query:
    """Parse LQL text into a syntax tree without the semantic checks (for tools and tests).

    Raises
    ------
    QueryError
        On a syntax error, with the line and column of the offending token.
    """
    query, _ = _run(text, "start")
    return query


def parse(text: str, schemas: ast.Schema | None = None) -> ast.Query:
    """Parse and check an LQL query.

    Parameters
    ----------
    text : str
        The query (DESIGN.md section 4; reference in docs/lql.md). Keywords are case-insensitive,
        ``--`` starts a comment that runs to the end of the line.
    schemas : dict, optional
        Event type name -> {attribute name -> type name}, type names being ``string``, ``int``,
        ``float``, ``bool`` or ``timestamp``. When given, event types, attributes and operand types
        are checked against it. ``ts`` (timestamp), ``id`` (int) and ``type`` (string) always exist.

    Returns
    -------
    PatternQuery or LiveArchivedQuery
        Durations (``within_us``, ``lookback_us``, duration literals) in int microseconds; every node
        carries the 1-based line and column of its first token.

    Raises
    ------
    QueryError
        On a syntax error or a failed semantic check: ``line``/``column`` point at the offending
        token, ``reason`` is one line.
    """
    query, partitions = _run(text, "start")
    check_query(query, schemas, partitions=partitions)
    return query


def parse_expression(text: str) -> ast.Expr:
    """Parse a lone LQL expression such as ``a.price * 2 > b[i-1].price`` (no checks).

    Raises
    ------
    QueryError
        On a syntax error or a malformed index/aggregate.
    """
    expr, _ = _run(text, "expr")
    return expr
