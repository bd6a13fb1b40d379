"""The window operator (engine/rules/windows.py) against an oracle that recomputes every window from scratch.

The oracle sorts the accepted events by (ts, id), lists every window and group with its events, and
computes each aggregate from the events (ints summed exactly, floats with math.fsum): no panes, no partials,
no state. Random streams arrive out of order within the allowed lateness, with late events mixed in; the
output watermark the operator announces is checked against every result emitted after it.
"""
from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path
from typing import Any

import pytest

from engine.event_files import read_csv_table
from engine.events import Event
from engine.lql import ast
from engine.lql.parser import parse
from engine.match import Match
from engine.nfa.conditions import compile_bool, compile_value
from engine.plugins.evaluate import group_aggregate
from engine.rules import windows
from engine.rules.derived import WINDOW_END
from engine.rules.filters import single_event_resolver
from engine.rules.windows import WindowedAggregate

MS = 1_000
TRAFFIC = Path(__file__).resolve().parents[2] / "cli" / "demo_data" / "traffic_slice.csv"
SEGMENT_LOAD = """NAME segment_load
AGGREGATE traffic t WHERE t.vehicle_count > 0
GROUP BY key
WINDOW SLIDING 30 min EVERY 5 min
HAVING avg(t.avg_speed) < 25
RETURN t.key AS segment, avg(t.avg_speed) AS speed, sum(t.vehicle_count) AS vehicles, count(t) AS n
EMIT INTO segment_load"""

# ---------------------------------------------------------------------------------------------- oracle


def _agg(func: str, attr: str | None, events: list[Event]) -> Any:
    if func == "count":
        return len(events)
    assert attr is not None
    if func == "first":
        return events[0].get(attr)
    if func == "last":
        return events[-1].get(attr)
    values = [v for v in (e.get(attr) for e in events) if v is not None]
    if not values:
        return None
    if func in ("sum", "avg"):
        total = sum(values) if all(isinstance(v, int) for v in values) else math.fsum(values)
        return total if func == "sum" else total / len(values)
    return min(values) if func == "min" else max(values)


def _evaluate(query: ast.AggregateQuery, events: list[Event], key: tuple[Any, ...]) -> dict[str, Any] | None:
    """HAVING and RETURN of one (window, group) from its events (sorted by (ts, id))."""

    def resolve(ref: ast.AttrRef | ast.Aggregate) -> Any:
        if isinstance(ref, ast.Aggregate) and ref.plugin:  # an aggregate plug-in: fold the values in order
            value = group_aggregate(ref.func)(e.get(ref.attr or "") for e in events)
            return lambda a, b, c: value
        if isinstance(ref, ast.Aggregate):
            value = _agg(ref.func, ref.attr, events)
            return lambda a, b, c: value
        value = key[query.group_by.index(ref.attr)]
        return lambda a, b, c: value

    if query.having is not None and not compile_bool(query.having, resolve)(None, None, None):
        return None
    return {item.alias: compile_value(item.expr, resolve)(None, None, None) for item in query.returns}


def oracle(query: ast.AggregateQuery, accepted: list[Event]) -> list[tuple[int, int, tuple[int, int], dict[str, Any]]]:
    """(start, end, first (ts, id) of the group in the window, fields) of every result, in (start, first) order."""
    cells = oracle_cells(query, accepted)
    return [(start, end, (evs[0].ts, evs[0].id), fields) for start, end, _, evs, fields in cells]


