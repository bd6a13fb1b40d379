"""Syntax-tree builders of the layered rules (003: ``FILTER``, ``AGGREGATE ... WINDOW``) and of ``INTERVAL``
(002, issue 15), part of the LQL parser (:mod:`engine.lql.parser`; docs/architecture.md section 7.9, reference
docs/lql.md).

Durations (COVER, MAX GAP, MIN DURATION, DROP DUPLICATE ... WITHIN, window sizes and slides) are int
microseconds; a COUNT window's size and slide are whole numbers of events from 1 to 1,000,000. The items of
DROP DUPLICATE, GROUP BY and PARTITION BY are kept as written (:class:`~engine.lql.checks.PartitionRef`) for the
checks' error positions. A malformed form raises :class:`~engine.lql.errors.QueryError` with its position.
"""
from __future__ import annotations

from typing import Any

from lark import Token, v_args
from lark.tree import Meta

from engine.lql import ast
from engine.lql.build_common import _DURATION_HINT, _clauses, _Duration, _number, _pos, _TreeBuilder
from engine.lql.checks import PartitionRef
from engine.lql.errors import QueryError


@v_args(meta=True)
class _RuleBuilders(_TreeBuilder):
    """FILTER, AGGREGATE and INTERVAL statements and their clauses (module docstring)."""

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
