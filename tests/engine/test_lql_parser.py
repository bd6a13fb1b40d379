"""LQL text -> syntax tree: every construct, docs/architecture.md section 7.4's examples, case, comments, clashes."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.lql import ast
from engine.lql.ast import (
    Aggregate,
    And,
    AttrRef,
    BinOp,
    BoolOp,
    Compare,
    Component,
    Equivalence,
    Index,
    Literal,
    LiveArchivedQuery,
    Neg,
    Not,
    Or,
    PatternQuery,
    Pos,
    ReturnItem,
    Seq,
)
from engine.lql.parser import parse, parse_expression, parse_unchecked

MIN = 60_000_000
STOCK = {"Stock": {"symbol": "string", "price": "float", "volume": "int"}}
PASS = {"Pass": {"car": "string", "checkpoint": "string"}}


def nopos(node):
    """The node with every ``pos`` reset, to compare structure only."""
    if isinstance(node, tuple):
        return tuple(nopos(n) for n in node)
    if not dataclasses.is_dataclass(node) or isinstance(node, (Pos, Index)):
        return node
    changes = {f.name: nopos(getattr(node, f.name)) for f in dataclasses.fields(node) if f.name != "pos"}
    if any(f.name == "pos" for f in dataclasses.fields(node)):
        changes["pos"] = ast.NOPOS
    return dataclasses.replace(node, **changes)


def ref(var, attr, index=None):
    return AttrRef(var, attr, index)


def lit(value, duration=False):
    return Literal(value, is_duration=duration)


def where_of(text: str) -> ast.Expr:
    query = parse(f"PATTERN SEQ(A a, B+ b[], C c) WHERE {text}")
    assert isinstance(query, PatternQuery)
    return nopos(query.where)


# ------------------------------------------------------------------------ docs/architecture.md section 7.4 examples

REBOUND = """NAME rebound
PATTERN SEQ(Stock a, Stock+ b[], Stock c)
WHERE b[1].price < a.price AND b[i].price <= b[i-1].price AND c.price > a.price
PARTITION BY symbol
STRATEGY skip_till_next_match
WITHIN 1 hour
RETURN a.symbol AS symbol, a.price AS start_price, min(b.price) AS low, count(b) AS n, c.ts AS t"""

SPEEDING = """NAME speeding
LIVE     PATTERN SEQ(Pass p) WHERE p.checkpoint = 'B'
ARCHIVED PATTERN SEQ(Pass q) WHERE q.checkpoint = 'A'
         LOOKBACK 30 min
