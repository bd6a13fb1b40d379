"""One-line messages for LQL syntax errors (:mod:`engine.lql.parser`; docs/lql.md "Errors"): lark's
:class:`~lark.exceptions.UnexpectedInput` becomes a :class:`~engine.lql.errors.QueryError` at the 1-based line and
column of the offending token, naming what was expected in words (``unexpected ')', expected an expression``).
"""
from __future__ import annotations

from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from engine.lql.errors import QueryError

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
