"""Bad LIVE / ARCHIVED / LOOKBACK / JOIN queries: line, column and a one-line reason.

Complements tests/engine/test_lql_errors.py (LOOKBACK units and sign, unknown JOIN variables,
JOIN relating both sides, negated and aggregate JOIN operands, variables declared on both sides).
"""
from __future__ import annotations

import pytest

from engine.lql.errors import QueryError
from engine.lql.parser import parse

LA = "LIVE PATTERN A a\nARCHIVED PATTERN B b\nLOOKBACK 1 h\n"
SCHEMAS = {"A": {"x": "int", "s": "string"}, "B": {"x": "int"}}


@pytest.mark.parametrize(
    "text, line, column, reason",
    [
        ("LIVE PATTERN A a\nARCHIVED PATTERN B b\nJOIN a.x = b.x", 3, 1, "unexpected 'JOIN', expected"),
        ("LIVE PATTERN A a\nLOOKBACK 1 h", 2, 1, "unexpected 'LOOKBACK', expected ARCHIVED"),
        ("ARCHIVED PATTERN B b\nLOOKBACK 1 h", 1, 1, "unexpected 'ARCHIVED'"),
        (LA + "LOOKBACK 2 h", 4, 1, "unexpected 'LOOKBACK'"),
        ("LIVE PATTERN A a\nARCHIVED PATTERN B b LOOKBACK 1 h JOIN a.x = b.x WITHIN 5 s", 2, 50, "unexpected 'WITHIN'"),
        (LA + "RETURN c.x", 4, 8, "unknown variable 'c'"),
        (LA.replace("B b", "SEQ(B+ b[])") + "JOIN a.x = b.x", 4, 12, "Kleene variable 'b' needs an index"),
        (LA.replace("B b", "SEQ(B+ b[])") + "JOIN a.x = b[i].x", 4, 12, "b[i].x is only allowed in WHERE"),
        (
            "LIVE PATTERN A a\nARCHIVED PATTERN B b WHERE b.x = a.x\nLOOKBACK 1 h",
            2,
            34,
            "unknown variable 'a': the ARCHIVED pattern's WHERE sees only its own variables",
        ),
        (LA + "JOIN a.x = b.x AND [x]", 4, 20, "[x] is only allowed as a top-level AND condition of WHERE"),
        (LA + "JOIN sum(b.x) > 1", 4, 6, "aggregates are only allowed in RETURN"),
        (LA + "RETURN a.x AS v, b.x AS v", 4, 18, "duplicate RETURN name 'v'"),
    ],
)
def test_live_and_archived_errors_point_at_the_offending_token(text, line, column, reason):
    with pytest.raises(QueryError) as info:
        parse(text)
    err = info.value
    assert (err.line, err.column) == (line, column) and reason in err.reason, err
    assert "\n" not in err.reason


@pytest.mark.parametrize(
    "text, line, column, reason",
    [
        (LA + "JOIN a.x = b.y", 4, 12, "event type 'B' has no attribute 'y'"),
        (LA + "JOIN a.s = b.x", 4, 6, "cannot compare string with int"),
        ("LIVE PATTERN A a\nARCHIVED PATTERN C c\nLOOKBACK 1 h", 2, 18, "unknown event type 'C'"),
    ],
)
def test_with_schemas_join_operands_and_archived_types_are_checked(text, line, column, reason):
    with pytest.raises(QueryError) as info:
        parse(text, SCHEMAS)
    assert (info.value.line, info.value.column) == (line, column) and reason in info.value.reason
