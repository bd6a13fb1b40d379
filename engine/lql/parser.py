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
from engine.lql.relations import make_relation, relation_expr

__all__ = ["parse", "parse_expression", "parse_script", "parse_unchecked"]

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
        start=["start", "script", "expr"],
        propagate_positions=True,
        maybe_placeholders=True,
    )


def _pos(item: Token | Meta) -> ast.Pos:
    return ast.Pos(getattr(item, "line", 0) or 0, getattr(item, "column", 0) or 0)


def _clauses(clauses: list[tuple[str, ast.Pos, Any]]) -> dict[str, Any]:
    """``{clause name: value}`` of a statement's ``(name, position, value)`` clauses, in any order.

    Raises
    ------
    QueryError
        At the second of two clauses with the same name (``duplicate WITHIN clause``).
    """
    seen: dict[str, Any] = {}
    for name, pos, value in clauses:
        if name in seen:
            raise QueryError.at(pos, f"duplicate {name} clause")
        seen[name] = value
    return seen


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
        self.statements: list[dict[str, tuple[PartitionRef, ...]]] = []  # per statement of a script

    name_clause = join_clause = component = _first_child
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
        name, query, emit = ch
        if emit is not None:
            if isinstance(query, ast.FilterRule):
                raise QueryError.at(_pos(emit), "a FILTER rule drops events and emits none: remove EMIT INTO")
            query = replace(query, emit_into=str(emit))
        self.statements.append(self.partitions)
        self.partitions = {}
        return replace(query, name=None if name is None else str(name), pos=_pos(meta))

    def script(self, meta: Meta, ch: list[Any]) -> list[ast.Query]:
        return [q for q in ch if q is not None]

    def emit_clause(self, meta: Meta, ch: list[Any]) -> Token:
        return ch[0]

    # ---------------------------------------------------------------- layered rules (003)
    def filter_rule(self, meta: Meta, ch: list[Any]) -> ast.FilterRule:
        type_tok, var_tok, *clauses = ch
        seen = _clauses(clauses)
        return ast.FilterRule(
            str(type_tok), str(var_tok), seen.get("DROP DUPLICATE"), seen.get("DROP WHEN"), pos=_pos(meta)
        )

    # ---------------------------------------------------------------- INTERVAL (issue 15)
    def interval_rule(self, meta: Meta, ch: list[Any]) -> ast.IntervalRule:
        type_tok, var_tok, *clauses, returns = ch
        seen = _clauses(clauses)
        if "COVER" not in seen:
            raise QueryError.at(_pos(meta), "INTERVAL needs COVER d: how long each event stands for (e.g. COVER 5 min)")
        partitions = tuple(seen.get("PARTITION BY") or ())
        self.partitions["query"] = partitions
        return ast.IntervalRule(
            type=str(type_tok),
            var=str(var_tok),
            when=seen.get("WHEN"),
            cover_us=seen["COVER"],
            max_gap_us=seen.get("MAX GAP"),
            min_duration_us=seen.get("MIN DURATION", 0),
            partition_by=tuple(p.attr for p in partitions),
            returns=tuple(returns or ()),
            pos=_pos(meta),
        )

    def when_clause(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, Any]:
        return ("WHEN", _pos(meta), ch[0])

    def cover_clause(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, int]:
        return ("COVER", _pos(meta), self._positive(ch[0], "COVER"))

    def max_gap_clause(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, int]:
        return ("MAX GAP", _pos(meta), self._non_negative(ch[0], "MAX GAP"))

    def min_duration_clause(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, int]:
        return ("MIN DURATION", _pos(meta), self._non_negative(ch[0], "MIN DURATION"))

    @staticmethod
    def _non_negative(duration: _Duration, clause: str) -> int:
        if duration.us is None:
            raise QueryError.at(duration.pos, f"{_DURATION_HINT} after {clause}")
        if duration.us < 0:
            raise QueryError.at(duration.pos, f"{clause} must not be negative")
        return duration.us

    def drop_duplicate(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, ast.DropDuplicate]:
        *items, within = ch
        self.partitions["duplicate"] = tuple(items)
        us = self._positive(within, "DROP DUPLICATE ... WITHIN")
        return ("DROP DUPLICATE", _pos(meta), ast.DropDuplicate(tuple(i.attr for i in items), us, _pos(meta)))

    def drop_when(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, Any]:
        return ("DROP WHEN", _pos(meta), ch[0])

    def aggregate_query(self, meta: Meta, ch: list[Any]) -> ast.AggregateQuery:
        type_tok, var_tok, *clauses, returns = ch
        seen = _clauses(clauses)
        window = seen.get("WINDOW")
        if window is None:
            raise QueryError.at(
                _pos(meta), "AGGREGATE needs a WINDOW clause (TUMBLING d, SLIDING d EVERY s or COUNT n)"
            )
        groups = tuple(seen.get("GROUP BY") or ())
        self.partitions["group"] = groups
        return ast.AggregateQuery(
            type=str(type_tok),
            var=str(var_tok),
            window=window,
            returns=tuple(returns),
            where=seen.get("WHERE"),
            group_by=tuple(g.attr for g in groups),
            having=seen.get("HAVING"),
            pos=_pos(meta),
        )

    def group_clause(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, list[PartitionRef]]:
        return ("GROUP BY", _pos(meta), list(ch))

    def having_clause(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, Any]:
        return ("HAVING", _pos(meta), ch[0])

    def window_tumbling(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, ast.WindowSpec]:
        size = self._positive(ch[0], "WINDOW TUMBLING")
        return ("WINDOW", _pos(meta), ast.WindowSpec("tumbling", size, size, _pos(meta)))

    def window_sliding(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, ast.WindowSpec]:
        size = self._positive(ch[0], "WINDOW SLIDING")
        slide = self._positive(ch[1], "EVERY")
        if slide > size:
            raise QueryError.at(
                ch[1].pos, "EVERY must not be longer than the window (events between windows would be lost)"
            )
        return ("WINDOW", _pos(meta), ast.WindowSpec("sliding", size, slide, _pos(meta)))

    def window_count(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, ast.WindowSpec]:
        size_tok, slide_tok = ch
        size = self._count(size_tok, "WINDOW COUNT")
        slide = size if slide_tok is None else self._count(slide_tok, "EVERY")
        if slide > size:
            raise QueryError.at(_pos(slide_tok), "EVERY must not be more events than the window holds")
        return ("WINDOW", _pos(meta), ast.WindowSpec("count", size, slide, _pos(meta)))

    @staticmethod
    def _count(tok: Token, clause: str) -> int:
        n = _number(tok)
        if not isinstance(n, int) or n < 1 or n > 1_000_000:
            raise QueryError.at(_pos(tok), f"{clause} needs a whole number of events from 1 to 1,000,000")
        return n

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
        seen = _clauses(clauses)
        where, partitions = seen.get("WHERE"), seen.get("PARTITION BY")
        strategy, within = seen.get("STRATEGY"), seen.get("WITHIN")
        plan = seen.get("PLAN")  # plans (issue 16): (name, position) of PLAN auto | nfa | tree
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
            **({"plan": plan[0], "plan_pos": plan[1]} if plan is not None else {}),
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

    # ---- plans (issue 16)
    def plan_clause(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, tuple[str, ast.Pos]]:
        tok = ch[0]
        name = str(tok).lower()
        if name not in ast.PLANS:
            raise QueryError.at(_pos(tok), f"unknown plan '{tok}' (use {', '.join(ast.PLANS)})")
        return ("PLAN", _pos(meta), (name, _pos(meta)))

    # ---- end of plans

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

    # ---------------------------------------------------------------- Allen's relations (issue 15)
    def seq_by(self, meta: Meta, ch: list[Any]) -> ast.Seq:
        *items, rel = ch
        return ast.Seq(tuple(items), _pos(meta), by=rel)

    def relation_spec(self, meta: Meta, ch: list[Any]) -> ast.Relation:
        word, *args = ch
        durations = [d for d in args if d is not None]
        us: list[int] = []
        for d in durations:
            if d.us is None:
                raise QueryError.at(d.pos, f"{_DURATION_HINT} as a tolerance of {str(word).upper()}")
            us.append(d.us)
        return make_relation(str(word), us, _pos(word), [d.pos for d in durations])

    def rel_var(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Index | None]:
        return (str(ch[0]), None)

    def rel_indexed(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Index | None]:
        return (str(ch[0]), ch[1])

    def relation(self, meta: Meta, ch: list[Any]) -> ast.Expr:
        left, rel, right = ch
        return relation_expr(rel, left, right, _pos(meta))

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

    def operator_component(self, meta: Meta, ch: list[Any]) -> ast.Component:
        """``name(Type, param, ...) v``: a component binding the composites of operator ``name``."""
        name_tok, *middle, var = ch
        name = str(name_tok).lower()
        pos = _pos(meta)
        plugin = _plugin("operator", name)
        if plugin is None:
            raise QueryError.at(pos, f"unknown operator '{name_tok}' (installed: {_installed('operator')})")
        if plugin.error is not None:
            raise QueryError.at(pos, f"operator '{name}' ({plugin.source}) is broken: {plugin.error}")
        factory = plugin.obj
        types = [str(t) for t in middle if isinstance(t, Token)]
        params = [p.value for p in middle if isinstance(p, ast.Literal)]
        if len(types) != factory.arity:
            raise QueryError.at(pos, f"operator '{name}' takes {factory.arity} event type(s): {plugin.signature}")
        declared = factory.params
        low = getattr(factory, "min_params", len(declared))
        if not low <= len(params) <= len(declared):
            want = f"{low} to {len(declared)}"
            raise QueryError.at(pos, f"operator '{name}' takes {want} parameter(s): {plugin.signature}")
        from engine.plugins.api import value_has_type

        for p, t, lit in zip(params, declared, [m for m in middle if isinstance(m, ast.Literal)], strict=False):
            if t == "duration" and not lit.is_duration:
                raise QueryError.at(lit.pos, f"operator '{name}' needs a duration here, e.g. 10 min")
            if not value_has_type(p, t):
                raise QueryError.at(lit.pos, f"operator '{name}' needs a parameter of type {t} here")
        use = ast.OperatorUse(name, tuple(types), tuple(params))
        return ast.Component("single", (use.derived_type,), str(var), pos, operator=use)

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


