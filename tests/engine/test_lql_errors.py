"""Every LQL error: the exact line and column of the offending token and the reason."""
from __future__ import annotations

import pytest

from engine.lql.errors import QueryError
from engine.lql.parser import parse

SCHEMAS = {
    "Stock": {"symbol": "string", "price": "float", "volume": "int", "halted": "bool"},
    "Bond": {"symbol": "string", "rate": "float"},
}
LA = "LIVE PATTERN A a\nARCHIVED PATTERN B b\nLOOKBACK 1 h\n"  # JOIN goes on line 4


def error(text: str, schemas=None) -> QueryError:
    with pytest.raises(QueryError) as info:
        parse(text, schemas)
    return info.value


def check(text: str, line: int, column: int, reason: str, schemas=None) -> None:
    err = error(text, schemas)
    assert (err.line, err.column) == (line, column), err.reason
    assert reason in err.reason
    assert "\n" not in err.reason
    assert str(err) == f"line {line}, column {column}: {err.reason}"


# ------------------------------------------------------------------------ syntax


def test_unexpected_token_says_what_was_expected():
    check("PATTERN SEQ(Stock a, )", 1, 22, "unexpected ')', expected a component such as 'Type v'")


def test_unexpected_end_points_after_the_last_token():
    check("PATTERN SEQ(A a", 1, 16, "unexpected end of query, expected ',' or ')'")


def test_misspelled_clause_keyword_lists_the_clauses():
    err = error("PATTERN A a\nWHER a.x > 1")
    assert (err.line, err.column) == (2, 1)
    assert err.reason.startswith("unexpected 'WHER', expected WHERE, PARTITION BY, STRATEGY, WITHIN, RETURN")


def test_unexpected_operand_after_an_expression():
    check("PATTERN A a\nWHERE a.x a.y", 2, 11, "unexpected 'a', expected an operator, AND, OR")


def test_unknown_time_unit_or_misspelled_keyword_after_a_number():
    check("PATTERN A a\nWITHIN 10 m", 2, 11, "unexpected 'm', expected a time unit (us, ms, s, min, h, d)")
    check("PATTERN A a\nWHERE a.x > 5 ADN a.y > 1", 2, 15, "unexpected 'ADN', expected a time unit (us, ms, s, min, h")


def test_within_needs_a_unit():
    check("PATTERN A a\nWITHIN 10", 2, 8, "expected a duration such as '10 min'")


def test_lookback_needs_a_unit():
    check("LIVE PATTERN A a\nARCHIVED PATTERN B b\nLOOKBACK 30\nJOIN a.x = b.x", 3, 10, "expected a duration such as")


def test_within_must_be_positive():
    check("PATTERN A a WITHIN 0 s", 1, 20, "WITHIN must be a duration greater than zero")
    check("PATTERN A a WITHIN -5 min", 1, 20, "WITHIN must be a duration greater than zero")


def test_lookback_must_be_positive():
    check("LIVE PATTERN A a ARCHIVED PATTERN B b LOOKBACK 0 min JOIN a.x = b.x", 1, 48, "LOOKBACK must be a duration")


def test_unterminated_string():
    check("PATTERN A a\nWHERE a.x = 'abc", 2, 13, "unterminated string")


def test_unexpected_character():
    check("PATTERN A a\nWHERE a.x # 1", 2, 11, "unexpected character '#'")


def test_unknown_strategy():
    check("PATTERN A a\nSTRATEGY greedy", 2, 10, "unknown strategy 'greedy'")


@pytest.mark.parametrize(
    ("index", "reason"),
    [("j", "unknown index 'j'"), ("i-2", "only i-1 is allowed"), ("0", "must be a whole number from 1")],
)
def test_bad_kleene_index(index, reason):
    check(f"PATTERN SEQ(A a, B+ b[])\nWHERE b[{index}].x > 1", 2, 9, reason)


@pytest.mark.parametrize(
    ("call", "column", "reason"),
    [
        ("median(b.x)", 8, "unknown function 'median'"),
        ("sum(b)", 8, "sum() needs an attribute"),
        ("count(b.x)", 8, "count() takes a Kleene variable"),
        ("sum(b[1].x)", 12, "an aggregate takes the whole variable"),
    ],
)
def test_malformed_aggregate(call, column, reason):
    check(f"PATTERN SEQ(A a, B+ b[])\nRETURN {call}", 2, column, reason)


def test_attribute_without_variable():
    check("PATTERN A a\nWHERE price > 1", 2, 7, "'price' needs its variable, e.g. v.price")