def oracle_cells(
    query: ast.AggregateQuery, accepted: list[Event]
) -> list[tuple[int, int, tuple[Any, ...], list[Event], dict[str, Any]]]:
    """(start, end, group key, the group's events in the window in (ts, id) order, fields) of every result, in
    (start, first event) order."""
    where = compile_bool(query.where, single_event_resolver(query.var)) if query.where is not None else None
    events = sorted((e for e in accepted if where is None or where(e, None, None)), key=lambda e: (e.ts, e.id))
    w = query.window
    cells: dict[tuple[int, int, tuple[Any, ...]], list[Event]] = {}
    if w.kind == "count":
        groups: dict[tuple[Any, ...], list[Event]] = {}
        for e in events:
            groups.setdefault(tuple(e.get(a) for a in query.group_by), []).append(e)
        for key, evs in groups.items():
            k = 0
            while k * w.slide + w.size <= len(evs):
                part = evs[k * w.slide : k * w.slide + w.size]
                cells[(part[0].ts, part[-1].ts + 1, key)] = part
                k += 1
    else:
        for e in events:
            key = tuple(e.get(a) for a in query.group_by)
            for k in range((e.ts - w.size) // w.slide + 1, e.ts // w.slide + 1):
                if k * w.slide <= e.ts < k * w.slide + w.size:
                    cells.setdefault((k * w.slide, k * w.slide + w.size, key), []).append(e)
    out = []
    for (start, end, key), evs in cells.items():
        fields = _evaluate(query, evs, key)
        if fields is not None:
            fields[WINDOW_END] = end
            out.append((start, end, key, evs, fields))
    out.sort(key=lambda r: (r[0], (r[3][0].ts, r[3][0].id)))
    return out


# ---------------------------------------------------------------------------------------------- driver


def _rows(matches: list[Match]) -> list[tuple[int, int, dict[str, Any]]]:
    return [(m.start, m.end, m.fields) for m in matches]


def drive(
    query: ast.AggregateQuery, events: list[Event], lateness: int, rng: random.Random, n_late: int = 0
) -> tuple[list[list[Match]], WindowedAggregate, list[Event], int]:
    """Push ``events`` out of order within ``lateness`` with ``n_late`` late events mixed in, advancing and
    asking for the output watermark at random points; asserts the output watermark holds.

    Returns the non-empty result batches, the operator, the events it must have accepted and the number of
    late events injected.
    """
    arrival = sorted(events, key=lambda e: e.ts + rng.randint(0, lateness))
    op = WindowedAggregate(query, allowed_lateness_us=lateness)
    batches: list[list[Match]] = []
    bound = -(1 << 62)
    input_wm = -(1 << 62)
    next_id = 10**9
    late_injected = 0
    suffix_min = [0] * (len(arrival) + 1)
    suffix_min[-1] = 1 << 62
    for i in range(len(arrival) - 1, -1, -1):
        suffix_min[i] = min(arrival[i].ts, suffix_min[i + 1])

    def take(out: list[Match]) -> None:
        for m in out:
            assert m.start > bound, f"result at {m.start} after output watermark {bound}"
            assert m.events == {}
        if out:
            batches.append(out)

    for i, e in enumerate(arrival):
        take(op.push(e))
        bound = max(bound, op.output_watermark(input_wm))
        if n_late and rng.random() < n_late / len(arrival) and op.watermark > -(1 << 62):
            late = Event(next_id, query.type, op.watermark - rng.randint(0, 500 * MS), {"k": "x", "v": 10**6})
            next_id += 1
            late_injected += 1
            take(op.push(late))
        r = rng.random()
        if r < 0.05:  # the graph's way: a watermark without advance (no deadline due), then the bound
            wm = suffix_min[i + 1] - 1
            if wm > input_wm:
                input_wm = wm
            bound = max(bound, op.output_watermark(input_wm))
        elif r < 0.1:
            wm = suffix_min[i + 1] - 1
            if wm > input_wm:
                input_wm = wm
                take(op.advance(wm))
                bound = max(bound, op.output_watermark(input_wm))
        if r < 0.1 and op.next_deadline() is not None:
            assert op.next_deadline() > op.watermark  # type: ignore[operator]
    take(op.flush())
    return batches, op, events, late_injected


def random_events(rng: random.Random, n: int, span_ms: int) -> list[Event]:
    """Events of type A (a few of type B) with a group attribute k (sometimes missing), an int-or-float v
    (sometimes missing) and a float w."""
    ts = sorted(rng.randint(0, span_ms * MS) for _ in range(n))
    out = []
    for i, t in enumerate(ts):
        attrs: dict[str, Any] = {"w": rng.uniform(-1e3, 1e3) * 10 ** rng.randint(-8, 8)}
        if rng.random() < 0.9:
            attrs["k"] = rng.choice(["x", "y", "z"])
        if rng.random() < 0.85:
            attrs["v"] = rng.randint(-100, 100) if rng.random() < 0.5 else rng.uniform(-100, 100)
        if rng.random() < 0.5:
            attrs["g"] = rng.randint(0, 1)
        out.append(Event(i + 1, "A" if rng.random() < 0.95 else "B", t, attrs))
    return out


ALL = (
    "count(a) AS n, sum(a.v) AS s, avg(a.v) AS m, min(a.v) AS lo, max(a.v) AS hi, first(a.v) AS f,"
    " last(a.v) AS l, sum(a.w) AS sw, avg(a.w) AS aw, last(a.k) AS lk"
)
QUERIES = [
    f"AGGREGATE A a GROUP BY k WINDOW TUMBLING 100 ms RETURN a.k AS key, {ALL}",
    f"AGGREGATE A a WHERE a.v > -50 GROUP BY k WINDOW TUMBLING 150 ms HAVING count(a) >= 2 RETURN a.k AS key, {ALL}",
    f"AGGREGATE A a GROUP BY k, g WINDOW SLIDING 300 ms EVERY 100 ms HAVING sum(a.v) > 0 RETURN a.k AS key, a.g AS g,"
    f" {ALL}",
    f"AGGREGATE A a WHERE a.w > 0 WINDOW SLIDING 250 ms EVERY 100 ms RETURN {ALL}, sum(a.v) / count(a) AS ratio",
    f"AGGREGATE A a GROUP BY k WINDOW SLIDING 500 ms EVERY 20 ms HAVING count(a) > 1 RETURN a.k AS key, {ALL}",
    f"AGGREGATE A a GROUP BY k WINDOW COUNT 3 RETURN a.k AS key, {ALL}",
    f"AGGREGATE A a GROUP BY k WINDOW COUNT 5 EVERY 2 HAVING max(a.v) > 0 RETURN a.k AS key, {ALL}",
    f"AGGREGATE A a WINDOW COUNT 4 EVERY 4 RETURN {ALL}",
    "AGGREGATE A a GROUP BY k WINDOW SLIDING 300 ms EVERY 100 ms HAVING round(avg(a.w), 0) > -200"
    " RETURN a.k AS key, stddev(a.w) AS sd, round(avg(a.v), 2) AS r, abs(sum(a.v)) AS s, count(a) AS n",
    f"AGGREGATE A a GROUP BY g WINDOW COUNT 12 EVERY 1 HAVING last(a.v) > first(a.v) RETURN a.g AS g, {ALL}",
]


def check(query: ast.AggregateQuery, events: list[Event], lateness: int, seed: int, n_late: int = 0) -> int:
    rng = random.Random(seed)
    batches, op, accepted, late = drive(query, events, lateness, rng, n_late)
    expected = oracle(query, [e for e in accepted if e.type == query.type])
    got = [m for b in batches for m in b]
    for b in batches:  # each call's results in (window start, first event) order
        assert [m.start for m in b] == sorted(m.start for m in b)
    if query.window.kind == "count":  # count windows of different groups fire when their n-th event is placed
        assert sorted(map(repr, _rows(got))) == sorted(repr((s, e, f)) for s, e, _, f in expected)
    else:  # time windows fire in window order
        assert _rows(got) == [(s, e, f) for s, e, _, f in expected]
    stats = op.stats()
    assert stats["late"] == late
    assert stats["emitted"] == len(expected)
    assert stats["ignored"] == sum(1 for e in accepted if e.type != query.type)
    return len(expected)


@pytest.fixture(params=["direct", "two_stacks"])
def pane_merge(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a window merges its panes: directly at firing, or through per-group Two-Stacks (the
    default for windows of more than TWO_STACKS_PANES panes; forced here for every window)."""
    if request.param == "two_stacks":
        monkeypatch.setattr(windows, "TWO_STACKS_PANES", 0)
    else:
        monkeypatch.setattr(windows, "TWO_STACKS_PANES", 1 << 30)
    return str(request.param)


@pytest.mark.parametrize("text", QUERIES)
def test_random_streams_in_order(text: str, pane_merge: str) -> None:
    query = parse(text)
    total = 0
    for seed in range(25):
        rng = random.Random(seed)
        total += check(query, random_events(rng, rng.randint(0, 120), 2_000), 0, seed)
    assert total > 0


@pytest.mark.parametrize("text", QUERIES)
def test_random_streams_out_of_order_with_late_events(text: str, pane_merge: str) -> None:
    query = parse(text)
    for seed in range(25):
        rng = random.Random(1000 + seed)
        lateness = rng.choice([1, 50, 200, 1000]) * MS
        events = random_events(rng, rng.randint(1, 150), 2_000)
        check(query, events, lateness, seed, n_late=4)  # asserts stats()["late"] == the late events injected


def test_slide_larger_than_size_skips_the_gaps(pane_merge: str) -> None:
    """A hopping window with gaps (not expressible in LQL today: the parser refuses EVERY > size): events
    between windows are counted as outside and change nothing."""
    base = parse(f"AGGREGATE A a GROUP BY k WINDOW SLIDING 100 ms EVERY 100 ms RETURN a.k AS key, {ALL}")
    query = dataclasses.replace(base, window=ast.WindowSpec("sliding", 100 * MS, 250 * MS))
    for seed in range(20):
        rng = random.Random(seed)
        check(query, random_events(rng, 80, 2_000), rng.choice([0, 100 * MS]), seed)
    count = dataclasses.replace(base, window=ast.WindowSpec("count", 2, 3))
    for seed in range(20):
        rng = random.Random(seed)
        check(count, random_events(rng, 80, 2_000), rng.choice([0, 100 * MS]), seed)


def test_late_event_is_dropped_and_counted() -> None:
    query = parse("AGGREGATE A a WINDOW TUMBLING 10 ms RETURN count(a) AS n, sum(a.v) AS s")
    op = WindowedAggregate(query, allowed_lateness_us=5 * MS)
    assert op.push(Event(1, "A", 1 * MS, {"v": 1})) == []
    out = op.push(Event(2, "A", 17 * MS, {"v": 2}))  # W = 11.999 ms: window [0, 10 ms) fires
    assert [(m.start, m.end, m.fields) for m in out] == [(0, 10 * MS, {"n": 1, "s": 1, WINDOW_END: 10 * MS})]
    assert op.push(Event(3, "A", 4 * MS, {"v": 100})) == []  # late: its window already fired
    assert op.push(Event(4, "A", 11 * MS, {"v": 100})) == []  # late too: ts <= W, though [10, 20 ms) is open
    assert op.stats()["late"] == 2
    out = op.advance(30 * MS)
    assert [(m.start, m.end, m.fields) for m in out] == [(10 * MS, 20 * MS, {"n": 1, "s": 2, WINDOW_END: 20 * MS})]


def test_results_in_window_then_first_event_order() -> None:
    query = parse("AGGREGATE A a GROUP BY k WINDOW SLIDING 20 ms EVERY 10 ms RETURN a.k AS k, count(a) AS n")
    op = WindowedAggregate(query, allowed_lateness_us=100 * MS)
    events = [Event(3, "A", 15 * MS, {"k": "b"}), Event(2, "A", 12 * MS, {"k": "c"}), Event(1, "A", 5 * MS, {"k": "a"})]
    for e in events:
        assert op.push(e) == []
    out = op.flush()
    assert [(m.start, m.fields["k"]) for m in out] == [
        (-10 * MS, "a"), (0, "a"), (0, "c"), (0, "b"), (10 * MS, "c"), (10 * MS, "b")
    ]


def test_float_sums_equal_fsum_and_int_sums_are_exact() -> None:
    query = parse("AGGREGATE A a WINDOW SLIDING 4 ms EVERY 1 ms RETURN sum(a.v) AS s, avg(a.v) AS m")
    values = [1e16, 1.0, -1e16, 1.0, 1e-16, 3.3, 2**60 + 1, 7]
    op = WindowedAggregate(query)
    events = [Event(i + 1, "A", i * MS, {"v": v}) for i, v in enumerate(values)]
    out = [m for e in events for m in op.push(e)] + op.flush()
    by_start = {m.start: m.fields for m in out}
    for k in range(-3, len(values)):
        window = [v for i, v in enumerate(values) if k <= i < k + 4]
        if not window:
            continue
        expect = sum(window) if all(isinstance(v, int) for v in window) else math.fsum(window)
        assert by_start[k * MS]["s"] == expect
        assert by_start[k * MS]["m"] == expect / len(window)
    assert by_start[6 * MS]["s"] == 2**60 + 8  # exact int


def test_count_window_ignores_arrival_order_within_lateness() -> None:
    query = parse("AGGREGATE A a GROUP BY k WINDOW COUNT 2 RETURN a.k AS k, first(a.v) AS f, last(a.v) AS l")
    op = WindowedAggregate(query, allowed_lateness_us=10 * MS)
    out = []
    for e in [Event(2, "A", 2 * MS, {"k": 1, "v": "b"}), Event(1, "A", 1 * MS, {"k": 1, "v": "a"}),
              Event(4, "A", 4 * MS, {"k": 1, "v": "d"}), Event(3, "A", 3 * MS, {"k": 1, "v": "c"}),
              Event(5, "A", 5 * MS, {"k": 1, "v": "e"})]:
        out += op.push(e)
    assert out == []  # nothing placed yet: all within the lateness
    out = op.flush()  # the fifth event's window never completes
    assert [(m.start, m.end, m.fields["f"], m.fields["l"]) for m in out] == [
        (1 * MS, 2 * MS + 1, "a", "b"),
        (3 * MS, 4 * MS + 1, "c", "d"),
    ]


def test_missing_group_value_is_a_group_of_its_own() -> None:
    query = parse("AGGREGATE A a GROUP BY k WINDOW TUMBLING 1 s RETURN a.k AS k, count(a) AS n")
    op = WindowedAggregate(query)
    for i, attrs in enumerate([{"k": "x"}, {}, {"k": "x"}, {}]):
        op.push(Event(i + 1, "A", i, attrs))
    assert [m.fields for m in op.flush()] == [
        {"k": "x", "n": 2, WINDOW_END: 1_000_000},
        {"k": None, "n": 2, WINDOW_END: 1_000_000},
    ]


def test_negative_lateness_is_refused() -> None:
    with pytest.raises(ValueError, match="lateness"):
        WindowedAggregate(parse("AGGREGATE A a WINDOW TUMBLING 1 s RETURN count(a) AS n"), allowed_lateness_us=-1)


# ---------------------------------------------------------------------------------------------- Aarhus


def _traffic() -> list[Event]:
    table = read_csv_table(TRAFFIC)
    return [e for batch in table.batches() for e in batch]


@pytest.mark.slow
def test_segment_load_on_the_aarhus_slice(pane_merge: str) -> None:
    """The whole bundled slice (134,770 readings; the graph test below covers its first 30,000 unmarked)."""
    events = _traffic()
    query = parse(SEGMENT_LOAD)
    expected = oracle(query, events)
    op = WindowedAggregate(query)
    got = [m for e in events for m in op.push(e)] + op.flush()
    assert _rows(got) == [(s, e, f) for s, e, _, f in expected]
    assert len(got) > 100
    assert all(m.fields["speed"] < 25 and m.query == "segment_load" for m in got)
    assert op.stats()["open_panes"] == 0 and op.stats()["open_partials"] == 0


def test_tumbling_and_count_windows_on_the_aarhus_slice() -> None:
    events = _traffic()[:40_000]
    for text in [
        "AGGREGATE traffic t GROUP BY key WINDOW TUMBLING 1 hour HAVING max(t.vehicle_count) >= 10"
        " RETURN t.key AS key, sum(t.vehicle_count) AS v, min(t.avg_speed) AS lo, last(t.avg_speed) AS l",
        "AGGREGATE traffic t WHERE t.vehicle_count > 0 GROUP BY key WINDOW COUNT 12 EVERY 6"
        " HAVING avg(t.avg_speed) < 0.5 * max(t.ndt_kmh) RETURN t.key AS key, avg(t.avg_speed) AS speed",
    ]:
        query = parse(text)
        expected = oracle(query, events)
        rng = random.Random(7)
        batches, _, _, _ = drive(query, events, 10 * 60 * 1_000_000, rng)
        got = [m for b in batches for m in b]
        assert sorted(map(repr, _rows(got))) == sorted(repr((s, e, f)) for s, e, _, f in expected)
        assert len(got) > 10


def test_segment_load_feeds_a_pattern_in_the_rule_graph() -> None:
    """The issue's two upper layers over the slice: live in a RuleGraph (the window operator's output
    watermark releases the derived events) == offline (the oracle's derived events, then the pattern)."""
    from engine.detector import compile_statement
    from engine.lql.parser import parse_script
    from engine.matcher import Matcher
    from engine.rules.derived import derived_event, derived_event_id
    from engine.rules.graph import RuleGraph

    text = SEGMENT_LOAD + """;
NAME slowdown_spreads
PATTERN SEQ(segment_load a, segment_load+ b[]) WHERE b[i].speed < b[i-1].speed
PARTITION BY segment WITHIN 1 hour STRATEGY skip_till_next_match"""
    events = _traffic()[:30_000]
    statements = parse_script(text)
    graph = RuleGraph()
    graph.report_derived = True
    for q in statements:
        graph.add(q.name or "q", compile_statement(q))
    live = [r for e in events for r in graph.push(e)] + graph.flush()
    load, spreads = statements
    derived = []
    for s, e, key, evs, f in oracle_cells(load, events):  # ids: (NAME, version 1, bounds, group, first, last)
        m = Match("segment_load", {}, s, e, f, window_key=(key, (evs[0].ts, evs[0].id), (evs[-1].ts, evs[-1].id)))
        derived.append(derived_event(load, m, derived_event_id("segment_load", 1, m)))
    in_order = sorted(derived, key=lambda d: (d.ts, d.id))  # the reader's order: (ts, id)
    matcher = Matcher(compile_statement(spreads))
    offline = [m for d in in_order for m in matcher.push(d)] + matcher.flush()

    def key(m: Match) -> tuple[Any, ...]:
        return (m.start, m.end, sorted(m.ids().items()))

    assert sorted(key(m) for name, m in live if name == "slowdown_spreads") == sorted(key(m) for m in offline)
    assert [(m.start, m.fields) for name, m in live if name == "segment_load"] == [(d.ts, d.attrs) for d in derived]
    assert len(offline) > 10


def test_stats_count_open_windows_and_groups(pane_merge: str) -> None:
    query = parse("AGGREGATE A a GROUP BY k WINDOW SLIDING 30 ms EVERY 10 ms RETURN a.k AS k, count(a) AS n")
    op = WindowedAggregate(query, allowed_lateness_us=100 * MS)  # nothing fires on push
    op.push(Event(1, "A", 5 * MS, {"k": "x"}))
    op.push(Event(2, "A", 25 * MS, {"k": "y"}))
    # windows [-20, 10) .. [20, 50) ms: the first holding an event starts at -20 ms, the last at 20 ms
    assert (op.stats()["open_windows"], op.stats()["groups"]) == (5, 2)
    op.advance(10 * MS - 1)  # [-20, 10) fires: no event at or before 9.999 ms will come
    assert (op.stats()["open_windows"], op.stats()["groups"]) == (4, 2)
    op.flush()
    assert (op.stats()["open_windows"], op.stats()["groups"], op.stats()["open_partials"]) == (0, 0, 0)
    count = WindowedAggregate(parse("AGGREGATE A a GROUP BY k WINDOW COUNT 3 EVERY 1 RETURN count(a) AS n"))
    for i in range(4):
        count.push(Event(i + 1, "A", i, {"k": "x"}))
    # placed: events 0..2 (ts <= W = 2): window 0 fired, windows 1 and 2 started
    assert (count.stats()["open_windows"], count.stats()["groups"], count.stats()["buffered"]) == (2, 1, 1)