# -------------------------------------------------------------------- syntax error messages

_TERMINAL_TEXT = {
    "COMMA": "','", "RPAR": "')'", "LPAR": "'('", "DOT": "'.'", "LSQB": "'['", "RSQB": "']'",
    "PLUS": "'+'", "MINUS": "'-'", "STAR": "'*'", "SLASH": "'/'", "BANG": "'!'",
    "NUMBER": "a number", "STRING": "a string", "IDENT": "a name", "UNIT": "a time unit (us, ms, s, min, h, d)",
    "STRATEGY_NAME": "a strategy name such as skip_till_next_match", "_KW_PARTITION": "PARTITION BY",
    "$END": "end of query",
    "RELATION": "a relation such as BEFORE or OVERLAPS(0 s, 30 min)",
    "_KW_MAX_GAP": "MAX GAP", "_KW_MIN_DURATION": "MIN DURATION",
}
_OPERATORS = {"COMP_OP", "PLUS", "MINUS", "STAR", "SLASH"}
_ORDER = [
    "IDENT", "NUMBER", "STRING", "UNIT", "operator", "COMMA", "DOT", "LPAR", "RPAR", "LSQB", "RSQB", "PLUS", "STAR",
    "_KW_AND", "_KW_OR", "_KW_AS", "_KW_NAME", "_KW_LIVE", "_KW_PATTERN", "_KW_WHERE", "_KW_PARTITION",
    "_KW_BY", "_KW_STRATEGY", "STRATEGY_NAME", "_KW_WITHIN", "_KW_ARCHIVED", "_KW_LOOKBACK",
    "_KW_JOIN", "_KW_RETURN", "_KW_PLAN",
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


def _run(text: str, start: str) -> tuple[Any, Any]:
    try:
        tree = _lark().parse(text, start=start)
    except UnexpectedInput as err:
        raise _syntax_error(err) from None
    _check_depth(tree)
    builder = _ToAst()
    try:
        result = builder.transform(tree)
        return result, builder.statements if start == "script" else (builder.statements or [{}])[-1]
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
        The query (docs/architecture.md section 7.4; reference in docs/lql.md). Keywords are case-insensitive,
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


def parse_script(text: str, schemas: ast.Schema | None = None) -> list[ast.Query]:
    """Parse and check several LQL statements separated by ``;`` (a rule graph, 003).

    Each statement is checked as :func:`parse` does, against ``schemas`` extended, statement by
    statement, with the derived event types of the ``EMIT INTO`` statements before it (a statement may
    read the output of an earlier one only); positions are in the whole text.

    Raises
    ------
    QueryError
        On a syntax error or a failed check, with line and column in ``text``; also when two
        statements have the same NAME.
    """
    from engine.rules.derived import derived_schema

    queries, partitions = _run(text, "script")
    known = dict(schemas) if schemas is not None else None
    names: set[str] = set()
    for query, parts in zip(queries, partitions, strict=True):
        if query.name is not None:
            if query.name in names:
                raise QueryError.at(query.pos, f"two statements are named '{query.name}'")
            names.add(query.name)
        check_query(query, known, partitions=parts)
        if known is not None and query.emit_into is not None:
            known[query.emit_into] = derived_schema(query, known)
    return list(queries)


def parse_expression(text: str) -> ast.Expr:
    """Parse a lone LQL expression such as ``a.price * 2 > b[i-1].price`` (no checks).

    Raises
    ------
    QueryError
        On a syntax error or a malformed index/aggregate.
    """
    expr, _ = _run(text, "expr")
    return expr