def test_negation_cannot_be_kleene():
    check("PATTERN SEQ(A a, !B+ b[])", 1, 18, "a negation cannot be a Kleene closure")


# ------------------------------------------------------------------------ variables


def test_unknown_variable_in_where():
    check("PATTERN SEQ(A a, B b)\nWHERE a.x > c.x", 2, 13, "unknown variable 'c'")


def test_unknown_variable_in_return_and_in_an_aggregate():
    check("PATTERN SEQ(A a, B b)\nRETURN a.x, z.y", 2, 13, "unknown variable 'z'")
    check("PATTERN SEQ(A a, B b)\nRETURN count(z)", 2, 8, "unknown variable 'z'")


def test_unknown_variable_in_partition_by():
    check("PATTERN SEQ(A a, B b)\nPARTITION BY a.k, z.k", 2, 19, "unknown variable 'z'")


def test_unknown_variable_in_join():
    check(LA + "JOIN a.x = b.x AND c.y = 1", 4, 20, "unknown variable 'c'")


def test_a_side_where_sees_only_its_own_variables():
    check(
        "LIVE PATTERN A a WHERE a.x = b.x\nARCHIVED PATTERN B b\nLOOKBACK 1 h\nJOIN a.x = b.x",
        1,
        30,
        "unknown variable 'b': the LIVE pattern's WHERE sees only its own variables",
    )


def test_duplicate_variable_in_seq_and_in_and():
    check("PATTERN SEQ(A a, B a)", 1, 18, "duplicate variable 'a'")
    check("PATTERN AND(A a, SEQ(B b, C a))", 1, 27, "duplicate variable 'a'")


def test_or_branches_must_agree_on_the_kind_of_a_shared_variable():
    check("PATTERN OR(A x, B+ x[])", 1, 17, "variable 'x' is declared as single and as kleene")


def test_kleene_variable_needs_an_index_in_where():
    check("PATTERN SEQ(A a, B+ b[])\nWHERE b.x > a.x", 2, 7, "Kleene variable 'b' needs an index such as b[i] or b[1]")


def test_kleene_variable_needs_an_index_or_aggregate_in_return():
    check("PATTERN SEQ(A a, B+ b[])\nRETURN b.x", 2, 8, "needs an index such as b[1] or an aggregate such as count(b)")


def test_single_or_negated_variable_cannot_be_indexed():
    check("PATTERN SEQ(A a, B b)\nWHERE a[i].x > 1", 2, 7, "'a' is not a Kleene variable and cannot be indexed")
    check("PATTERN SEQ(A a, !N n, B b)\nWHERE n[1].x > 1", 2, 7, "'n' is not a Kleene variable")


def test_aggregate_needs_a_kleene_variable():
    check("PATTERN SEQ(A a, B b)\nRETURN max(a.x)", 2, 8, "max() needs a Kleene variable; 'a' is not one")


def test_aggregates_only_in_return():
    check("PATTERN SEQ(A a, B+ b[])\nWHERE count(b) > 2", 2, 7, "aggregates are only allowed in RETURN")
    check(
        "LIVE PATTERN SEQ(A a, B+ b[])\nARCHIVED PATTERN C c\nLOOKBACK 1 h\nJOIN count(b) > c.n",
        4,
        6,
        "aggregates are only allowed in RETURN",
    )


def test_one_conjunct_iterates_one_kleene_variable():
    check(
        "PATTERN SEQ(A+ a[], B+ b[])\nWHERE a[1].x > 0 AND\n      b[i].x > a[i].x",
        3,
        16,
        "a condition can index only one Kleene variable with i (found 'b' and 'a')",
    )


def test_two_kleene_variables_iterated_in_separate_conjuncts_are_fine():
    query = parse("PATTERN SEQ(A+ a[], B+ b[]) WHERE a[i].x > a[i-1].x AND b[i].x > b[i-1].x AND b[1].x > a[last].x")
    assert query.where is not None


def test_iteration_index_only_in_where():
    check("PATTERN SEQ(A a, B+ b[])\nRETURN b[i].x", 2, 8, "b[i].x is only allowed in WHERE")
    check(LA.replace("B b", "B+ b[]") + "JOIN a.x = b[i-1].x", 4, 12, "b[i-1].x is only allowed in WHERE")


# ------------------------------------------------------------------------ pattern shape


def test_pattern_cannot_start_with_a_negation():
    check("PATTERN SEQ(!N n, A a)", 1, 13, "a pattern cannot start with a negation")
    check("PATTERN SEQ(SEQ(!N n, A a), B b)", 1, 17, "a pattern cannot start with a negation")
    check("PATTERN SEQ(A* s[], !N n, B b) WITHIN 1 h", 1, 21, "a pattern cannot start with a negation")


