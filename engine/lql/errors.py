"""Errors raised for bad LQL text."""
from __future__ import annotations


class QueryError(ValueError):
    """A query that cannot be parsed or fails a semantic check.

    Attributes
    ----------
    line, column : int
        1-based position of the offending token (0 when unknown).
    reason : str
        One line saying what is wrong, e.g. ``unknown variable 'x'``.

    ``str(err)`` is ``"line L, column C: reason"``.
    """

    def __init__(self, reason: str, line: int = 0, column: int = 0) -> None:
        self.reason = reason
        self.line = line
        self.column = column
        super().__init__(f"line {line}, column {column}: {reason}")

    @classmethod
    def at(cls, pos: object, reason: str) -> QueryError:
        """Build from any object with ``line`` and ``column`` (an ``ast.Pos``)."""
        return cls(reason, getattr(pos, "line", 0), getattr(pos, "column", 0))
