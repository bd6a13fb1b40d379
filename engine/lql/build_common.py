"""What every part of the LQL syntax-tree builder shares (:mod:`engine.lql.parser`; docs/architecture.md
section 7.4, reference docs/lql.md).

The builder is a lark :class:`~lark.Transformer` over the parse tree of ``grammar.lark``, made of one class per
statement kind (:mod:`engine.lql.build_rules`, :mod:`engine.lql.build_exprs`, the pattern statements in
:mod:`engine.lql.parser`) over :class:`_TreeBuilder`: the clauses several statements use (WHERE, PARTITION BY and
GROUP BY items, RETURN), durations (int microseconds, at most :data:`engine.durations.MAX_DURATION_US`), node
positions (1-based line and column) and the PARTITION BY items as written (:class:`~engine.lql.checks.PartitionRef`,
for exact error positions). Every malformed form raises :class:`~engine.lql.errors.QueryError` with its position
and a one-line reason.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lark import Token, Transformer, v_args
from lark.tree import Meta

from engine.durations import MAX_DURATION_US, UNIT_US
from engine.lql import ast
from engine.lql.checks import PartitionRef
from engine.lql.errors import QueryError

_UNIT_US = UNIT_US  # one unit table for LQL, the CLI and the REST API
_DURATION_HINT = "expected a duration such as '10 min'"


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


@dataclass(frozen=True, slots=True)
class _Duration:
    us: int | None  # None: the number had no unit
    pos: ast.Pos  # where the duration text starts (the sign or the number)


def _first_child(self: Any, meta: Meta, ch: list[Any]) -> Any:
    return ch[0]


def _all_children(self: Any, meta: Meta, ch: list[Any]) -> tuple[Any, ...]:
    return tuple(ch)


@v_args(meta=True)
class _TreeBuilder(Transformer[Token, Any]):
    """The shared clauses, PARTITION BY items and durations of the syntax-tree builder (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.partitions: dict[str, tuple[PartitionRef, ...]] = {}
        self.statements: list[dict[str, tuple[PartitionRef, ...]]] = []  # per statement of a script

    return_clause = _all_children

    def where_clause(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, Any]:
        return ("WHERE", _pos(meta), ch[0])

    def partition_clause(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, Any]:
        return ("PARTITION BY", _pos(meta), list(ch))

    def partition_attr(self, meta: Meta, ch: list[Any]) -> PartitionRef:
        return PartitionRef(None, str(ch[0]), _pos(ch[0]))

    def partition_var_attr(self, meta: Meta, ch: list[Any]) -> PartitionRef:
        return PartitionRef(str(ch[0]), str(ch[1]), _pos(ch[0]))

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