def test_pattern_of_negations_only():
    check("PATTERN SEQ(!N n)", 1, 9, "a pattern needs at least one event that is not negated")
    check("PATTERN !N n", 1, 9, "a pattern needs at least one event that is not negated")


def test_negation_only_inside_seq():
    check("PATTERN SEQ(A a, AND(B b, !N n)) WITHIN 1 h", 1, 27, "negation is only allowed inside SEQ")
    check("PATTERN SEQ(A a, OR(!N n, B b))", 1, 21, "negation is only allowed inside SEQ")


def test_trailing_negation_needs_within():
    check("PATTERN SEQ(A a,\n  !N n)", 2, 3, "a trailing negation needs WITHIN")
    check("PATTERN SEQ(A a, !N n, B* b[])", 1, 18, "a trailing negation needs WITHIN")
    check("PATTERN SEQ(A a, SEQ(B b, !N n))", 1, 27, "a trailing negation needs WITHIN")


def test_trailing_negation_with_within_and_inner_negation_are_fine():
    assert parse("PATTERN SEQ(A a, !N n) WITHIN 10 s").within_us == 10_000_000
    assert parse("PATTERN AND(SEQ(A a, !N n, B b), C+ c[])") is not None


def test_negated_variable_not_in_return_or_join():
    check("PATTERN SEQ(A a, !N n, B b)\nRETURN n.x", 2, 8, "negated variable 'n' cannot be used in RETURN")
    check(
        "LIVE PATTERN SEQ(A a, !N n, B b)\nARCHIVED PATTERN C c\nLOOKBACK 1 h\nJOIN n.x = c.x",
        4,
        6,
        "negated variable 'n' cannot be used in JOIN",
    )


@pytest.mark.parametrize(
    ("clause", "line", "column"),
    [("WHERE a.x > 1 OR [k]", 2, 18), ("WHERE NOT [k]", 2, 11), ("RETURN [k]", 2, 8)],
)
def test_equivalence_only_as_a_top_level_where_conjunct(clause, line, column):
    check(f"PATTERN SEQ(A a, B b)\n{clause}", line, column, "[k] is only allowed as a top-level AND condition")


# ------------------------------------------------------------------------ types


def test_unknown_event_type():
    check("PATTERN SEQ(Stock a, Stok b)", 1, 22, "unknown event type 'Stok'", SCHEMAS)
    check("PATTERN SEQ(Stock a, ANY(Bond, Fund) b)", 1, 22, "unknown event type 'Fund'", SCHEMAS)


def test_unknown_attribute():
    check("PATTERN SEQ(Stock a, Stock b)\nWHERE a.prise > 1", 2, 7, "type 'Stock' has no attribute 'prise'", SCHEMAS)
    check("PATTERN SEQ(Stock a, Bond b)\nRETURN b.volume", 2, 8, "event type 'Bond' has no attribute 'volume'", SCHEMAS)


def test_any_variable_attribute_must_exist_in_every_type():
    check(
        "PATTERN SEQ(ANY(Stock, Bond) x, Stock s)\nWHERE x.price > 1",
        2,
        7,
        "event type 'Bond' has no attribute 'price'",
        SCHEMAS,
    )


@pytest.mark.parametrize(
    ("condition", "reason", "schemas"),
    [
        ("a.symbol = 1", "cannot compare string with int", SCHEMAS),
        ("a.halted > 0.5", "cannot compare bool with float", SCHEMAS),
        ("a.ts = 'x'", "cannot compare timestamp with string", None),
        ("a.ts > 1.5", "cannot compare timestamp with float", None),
        ("a.price < true", "cannot compare float with bool", SCHEMAS),
    ],
)
def test_incompatible_comparison(condition, reason, schemas):
    check(f"PATTERN SEQ(Stock a, Stock b)\nWHERE {condition}", 2, 7, reason, schemas)


def test_timestamps_compare_with_timestamps_durations_and_ints():
    query = parse(
        "PATTERN SEQ(Stock a, Stock b) WHERE a.ts < b.ts AND b.ts - a.ts < 5 min AND a.ts > 0 AND b.ts <= a.ts + 1 s",
        SCHEMAS,
    )
    assert query.where is not None


def test_arithmetic_on_a_string():
    check("PATTERN SEQ(Stock a, Stock b)\nWHERE a.price + a.symbol > 1", 2, 17, "arithmetic on a string", SCHEMAS)
    check("PATTERN A a WHERE a.x * 'k' > 1", 1, 25, "arithmetic on a string is not allowed")
    check("PATTERN SEQ(Stock a, Stock b)\nWHERE -a.symbol < 0", 2, 8, "arithmetic on a string", SCHEMAS)