JOIN     p.car = q.car AND p.ts - q.ts < 20 min
RETURN   p.car AS car, q.ts AS entered, p.ts AS left"""


def test_rebound_example_builds_the_expected_tree():
    query = parse(REBOUND, STOCK)
    expected = PatternQuery(
        pattern=Seq(
            (
                Component("single", ("Stock",), "a"),
                Component("plus", ("Stock",), "b"),
                Component("single", ("Stock",), "c"),
            )
        ),
        where=BoolOp(
            "and",
            (
                Compare("<", ref("b", "price", Index("first")), ref("a", "price")),
                Compare("<=", ref("b", "price", Index("i")), ref("b", "price", Index("prev"))),
                Compare(">", ref("c", "price"), ref("a", "price")),
            ),
        ),
        partition_by=("symbol",),
        strategy="skip_till_next_match",
        within_us=3_600_000_000,
        returns=(
            ReturnItem(ref("a", "symbol"), "symbol"),
            ReturnItem(ref("a", "price"), "start_price"),
            ReturnItem(Aggregate("min", "b", "price"), "low"),
            ReturnItem(Aggregate("count", "b"), "n"),
            ReturnItem(ref("c", "ts"), "t"),
        ),
        name="rebound",
    )
    assert nopos(query) == expected


def test_rebound_example_positions():
    query = parse(REBOUND)
    assert isinstance(query, PatternQuery)
    assert query.pos == Pos(1, 1)
    assert query.pattern.pos == Pos(2, 9)
    assert [c.pos for c in ast.components(query.pattern)] == [Pos(2, 13), Pos(2, 22), Pos(2, 34)]
    assert isinstance(query.where, BoolOp)
    _, second, third = query.where.operands
    assert query.where.pos == Pos(3, 7)
    assert isinstance(second, Compare) and second.pos == Pos(3, 32)
    assert second.right.pos == Pos(3, 46)
    assert isinstance(third, Compare) and third.right.pos == Pos(3, 73)
    assert [r.pos for r in query.returns] == [Pos(7, 8), Pos(7, 28), Pos(7, 52), Pos(7, 73), Pos(7, 88)]
    assert query.returns[2].expr.pos == Pos(7, 52)


def test_speeding_example_builds_the_expected_tree():
    query = parse(SPEEDING, PASS)
    assert isinstance(query, LiveArchivedQuery)
    assert query.name == "speeding"
    assert query.pos == Pos(1, 1)
    assert query.lookback_us == 30 * MIN
    assert nopos(query.live) == PatternQuery(
        pattern=Seq((Component("single", ("Pass",), "p"),)),
        where=Compare("=", ref("p", "checkpoint"), lit("B")),
    )
    assert nopos(query.archived.where) == Compare("=", ref("q", "checkpoint"), lit("A"))
    assert query.live.pos == Pos(2, 10) and query.archived.pos == Pos(3, 10)
    assert nopos(query.join) == BoolOp(
        "and",
        (
            Compare("=", ref("p", "car"), ref("q", "car")),
            Compare("<", BinOp("-", ref("p", "ts"), ref("q", "ts")), lit(20 * MIN, True)),
        ),
    )
    assert [(r.alias, nopos(r.expr)) for r in query.returns] == [
        ("car", ref("p", "car")),
        ("entered", ref("q", "ts")),
        ("left", ref("p", "ts")),
    ]
    assert query.join is not None and query.join.pos == Pos(5, 10)


def test_live_archived_sides_take_every_clause_and_join_is_optional():
    query = parse(
        "LIVE PATTERN SEQ(A a, B b) WHERE a.x > 1 PARTITION BY k STRATEGY strict_contiguity WITHIN 5 s "
        "ARCHIVED PATTERN OR(C c, D d) PARTITION BY k WITHIN 2 min LOOKBACK 1 h RETURN a.x, c.y"
    )
    assert isinstance(query, LiveArchivedQuery)
    assert query.join is None and query.name is None
    assert query.live.strategy == "strict_contiguity" and query.live.within_us == 5_000_000
    assert query.live.partition_by == ("k",) and query.archived.partition_by == ("k",)
    assert query.archived.within_us == 2 * MIN and query.lookback_us == 3_600_000_000
    assert isinstance(query.archived.pattern, Or)
    assert [r.alias for r in query.returns] == ["a.x", "c.y"]


# ------------------------------------------------------------------------ patterns


@pytest.mark.parametrize(
    ("text", "component"),
    [
        ("Stock a", Component("single", ("Stock",), "a")),
        ("Stock+ b[]", Component("plus", ("Stock",), "b")),
        ("Stock * b [ ]", Component("star", ("Stock",), "b")),
        ("!Stock n", Component("neg", ("Stock",), "n")),
        ("ANY(Stock, Bond) x", Component("single", ("Stock", "Bond"), "x")),
        ("any(Stock,Bond)+ x[]", Component("plus", ("Stock", "Bond"), "x")),
        ("!ANY(Stock, Bond) n", Component("neg", ("Stock", "Bond"), "n")),
    ],
)
def test_each_component_form(text, component):
    query = parse_unchecked(f"PATTERN SEQ(Start s, {text}, End e)")
    assert isinstance(query, PatternQuery) and isinstance(query.pattern, Seq)
    assert nopos(query.pattern.items[1]) == component
    assert query.pattern.items[1].pos == Pos(1, 22)


def test_a_bare_component_means_a_one_element_seq():
    query = parse("PATTERN Pass p")
    assert isinstance(query, PatternQuery)
    assert query.pattern == Seq((Component("single", ("Pass",), "p", Pos(1, 9)),), Pos(1, 9))


def test_seq_and_or_nest():
    query = parse("PATTERN SEQ(A a, AND(B b, OR(C c, D+ d[])), SEQ(E e, !F f, G g))")
    assert isinstance(query, PatternQuery)
    assert nopos(query.pattern) == Seq(
        (
            Component("single", ("A",), "a"),
            And(
                (
                    Component("single", ("B",), "b"),
                    Or((Component("single", ("C",), "c"), Component("plus", ("D",), "d"))),
                )
            ),
            Seq((Component("single", ("E",), "e"), Component("neg", ("F",), "f"), Component("single", ("G",), "g"))),
        )
    )
    assert query.pattern.items[1].pos == Pos(1, 18)
    assert query.pattern.items[1].items[1].pos == Pos(1, 27)


def test_type_names_keep_their_case():
    query = parse("PATTERN SEQ(stockTick a, STOCK b)")
    assert [c.types for c in ast.components(query.pattern)] == [("stockTick",), ("STOCK",)]


def test_same_variable_in_two_or_branches_is_allowed():
    query = parse("PATTERN SEQ(A a, OR(B x, C x)) WHERE x.v > a.v")
    assert [c.var for c in ast.components(query.pattern)] == ["a", "x", "x"]


# ------------------------------------------------------------------------ clauses


@pytest.mark.parametrize(
    ("written", "strategy"),
    [
        ("skip_till_any_match", "skip_till_any_match"),
        ("SKIP_TILL_NEXT_MATCH", "skip_till_next_match"),
        ("strict-contiguity", "strict_contiguity"),
        ("Partition-Contiguity", "partition_contiguity"),
    ],
)
def test_strategy_names(written, strategy):
    assert parse(f"PATTERN A a STRATEGY {written}").strategy == strategy


def test_defaults_when_clauses_are_absent():
    query = parse("PATTERN A a")
    assert query == PatternQuery(query.pattern, pos=Pos(1, 1))
    assert query.strategy == ast.DEFAULT_STRATEGY and query.within_us is None and query.returns == ()


def test_partition_by_several_attributes_with_or_without_variable():
    query = parse("PATTERN SEQ(A a, B b) PARTITION BY symbol, a.region, exchange")
    assert query.partition_by == ("symbol", "region", "exchange")


def test_return_aliases_default_to_the_normalized_expression():
    query = parse(
        "PATTERN SEQ(A a, B+ b[]) RETURN a.price, COUNT( b ), Min(b.price), b[LAST].price, b[1].x, b[3].x,"
        " (a.x+1)*2, a.x - (a.y - 1), -a.x, a.ts + 10 min, a.name = 'x', a.p AS custom"
    )
    assert [r.alias for r in query.returns] == [
        "a.price",
        "count(b)",
        "min(b.price)",
        "b[last].price",
        "b[1].x",
        "b[3].x",
        "(a.x + 1) * 2",
        "a.x - (a.y - 1)",
        "-a.x",
        "a.ts + 10 min",
        "a.name = 'x'",
        "custom",
    ]


@pytest.mark.parametrize("func", ["count", "sum", "avg", "min", "max", "first", "last"])
def test_every_aggregate(func):
    arg = "b" if func == "count" else "b.price"
    query = parse(f"PATTERN SEQ(A a, B+ b[]) RETURN {func.upper()}({arg}) AS v")
    assert nopos(query.returns[0].expr) == Aggregate(func, "b", None if func == "count" else "price")


# ------------------------------------------------------------------------ case, comments, durations


def test_keywords_are_case_insensitive():
    lower = parse(REBOUND.lower().replace("stock", "Stock"))
    mixed = parse(REBOUND.replace("PATTERN", "Pattern").replace("WHERE", "wHeRe").replace("AND", "and"))
    assert nopos(lower) == nopos(parse(REBOUND))
    assert nopos(mixed) == nopos(parse(REBOUND))
    speeding = SPEEDING
    for word in ("NAME", "LIVE", "PATTERN", "SEQ", "WHERE", "ARCHIVED", "LOOKBACK", "JOIN", "AND", "RETURN", " AS "):
        speeding = speeding.replace(word, word.lower() if len(word) % 2 else word.title())
    assert speeding != SPEEDING
    assert nopos(parse(speeding)) == nopos(parse(SPEEDING))
    assert parse("pattern seq(A a) where a.x = TRUE or NOT a.y = False").where is not None


def test_comments_and_free_whitespace():
    text = (
        "-- rebound, with comments\n"
        "PATTERN   SEQ( Stock a ,   -- the start\n"
        "\tStock+ b[] ,\n    Stock c )  WHERE a.note = '--not a comment' -- trailing\n"
        "WITHIN\n1\nhour -- done"
    )
    query = parse(text)
    assert query.pos == Pos(2, 1)
    assert [c.pos for c in ast.components(query.pattern)] == [Pos(2, 16), Pos(3, 2), Pos(4, 5)]
    assert nopos(query.where) == Compare("=", ref("a", "note"), lit("--not a comment"))
    assert query.within_us == 3_600_000_000


@pytest.mark.parametrize(
    ("unit", "us"),
    [
        ("us", 1), ("usec", 1), ("microsecond", 1), ("microseconds", 1),
        ("ms", 1_000), ("millisecond", 1_000), ("milliseconds", 1_000),
        ("s", 1_000_000), ("sec", 1_000_000), ("second", 1_000_000), ("seconds", 1_000_000),
        ("min", MIN), ("minute", MIN), ("minutes", MIN),
        ("h", 3_600_000_000), ("hour", 3_600_000_000), ("hours", 3_600_000_000),
        ("d", 86_400_000_000), ("day", 86_400_000_000), ("DAYS", 86_400_000_000),
    ],
)  # fmt: skip
def test_duration_units(unit, us):
    query = parse(f"PATTERN SEQ(A a, B b) WHERE b.ts - a.ts < 3 {unit} WITHIN 3 {unit}")
    assert query.within_us == 3 * us
    assert query.where.right == Literal(3 * us, Pos(1, 43), is_duration=True)


def test_fractional_durations_round_to_microseconds():
    assert parse("PATTERN A a WITHIN 1.5 h").within_us == 5_400_000_000
    assert parse("PATTERN A a WITHIN 2.5us").within_us == 2


# ------------------------------------------------------------------------ expressions


def test_precedence_from_or_down_to_unary_minus():
    assert where_of("a.x = 1 OR a.y = 2 AND NOT a.z = 3") == BoolOp(
        "or",
        (
            Compare("=", ref("a", "x"), lit(1)),
            BoolOp("and", (Compare("=", ref("a", "y"), lit(2)), Not(Compare("=", ref("a", "z"), lit(3))))),
        ),
    )
    assert where_of("a.x + 2 * -a.y > a.z / 4 - 1") == Compare(
        ">",
        BinOp("+", ref("a", "x"), BinOp("*", lit(2), Neg(ref("a", "y")))),
        BinOp("-", BinOp("/", ref("a", "z"), lit(4)), lit(1)),
    )
    assert where_of("(a.x + 2) * 3 = 9") == Compare("=", BinOp("*", BinOp("+", ref("a", "x"), lit(2)), lit(3)), lit(9))
    assert where_of("a.x - 1 - 2 = 0").left == BinOp("-", BinOp("-", ref("a", "x"), lit(1)), lit(2))


def test_boolean_operators_are_flattened():
    expr = where_of("a.x = 1 AND (a.y = 2 AND a.z = 3) AND c.w = 4")
    assert isinstance(expr, BoolOp) and expr.op == "and" and len(expr.operands) == 4
    assert len(where_of("a.x = 1 OR a.y = 2 OR a.z = 3").operands) == 3


@pytest.mark.parametrize(
    ("written", "op"),
    [("=", "="), ("==", "="), ("!=", "!="), ("<>", "!="), ("<", "<"), ("<=", "<="), (">", ">"), (">=", ">=")],
)
def test_comparison_operators(written, op):
    assert where_of(f"a.x {written} 1") == Compare(op, ref("a", "x"), lit(1))


def test_literals():
    assert parse_expression("12") == Literal(12, Pos(1, 1))
    assert parse_expression("1.25") == Literal(1.25, Pos(1, 1))
    assert parse_expression("2e3") == Literal(2000.0, Pos(1, 1))
    assert parse_expression("'abc'") == Literal("abc", Pos(1, 1))
    assert parse_expression('"abc"') == Literal("abc", Pos(1, 1))
    assert parse_expression(r"'it\'s a \\ \"q\"'") == Literal("it's a \\ \"q\"", Pos(1, 1))
    assert parse_expression(r'"say \"hi\""') == Literal('say "hi"', Pos(1, 1))
    assert parse_expression("TRUE") == Literal(True, Pos(1, 1))
    assert parse_expression("false") == Literal(False, Pos(1, 1))
    assert parse_expression("10 min") == Literal(10 * MIN, Pos(1, 1), is_duration=True)


@pytest.mark.parametrize(
    ("written", "index"),
    [("i", Index("i")), ("I", Index("i")), ("i-1", Index("prev")), ("i - 1", Index("prev")),
     ("1", Index("first")), ("2", Index("at", 2)), ("17", Index("at", 17)), ("last", Index("last"))],
)  # fmt: skip
def test_kleene_indexes(written, index):
    assert parse_expression(f"b[{written}].price") == AttrRef("b", "price", index, Pos(1, 1))


def test_equivalence_and_attribute_positions():
    query = parse("PATTERN SEQ(A a, B b)\nWHERE [symbol] AND\n  a.x > 1")
    assert query.where == BoolOp(
        "and",
        (
            Equivalence("symbol", Pos(2, 7)),
            Compare(">", AttrRef("a", "x", None, Pos(3, 3)), Literal(1, Pos(3, 9)), Pos(3, 3)),
        ),
        Pos(2, 7),
    )


def test_not_and_neg_positions():
    expr = parse_expression("NOT  -a.x > 1")
    assert isinstance(expr, Not) and expr.pos == Pos(1, 1)
    assert isinstance(expr.operand, Compare) and expr.operand.pos == Pos(1, 6)
    assert isinstance(expr.operand.left, Neg) and expr.operand.left.operand.pos == Pos(1, 7)


# ------------------------------------------------------------------------ keyword / identifier clashes


def test_aggregate_and_index_words_as_variable_and_attribute_names():
    query = parse(
        "PATTERN SEQ(Stock min, Stock+ last[], Stock count) "
        "WHERE last[last].count > min.min AND count.first = 1 AND min.last < last[i].max "
        "RETURN min(last.price), max(last.min), last(last.last), count(last), min.type, count.avg"
    )
    assert [c.var for c in ast.components(query.pattern)] == ["min", "last", "count"]
    assert nopos(query.where.operands[0]) == Compare(">", ref("last", "count", Index("last")), ref("min", "min"))
    assert nopos(query.where.operands[1].left) == ref("count", "first")
    assert [nopos(r.expr) for r in query.returns] == [
        Aggregate("min", "last", "price"),
        Aggregate("max", "last", "min"),
        Aggregate("last", "last", "last"),
        Aggregate("count", "last"),
        ref("min", "type"),
        ref("count", "avg"),
    ]


def test_keywords_after_a_dot_are_attribute_names():
    expr = where_of("a.where = a.and AND a.pattern < a.within AND a.not = a.or")
    assert nopos(expr.operands[0]) == Compare("=", ref("a", "where"), ref("a", "and"))
    assert nopos(expr.operands[2]) == Compare("=", ref("a", "not"), ref("a", "or"))


def test_keyword_prefixes_are_plain_names():
    expr = where_of("a.notes = 1 AND a.order = a.android")
    assert nopos(expr.operands[1]) == Compare("=", ref("a", "order"), ref("a", "android"))


def test_time_units_versus_names():
    query = parse(
        "PATTERN SEQ(Min min, S s, H h, D+ d[]) WHERE s.ts - min.ts < 10 min AND h.s > 2 s WITHIN 1 min "
        "RETURN min(d.h), min.d AS d"
    )
    assert [c.types[0] for c in ast.components(query.pattern)] == ["Min", "S", "H", "D"]
    assert [nopos(r.expr) for r in query.returns] == [Aggregate("min", "d", "h"), ref("min", "d")]
    assert nopos(query.where.operands[0].right) == lit(10 * MIN, True)
    assert nopos(query.where.operands[1]) == Compare(">", ref("h", "s"), lit(2_000_000, True))
    assert query.within_us == MIN
    # a Kleene variable named like a unit
    kleene = parse("PATTERN SEQ(A a, B+ ms[]) WHERE ms[i].v > 5 ms RETURN count(ms) AS n")
    assert nopos(kleene.where) == Compare(">", ref("ms", "v", Index("i")), lit(5_000, True))


def test_minus_minus_is_a_comment_but_minus_space_minus_is_not():
    assert nopos(parse_expression("a.x - -1")) == BinOp("-", ref("a", "x"), Neg(lit(1)))
    assert nopos(parse_expression("a.x --1")) == ref("a", "x")


# ------------------------------------------------------------------------ schemas


def test_schema_valid_queries_pass():
    schemas = {
        "Stock": {"symbol": "string", "price": "float", "volume": "int", "halted": "bool", "listed": "timestamp"},
        "Bond": {"symbol": "string", "price": "int"},
    }
    query = parse(
        "PATTERN SEQ(ANY(Stock, Bond) x, Stock+ b[], !Bond n) "
        "WHERE x.price > 1 AND b[i].volume >= b[i-1].volume * 2 AND b[1].halted = false AND n.symbol = x.symbol "
        "AND b[last].listed < x.ts + 5 s AND b[1].ts - x.ts <= 1 h AND x.ts > 0 AND [symbol] "
        "PARTITION BY symbol WITHIN 1 h "
        "RETURN x.symbol, min(b.symbol), max(b.price), sum(b.volume), avg(b.price), first(b.listed), x.type, x.id",
        schemas,
    )
    assert isinstance(query, PatternQuery) and len(query.returns) == 8


# ------------------------------------------------------------------------ round trip of expression text

_leaf = st.one_of(
    st.integers(0, 99).map(Literal),
    st.sampled_from(["a", "b"]).flatmap(lambda v: st.sampled_from(["x", "count", "min"]).map(lambda f: AttrRef(v, f))),
    st.sampled_from([1, 2, 5]).map(lambda k: AttrRef("k", "p", Index("first") if k == 1 else Index("at", k))),
)


def _arith(children):
    return st.one_of(
        st.builds(BinOp, st.sampled_from(["+", "-", "*", "/"]), children, children),
        st.builds(Neg, children),
    )


_numbers = st.recursive(_leaf, _arith, max_leaves=6)
_compare = st.builds(Compare, st.sampled_from(["=", "!=", "<", "<=", ">", ">="]), _numbers, _numbers)
_conditions = st.recursive(
    _compare,
    lambda c: st.one_of(
        st.builds(Not, c),
        st.builds(BoolOp, st.sampled_from(["and", "or"]), st.tuples(c, c)),
    ),
    max_leaves=4,
)


def _flatten(expr):
    """BoolOp flattening the parser does, applied to a generated tree."""
    if isinstance(expr, BoolOp):
        out = []
        for operand in (_flatten(o) for o in expr.operands):
            out.extend(operand.operands if isinstance(operand, BoolOp) and operand.op == expr.op else [operand])
        return BoolOp(expr.op, tuple(out))
    if isinstance(expr, Not):
        return Not(_flatten(expr.operand))
    return expr


@settings(max_examples=200, deadline=None)
@given(_conditions)
def test_expression_text_parses_back_to_the_same_tree(expr):
    text = ast.expr_text(expr)
    assert nopos(parse_expression(text)) == _flatten(expr), text


def test_pattern_clauses_may_come_in_any_order():
    a = parse("PATTERN SEQ(A a, B b) WHERE a.x < b.x PARTITION BY k STRATEGY skip_till_next_match WITHIN 1 s")
    b = parse("PATTERN SEQ(A a, B b) WITHIN 1 s STRATEGY skip_till_next_match PARTITION BY k WHERE a.x < b.x")
    assert nopos(a) == nopos(b)
    assert b.within_us == 1_000_000 and b.strategy == "skip_till_next_match" and b.partition_by == ("k",)


def test_parser_cache_saves_loads_and_survives_a_bad_file(tmp_path, monkeypatch):
    """The LQL parser is saved in LACE_CACHE_DIR once built and loaded from there next time; a truncated or foreign
    file there is ignored (the parser is built again and the file replaced); an empty LACE_CACHE_DIR: no cache."""
    from engine.lql import parser as p

    text = "PATTERN SEQ(A a, B b) WHERE a.x > 1 WITHIN 5 s"
    expected = p.parse(text)
    monkeypatch.setenv("LACE_CACHE_DIR", str(tmp_path))
    p._lark.cache_clear()
    try:
        assert p.parse(text) == expected  # built, then saved
        (saved,) = tmp_path.glob("lql-parser-*.pickle")
        p._lark.cache_clear()
        assert p.parse(text) == expected  # loaded
        saved.write_bytes(saved.read_bytes()[:100])
        p._lark.cache_clear()
        assert p.parse(text) == expected  # truncated: built and saved again
        assert saved.stat().st_size > 100 and len(list(tmp_path.iterdir())) == 1
        monkeypatch.setenv("LACE_CACHE_DIR", "")
        assert p._parser_cache("grammar") is None
    finally:
        p._lark.cache_clear()
