"""An archived pattern's single-event conditions as an Arrow filter: never drops an event the matcher accepts."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

from archive.pushdown import apply_filter, single_event_filter
from archive.schema import events_to_record, output_schema, output_to_events, record_to_output
from engine.compiler import compile_query
from engine.event_type import EventType
from engine.events import Event
from engine.matcher import Matcher

T = EventType("t", {"key": "string", "n": "int", "x": "float", "s": "string", "ok": "bool", "at": "timestamp"}, "key")

# (condition, translated exactly: the filter keeps exactly the matches)
CONDITIONS = [
    ("c.n > 3", True),
    ("c.n >= 3 AND c.x < 0.5", True),
    ("c.s = 'b' OR c.n != 2", True),
    ("c.ok = TRUE", True),
    ("c.at >= 500 AND c.n <= c.x", False),  # int against float: approximate, a superset
    ("c.x < 0.5 * c.n", False),
    ("c.n / c.x > 2", False),  # a division by zero: missing, so false
    ("c.n - 3 = c.x", False),
    ("-c.x < c.n + 1", False),
    ("c.n > 3 AND NOT c.ok", False),  # NOT is left out: only c.n > 3 filters
    ("c.n > 3 OR NOT c.ok", False),  # an untranslated disjunct: no filter from this conjunct
    ("c.s > 1", False),  # across kinds: left out
    ("c.ts >= 100 AND c.id != 7", True),
    ("c.n * c.n > 1 AND c.s != 'a'", False),
]


def events(n: int, seed: int) -> list[Event]:
    rng = random.Random(seed)

    def maybe(v):
        return None if rng.random() < 0.15 else v

    out = []
    for i in range(n):
        attrs = {
            "key": rng.choice("ab"),
            "n": maybe(rng.choice([0, 1, 2, 3, 4, 2**62, -(2**62)])),
            "x": maybe(rng.choice([0.0, 0.5, 1.5, 3.0, -2.0, 1e300, float("nan")])),
            "s": maybe(rng.choice(["a", "b", "é", ""])),
            "ok": maybe(rng.random() < 0.5),
            "at": maybe(rng.randrange(1_000)),
        }
        out.append(Event(i + 1, "t", rng.randrange(1_000), {k: v for k, v in attrs.items() if v is not None}))
    return sorted(out, key=Event.order_key)


def matched(condition: str, evs: list[Event]) -> set[int]:
    matcher = Matcher(compile_query(f"PATTERN SEQ(t c) WHERE {condition}"))
    found = [m for e in evs for m in matcher.push(e)] + matcher.flush()
    return {m.events["c"][0].id for m in found}


@pytest.mark.parametrize(("condition", "exact"), CONDITIONS)
def test_the_filter_keeps_every_match_and_only_them_when_exact(condition, exact):
    evs = events(600, seed=len(condition))
    table = record_to_output(T, events_to_record(T, evs, ingested_at_us=0))
    where = single_event_filter(compile_query(f"PATTERN SEQ(t c) WHERE {condition}").ast, [T])
    kept = {e.id for e in output_to_events(apply_filter(table, where))}
    want = matched(condition, evs)
    assert want <= kept, sorted(want - kept)
    if exact:
        assert kept == want
    assert (where is None) == (condition in ("c.n > 3 OR NOT c.ok", "c.s > 1"))
    assert where is None or len(kept) < len(evs)


@pytest.mark.parametrize(
    "pattern",
    [
        "PATTERN SEQ(t a, t b) WHERE a.n > 3",
        "PATTERN SEQ(t a, !t b, t c) WHERE a.n > 3",
        "PATTERN SEQ(t+ a[]) WHERE a[i].n > 3",
        "PATTERN SEQ(t c)",
    ],
)
def test_no_filter_for_patterns_of_several_events_or_without_where(pattern):
    assert single_event_filter(compile_query(pattern).ast, [T]) is None


def test_missing_columns_and_empty_tables():
    other = EventType("u", {"key": "string", "n": "float"}, "key")  # n of another kind: not translated
    assert single_event_filter(compile_query("PATTERN SEQ(ANY(t, u) c) WHERE c.n > 3").ast, [T, other]) is None
    where = single_event_filter(compile_query("PATTERN SEQ(t c) WHERE c.n > 3").ast, [T])
    empty = output_schema([T]).empty_table()
    assert apply_filter(empty, where).num_rows == 0
    assert apply_filter(pa.table({"n": pa.array([5, None], pa.int64())}), where).column("n").to_pylist() == [5]
