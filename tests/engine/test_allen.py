"""Issue 15: Allen's 13 relations (+ INCLUDES, COINCIDES, INTERSECTS) with Esper-style tolerances.

The exhaustive grid: every pair of proper intervals with endpoints in 0..6 (21 intervals, 441 pairs).
Exactly one of the 13 relations holds for each pair, the converse table holds, each relation equals its
textbook formula (written here, apart from engine/lql/relations.py), and `lace match` over a file with a
``ts_end`` column finds exactly the pairs of each relation.
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from engine.compiler import compile_query
from engine.events import Event
from engine.lql.ast import Relation
from engine.lql.errors import QueryError
from engine.lql.parser import parse
from engine.lql.relations import CONVERSE, relation_holds
from engine.matcher import Matcher

GRID = [(s, e) for s in range(7) for e in range(7) if s < e]
THIRTEEN = (
    "before", "after", "meets", "met_by", "overlaps", "overlapped_by", "starts", "started_by",
    "during", "contains", "finishes", "finished_by", "equals",
)
TEXTBOOK = {  # Allen 1983 on [s, e): a = (as, ae), b = (bs, be)
    "before": lambda a, b: a[1] < b[0],
    "after": lambda a, b: b[1] < a[0],
    "meets": lambda a, b: a[1] == b[0],
    "met_by": lambda a, b: b[1] == a[0],
    "overlaps": lambda a, b: a[0] < b[0] < a[1] < b[1],
    "overlapped_by": lambda a, b: b[0] < a[0] < b[1] < a[1],
    "starts": lambda a, b: a[0] == b[0] and a[1] < b[1],
    "started_by": lambda a, b: a[0] == b[0] and b[1] < a[1],
    "during": lambda a, b: b[0] < a[0] and a[1] < b[1],
    "contains": lambda a, b: a[0] < b[0] and b[1] < a[1],
    "finishes": lambda a, b: b[0] < a[0] and a[1] == b[1],
    "finished_by": lambda a, b: a[0] < b[0] and a[1] == b[1],
    "equals": lambda a, b: a == b,
    "intersects": lambda a, b: max(a[0], b[0]) < min(a[1], b[1]),
}
WORDS = {**{r: r.upper() for r in TEXTBOOK}, "includes": "INCLUDES", "coincides": "COINCIDES"}


def test_the_grid_has_21_intervals_and_441_pairs() -> None:
    assert len(GRID) == 21 and len(list(itertools.product(GRID, GRID))) == 441


@pytest.mark.parametrize("a,b", list(itertools.product(GRID, GRID)))
def test_exactly_one_relation_holds_and_it_is_its_formula(a: tuple[int, int], b: tuple[int, int]) -> None:
    held = [r for r in THIRTEEN if relation_holds(Relation(r), a, b)]
    assert len(held) == 1, (a, b, held)
    for r in THIRTEEN:
        assert relation_holds(Relation(r), a, b) == TEXTBOOK[r](a, b)
        assert relation_holds(Relation(r), a, b) == relation_holds(Relation(CONVERSE[r]), b, a)
    assert relation_holds(Relation("intersects"), a, b) == TEXTBOOK["intersects"](a, b)


def _grid_file(tmp_path: Path) -> Path:
    rows = ["id,type,ts,ts_end"]
    n = 0
    for kind in ("A", "B"):
        for s, e in GRID:
            n += 1
            rows.append(f"{n},{kind},{s},{e}")
    path = tmp_path / "grid.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("word", sorted(WORDS))
def test_lace_match_finds_exactly_the_pairs_of_each_relation(tmp_path: Path, word: str) -> None:
    events = _grid_file(tmp_path)
    query = tmp_path / "q.lql"
    query.write_text(f"PATTERN AND(A a, B b) WHERE a {WORDS[word]} b")
    result = CliRunner().invoke(
        app, ["match", "-q", str(query), "-e", str(events), "--ts-unit", "us", "--sort"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    found = set()
    for line in result.output.splitlines():
        m = json.loads(line)
        a, b = GRID[m["events"]["a"][0] - 1], GRID[m["events"]["b"][0] - 22]
        found.add((a, b))
        assert (m["start"], m["end"]) == (min(a[0], b[0]), max(a[1], b[1]))  # the hull
    name = {"includes": "contains", "coincides": "equals"}.get(word, word)
    expected = {(a, b) for a, b in itertools.product(GRID, GRID) if TEXTBOOK[name](a, b)}
    assert found == expected and expected


def test_a_match_interval_is_the_hull_and_within_bounds_it(tmp_path: Path) -> None:
    q = compile_query("PATTERN SEQ(A a, B b) WHERE a CONTAINS b WITHIN 10 us")
    m = Matcher(q)
    out = m.push(Event(1, "B", 5, {}, 6))  # b completes first: SEQ order is the matcher's (ts_end, id)
    out += m.push(Event(2, "A", 0, {}, 10))
    assert out == []  # a CONTAINS b needs a before b in SEQ: a ends after b
    q = compile_query("PATTERN AND(A a, B b) WHERE a CONTAINS b WITHIN 10 us")
    m = Matcher(q)
    out = m.push(Event(1, "B", 5, {}, 6)) + m.push(Event(2, "A", 0, {}, 10))
    assert [(x.start, x.end) for x in out] == [(0, 10)]
    m = Matcher(compile_query("PATTERN AND(A a, B b) WHERE a CONTAINS b WITHIN 9 us"))
    assert m.push(Event(1, "B", 5, {}, 6)) + m.push(Event(2, "A", 0, {}, 10)) == []  # hull 10 > 9


# ------------------------------------------------------------------ tolerances at the boundary deltas

T = 60_000_000  # 1 min


def _holds(text: str, a: tuple[int, int], b: tuple[int, int]) -> bool:
    q = compile_query(f"PATTERN AND(A a, B b) WHERE {text}")
    m = Matcher(q)
    first, second = sorted([(a, 1, "A"), (b, 2, "B")], key=lambda x: (x[0][1], x[1]))
    out = m.push(Event(first[1], first[2], *first[0][:1], {}, first[0][1]))
    out += m.push(Event(second[1], second[2], second[0][0], {}, second[0][1]))
    return len(out) == 1


BASE = 10 * T  # a sits at [BASE, BASE + 10 min); b moves by the delta
CASES = [
    # (text, expected at delta 0 / t / t + 1 us (T true, F false), b from the delta, relation, args)
    ("a BEFORE(1 min) b", "FTT", lambda d: (BASE + 10 * T + d, BASE + 30 * T), "before", (T,)),
    ("a BEFORE(0 s, 1 min) b", "TTF", lambda d: (BASE + 10 * T + d, BASE + 30 * T), "before", (0, T)),
    ("a AFTER(1 min) b", "FTT", lambda d: (BASE - 20 * T, BASE - d), "after", (T,)),
    ("a AFTER(0 s, 1 min) b", "TTF", lambda d: (BASE - 20 * T, BASE - d), "after", (0, T)),
    ("a MEETS(1 min) b", "TTF", lambda d: (BASE + 10 * T + d, BASE + 30 * T), "meets", (T,)),
    ("a MET_BY(1 min) b", "TTF", lambda d: (BASE - 20 * T, BASE - d), "met_by", (T,)),
    ("a OVERLAPS(1 min) b", "FTF", lambda d: (BASE + 10 * T - d, BASE + 30 * T), "overlaps", (T,)),
    ("a OVERLAPS(0 s, 1 min) b", "FTF", lambda d: (BASE + 10 * T - d, BASE + 30 * T), "overlaps", (0, T)),
    ("a OVERLAPPED_BY(1 min) b", "FTF", lambda d: (BASE - 20 * T, BASE + d), "overlapped_by", (T,)),
    ("a OVERLAPPED_BY(0 s, 1 min) b", "FTF", lambda d: (BASE - 20 * T, BASE + d), "overlapped_by", (0, T)),
    ("a STARTS(1 min) b", "TTF", lambda d: (BASE + d, BASE + 30 * T), "starts", (T,)),
    ("a STARTED_BY(1 min) b", "TTF", lambda d: (BASE + d, BASE + 5 * T), "started_by", (T,)),
    ("a DURING(1 min) b", "FTF", lambda d: (BASE - d, BASE + 10 * T + d), "during", (T,)),
    ("a DURING(0 s, 1 min) b", "TTF", lambda d: (BASE - d, BASE + 10 * T + d), "during", (0, T)),
    ("a DURING(0 s, 1 min, 0 s, 1 min) b", "TTF", lambda d: (BASE - d, BASE + 10 * T + 1), "during", (0, T, 0, T)),
    ("a CONTAINS(1 min) b", "FTF", lambda d: (BASE + d, BASE + 10 * T - d), "contains", (T,)),
    ("a INCLUDES(0 s, 1 min) b", "TTF", lambda d: (BASE + d, BASE + 10 * T - d), "contains", (0, T)),
    ("a CONTAINS(0 s, 1 min, 0 s, 1 min) b", "TTF", lambda d: (BASE + 1, BASE + 10 * T - d), "contains", (0, T, 0, T)),
    ("a FINISHES(1 min) b", "TTF", lambda d: (BASE - 5 * T, BASE + 10 * T + d), "finishes", (T,)),
    ("a FINISHED_BY(1 min) b", "TTF", lambda d: (BASE + 5 * T, BASE + 10 * T + d), "finished_by", (T,)),
    ("a EQUALS(1 min) b", "TTF", lambda d: (BASE + d, BASE + 10 * T + d), "equals", (T,)),
    ("a COINCIDES(1 min) b", "TTF", lambda d: (BASE - d, BASE + 10 * T - d), "equals", (T,)),
    ("a COINCIDES(1 min, 1 min) b", "TTF", lambda d: (BASE + d, BASE + 10 * T), "equals", (T, T)),
]


@pytest.mark.parametrize("text,expected,make_b,name,args", CASES, ids=[c[0] for c in CASES])
def test_each_tolerance_form_at_the_boundary_deltas(text, expected, make_b, name, args) -> None:
    a = (BASE, BASE + 10 * T)
    for delta, want in zip((0, T, T + 1), expected, strict=True):
        b = make_b(delta)
        assert relation_holds(Relation(name, args), a, b) == (want == "T"), (delta, a, b)
        assert _holds(text, a, b) == (want == "T"), (delta, a, b)  # the matcher, through the compiled conjuncts


@pytest.mark.parametrize(
    "text,column,needle",
    [
        ("PATTERN SEQ(A a, B b) WHERE a BEFORE(-1 s) b", 38, "must not be negative"),
        ("PATTERN SEQ(A a, B b) WHERE a DURING(1 s, -2 s) b", 43, "must not be negative"),
        ("PATTERN SEQ(A a, B b) WHERE a MEETS(1 s, 2 s) b", 31, "takes 0 or 1"),
        ("PATTERN SEQ(A a, B b) WHERE a BEFORE(5 s, 1 s) b", 43, "less than the minimum"),
        ("PATTERN SEQ(A a, B b) BY OVERLAPS(-1 min)", 35, "must not be negative"),
        ("PATTERN SEQ(A a, B b) WHERE a INTERSECTS(1 s) b", 31, "takes 0"),
    ],
)
def test_bad_tolerances_are_query_errors_with_line_and_column(text: str, column: int, needle: str) -> None:
    with pytest.raises(QueryError) as err:
        parse(text)
    assert (err.value.line, err.value.column) == (1, column) and needle in str(err.value), str(err.value)
