"""compile_query errors that the parser does not raise: strategy override, plan-level checks, LIVE/ARCHIVED text."""
from __future__ import annotations

import pytest

from engine.compiler import compile_query
from engine.lql.ast import STRATEGIES
from engine.lql.errors import QueryError
from engine.lql.parser import parse


def compile_error(text: str, **kw) -> QueryError:
    with pytest.raises(QueryError) as info:
        compile_query(text, **kw)
    err = info.value
    assert "\n" not in err.reason
    assert str(err) == f"line {err.line}, column {err.column}: {err.reason}"
    return err


def test_unknown_strategy_override_is_rejected():
    err = compile_error("PATTERN A a", strategy="greedy")
    assert "unknown strategy 'greedy'" in err.reason
    for name in STRATEGIES:
        assert name in err.reason
    # not a position in the text: the override comes from the command line
    assert (err.line, err.column) == (0, 0)


@pytest.mark.parametrize("override", ["skip-till-next-match", "STRICT_CONTIGUITY", "Partition-Contiguity"])
def test_strategy_override_accepts_dashes_and_any_case(override):
    q = compile_query("PATTERN A a STRATEGY skip_till_any_match", strategy=override)
    assert q.strategy == override.lower().replace("-", "_")


def test_a_condition_mentioning_two_negated_variables_is_rejected():
    text = "PATTERN SEQ(A a, !B n, !C m, D d)\nWHERE a.x > 0 AND n.p = m.p"
    parse(text)  # the parser accepts it
    err = compile_error(text)
    assert (err.line, err.column) == (2, 19)
    assert err.reason == "a condition may mention at most one negated variable"


def test_two_negated_variables_in_different_gaps_are_rejected_too():
    err = compile_error("PATTERN SEQ(A a, !B n, C c, !D m, E e) WHERE n.p < m.p")
    assert (err.line, err.column) == (1, 46)


def test_a_condition_on_two_negated_variables_of_different_or_branches_is_ignored():
    # no plan binds both n and m: the conjunct is ignored in each, as for absent positive variables
    q = compile_query("PATTERN SEQ(A a, OR(SEQ(!B n, C c), SEQ(!D m, E e))) WHERE n.p = m.p")
    assert len(q.plans) == 2


def test_live_and_archived_text_is_rejected():
    text = "LIVE PATTERN A a\nARCHIVED PATTERN B b\nLOOKBACK 1 h"
    parse(text)  # a valid live-and-archived query
    err = compile_error(text)
    assert "live-and-archived" in err.reason
    assert "lace replay" in err.reason
    assert (err.line, err.column) == (1, 1)


def test_live_and_archived_syntax_tree_is_rejected():
    ast = parse("NAME speeding\nLIVE PATTERN A a\nARCHIVED PATTERN B b\nLOOKBACK 1 h")
    err = compile_error(ast)  # type: ignore[arg-type]
    assert "live-and-archived" in err.reason


def test_too_many_and_interleavings_are_rejected():
    text = "PATTERN SEQ(A z,\n  AND(A a, B b, C c, D d, E e, F f))"
    parse(text)
    err = compile_error(text)
    assert "more than 256 alternatives" in err.reason
    assert (err.line, err.column) == (2, 3)


def test_parser_errors_come_through_compile_query_unchanged():
    err = compile_error("PATTERN SEQ(A a, )")
    assert (err.line, err.column) == (1, 18)