@pytest.mark.parametrize("func", ["sum", "avg"])
def test_sum_and_avg_need_numbers(func):
    check(
        f"PATTERN SEQ(Stock a, Stock+ b[])\nRETURN {func}(b.symbol)",
        2,
        8,
        f"{func}() needs a number; 'b.symbol' is string",
        SCHEMAS,
    )


def test_min_and_max_accept_strings():
    query = parse("PATTERN SEQ(Stock a, Stock+ b[]) RETURN min(b.symbol), max(b.symbol)", SCHEMAS)
    assert [r.alias for r in query.returns] == ["min(b.symbol)", "max(b.symbol)"]


def test_partition_attribute_missing_from_a_type():
    check(
        "PATTERN SEQ(Stock a, Bond b)\nPARTITION BY symbol, volume",
        2,
        22,
        "PARTITION BY attribute 'volume' is missing from event type 'Bond'",
        SCHEMAS,
    )


def test_equivalence_attribute_missing_from_a_type():
    check("PATTERN SEQ(Stock a, Bond b)\nWHERE [volume]", 2, 7, "'volume' is missing from event type 'Bond'", SCHEMAS)


@pytest.mark.parametrize(
    ("condition", "column", "reason", "schemas"),
    [
        ("a.price + 1", 7, "WHERE needs a true/false condition, found a value of type number", None),
        ("5", 7, "WHERE needs a true/false condition, found a value of type int", None),
        ("a.price", 7, "WHERE needs a true/false condition, found a value of type float", SCHEMAS),
        ("a.price > 1 AND 'yes'", 23, "AND needs a true/false condition, found a value of type string", SCHEMAS),
        ("NOT a.price + 1", 11, "NOT needs a true/false condition", None),
    ],
)
def test_where_must_be_a_condition(condition, column, reason, schemas):
    check(f"PATTERN SEQ(Stock a, Stock b)\nWHERE {condition}", 2, column, reason, schemas)


# ------------------------------------------------------------------------ live and archived


def test_join_must_relate_both_sides():
    check(LA + "JOIN a.x = 1", 4, 6, "JOIN must relate the live and the archived pattern")


def test_join_must_be_a_condition():
    check(LA + "JOIN a.x + b.x", 4, 6, "JOIN needs a true/false condition")


def test_sides_cannot_share_a_variable():
    check(
        "LIVE PATTERN SEQ(A a, B b)\nARCHIVED PATTERN SEQ(C c, D b)\nLOOKBACK 1 h",
        2,
        27,
        "variable 'b' is declared in both the LIVE and the ARCHIVED pattern",
    )


# ------------------------------------------------------------------------ RETURN


def test_duplicate_return_name():
    check("PATTERN A a\nRETURN a.x AS v, a.y AS v", 2, 18, "duplicate RETURN name 'v'")


def test_a_clause_given_twice_is_an_error_at_the_second_one():
    check("PATTERN SEQ(A a, B b)\nWITHIN 1 s\nWITHIN 2 s", 3, 1, "duplicate WITHIN clause")


def test_a_bare_kleene_variable_in_join_suggests_first_or_last():
    text = "LIVE PATTERN SEQ(A a, B+ b[])\nARCHIVED PATTERN C c\nLOOKBACK 1 h\nJOIN b.x = c.x"
    check(text, 4, 6, "needs an index such as b[1] or b[last]")


def test_nesting_past_the_limit_is_a_query_error_at_the_level_that_passes_it() -> None:
    from engine.lql.parser import MAX_DEPTH, parse

    ok = "PATTERN " + "SEQ(" * 100 + "A a" + ")" * 100 + " WITHIN 1 min"
    parse(ok)  # deep but within the limit
    deep = "NAME q\nPATTERN " + "SEQ(" * 5000 + "A a" + ")" * 5000 + " WITHIN 1 min"
    with pytest.raises(QueryError) as e:
        parse(deep)
    assert "nested too deeply" in e.value.reason and str(MAX_DEPTH) in e.value.reason
    assert e.value.line == 2 and deep.splitlines()[1][e.value.column - 1 :].startswith("SEQ(")
    long_sum = "PATTERN SEQ(A a, A b) WHERE b.x > " + " + ".join(["a.x"] * 3000) + " WITHIN 1 min"
    with pytest.raises(QueryError) as e:
        parse(long_sum)
    assert e.value.line == 1 and e.value.column > 1
