"""Plug-ins (issue 16): scalar functions, aggregates and operators from entry points.

Built-ins against hand-checked cases on the bundled bars and traffic slices (cli/demo_data); the test
package tests/plugin_pkg (installed by `make venv`) registers its own function, aggregate and operator
through entry points, and misbehaving ones whose errors must name them.
"""
from __future__ import annotations

import json
import os
import tomllib
from datetime import UTC, datetime
from importlib import import_module, metadata
from pathlib import Path

import pytest

from engine.detector import compile, make_detector
from engine.events import Event
from engine.io import read_events
from engine.lql.errors import QueryError
from engine.lql.parser import parse
from engine.match import Match
from engine.plugins import builtins
from engine.plugins.api import PluginError
from engine.plugins.registry import registry

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "cli" / "demo_data"
BAR = {"key": "string", "open": "float", "high": "float", "low": "float", "close": "float", "volume": "int"}
TRAFFIC = {"key": "string", "avg_speed": "int", "vehicle_count": "int", "ndt_kmh": "int"}
SCHEMAS = {"bar": BAR, "traffic": TRAFFIC, "A": {"x": "float", "n": "int", "s": "string"}}
MIN = 60_000_000


@pytest.fixture(scope="module")
def bars() -> list[Event]:
    return list(read_events(DATA / "bars_1m.csv"))


@pytest.fixture(scope="module")
def traffic() -> list[Event]:
    return list(read_events(DATA / "traffic_slice.csv"))


def run(text: str, events: list[Event], schemas: dict | None = SCHEMAS) -> list[Match]:
    detector = make_detector(compile(text, schemas))
    out: list[Match] = []
    for e in events:
        out += detector.push(e)
    return out + detector.flush()


# ------------------------------------------------------------------------------ entry points


def test_builtins_are_declared_as_entry_points_in_pyproject() -> None:
    """Every shipped built-in has an entry point naming exactly that object, and nothing else is declared."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    groups = {"function": "lace.functions", "aggregate": "lace.aggregates", "operator": "lace.operators"}
    for kind, group in groups.items():
        declared = project[group]
        assert set(declared) == set(builtins.BUILTINS[kind])
        for name, target in declared.items():
            module, attr = target.split(":")
            assert getattr(import_module(module), attr) is builtins.BUILTINS[kind][name]


def test_registry_lists_every_builtin_with_its_shape() -> None:
    reg = registry()
    assert {"hour_of_day", "day_of_week", "abs", "round"} <= set(reg.names("function"))
    assert {"count", "sum", "avg", "min", "max", "stddev"} <= set(reg.names("aggregate"))
    assert {"dedup", "vshape"} <= set(reg.names("operator"))
    assert reg.get("function", "round").signature == "round(number, [int]) -> number"
    assert reg.get("operator", "dedup").signature == "dedup(Type, duration) v"


# ------------------------------------------------------------------------------ functions


def test_calendar_functions_on_the_first_bar_and_traffic_reading(bars: list[Event], traffic: list[Event]) -> None:
    # first bar: 2013-10-07 13:30 UTC, a Monday; first traffic reading: 2014-08-01 05:50 UTC, a Friday
    for events, hour, day in ((bars[:1], 13, 1), (traffic[:1], 5, 5)):
        t = events[0].type
        (m,) = run(f"PATTERN {t} a RETURN hour_of_day(a.ts) AS h, day_of_week(a.ts) AS d", events)
        assert m.fields == {"h": hour, "d": day}
        when = datetime.fromtimestamp(events[0].ts / 1e6, UTC)
        assert (when.hour, when.isoweekday()) == (hour, day)


def test_hour_of_day_in_where_equals_the_datetime_count(traffic: list[Event]) -> None:
    got = run("PATTERN traffic a WHERE hour_of_day(a.ts) = 7 AND day_of_week(a.ts) = 5", traffic)
    want = [e.id for e in traffic if datetime.fromtimestamp(e.ts / 1e6, UTC).hour == 7
            and datetime.fromtimestamp(e.ts / 1e6, UTC).isoweekday() == 5]
    assert [m.events["a"][0].id for m in got] == want and len(want) > 0


def test_abs_and_round_on_the_first_bar(bars: list[Event]) -> None:
    # AIG 13:30: open 49.04, close 48.96
    (m,) = run(
        "PATTERN bar a RETURN abs(a.close - a.open) > 0.079 AS moved, round(a.close - a.open, 2) AS r,"
        " round(a.close) AS whole, abs(a.volume) AS v",
        bars[:1],
    )
    assert m.fields == {"moved": True, "r": -0.08, "whole": 49, "v": 11701}


def test_functions_in_join_of_a_live_archived_query_parse_and_check() -> None:
    q = parse(
        "LIVE PATTERN traffic a ARCHIVED PATTERN traffic c LOOKBACK 7 d "
        "JOIN a.key = c.key AND hour_of_day(a.ts) = hour_of_day(c.ts) RETURN a.key AS k",
        SCHEMAS,
    )
    assert q.join is not None


def test_function_over_kleene_elements_and_pairs_in_where() -> None:
    """x = 10.0, 10.4, 9.8, 12.0: only 10.4 and 9.8 are within 0.5 of 10.0 (10.4 vs 9.8 differ by 0.6)."""
    evs = [Event(i, "A", i * MIN, {"x": x}) for i, x in enumerate([10.0, 10.4, 9.8, 12.0], start=1)]
    got = run("PATTERN SEQ(A a, A+ b[]) WHERE abs(b[i].x - a.x) < 0.5 STRATEGY skip_till_next_match "
              "RETURN count(b) AS n", evs)
    assert [([e.id for e in m.events["a"]], [e.id for e in m.events["b"]]) for m in got] == [([1], [2]), ([1], [2, 3])]
    got = run("PATTERN SEQ(A a, A b) WHERE abs(b.x - a.x) < 0.5 RETURN round(b.x - a.x, 1) AS d", evs)
    assert [(m.events["a"][0].id, m.events["b"][0].id, m.fields["d"]) for m in got] == [(1, 2, 0.4), (1, 3, -0.2)]


@pytest.mark.parametrize(
    ("where", "col", "reason"),
    [
        ("hour_of_day(a.s) = 1", 19, "hour_of_day() needs a timestamp here, found string"),
        ("abs(a.x, 2) > 1", 7, "abs() takes 1 argument(s), got 2"),
        ("median(a.x) > 1", 7, "unknown function 'median'"),
        ("hour_of_day(a.ts) > 'x'", 7, "cannot compare int with string"),
        ("round(x) > 1", 13, "'x' needs its variable"),
    ],
)
def test_function_errors_have_line_and_column(where: str, col: int, reason: str) -> None:
    with pytest.raises(QueryError) as err:
        parse(f"PATTERN SEQ(A a, A b)\nWHERE {where}", SCHEMAS)
    assert (err.value.line, err.value.column) == (2, col) and reason in err.value.reason, err.value


def test_arguments_of_the_wrong_type_at_run_time_give_null() -> None:
    got = run("PATTERN A a RETURN abs(a.x) AS y", [Event(1, "A", 0, {"x": "text"})], schemas=None)
    assert got[0].fields == {"y": None}


# ------------------------------------------------------------------------------ aggregates


def test_plugin_aggregate_protocol_equals_the_builtin_aggregates(bars: list[Event]) -> None:
    text = ("PATTERN SEQ(bar a, bar+ b[]) WHERE b[i].close < b[i-1].close PARTITION BY key "
            "STRATEGY skip_till_next_match WITHIN 5 min RETURN sum(b.close) AS s, avg(b.close) AS m, "
            "min(b.close) AS lo, max(b.close) AS hi, count(b) AS n, stddev(b.close) AS sd")
    got = run(text, bars[:800])
    assert len(got) > 20
    for m in got:
        closes = [e.attrs["close"] for e in m.events["b"]]
        mean = sum(closes) / len(closes)
        assert m.fields["n"] == len(closes) and m.fields["lo"] == min(closes) and m.fields["hi"] == max(closes)
        assert m.fields["sd"] == pytest.approx((sum((c - mean) ** 2 for c in closes) / len(closes)) ** 0.5)
    # the protocol (init/add/remove/value) gives the same over a sliding window of 3
    for agg, ref in ((builtins.sum_, sum), (builtins.min_, min), (builtins.max_, max),
                     (builtins.count, len), (builtins.stddev, None)):
        values = [e.attrs["close"] for e in bars[:50]]
        state = agg.init()
        for i, v in enumerate(values):
            state = agg.add(state, v)
            if i >= 3:
                state = agg.remove(state, values[i - 3])
            window = values[max(0, i - 2): i + 1]
            if ref is not None:
                assert agg.value(state) == pytest.approx(ref(window))
            else:
                mu = sum(window) / len(window)
                assert agg.value(state) == pytest.approx((sum((w - mu) ** 2 for w in window) / len(window)) ** 0.5,
                                                         abs=1e-9)


# ------------------------------------------------------------------------------ operators


def test_dedup_hand_case() -> None:
    """Alarms at 0, 3, 9, 10, 12, 25 min with period 10 min: alerts at 0 (absorbs 3, 9), 10 (absorbs 12), 25."""
    evs = [Event(i, "A", t * MIN, {"s": "x", "x": 1.0}) for i, t in enumerate([0, 3, 9, 10, 12, 25], start=1)]
    got = run("PATTERN dedup(A, 10 min) d RETURN d.ts_start AS t", evs)
    assert [m.events["d"][0].id for m in got] == [1, 4, 6]
    assert [m.fields["t"] for m in got] == [0, 10 * MIN, 25 * MIN]


def test_dedup_per_key_on_traffic_equals_a_direct_count(traffic: list[Event]) -> None:
    """Congested readings (speed < 20 km/h) de-duplicated per segment over 1 hour."""
    slow = [e for e in traffic if e.attrs["avg_speed"] < 20]
    got = run("PATTERN SEQ(dedup(traffic, 1 h) d) PARTITION BY key RETURN d.key AS k, d.avg_speed AS v", slow)
    first: dict[str, int] = {}
    want = []
    for e in slow:  # the definition, written out
        k = e.attrs["key"]
        if k not in first or e.ts - first[k] >= 3_600_000_000:
            first[k] = e.ts
            want.append(e.id)
    assert [m.events["d"][0].id for m in got] == want and 0 < len(want) < len(slow)


def test_vshape_hand_case() -> None:
    """Bars (open, close): down, down, up, up, up, down, down, up, up -> two Vs, at bars 4 and 9."""
    oc = [(10, 9), (9, 8), (8, 8.5), (8.5, 9.5), (9.5, 10), (10, 9), (9, 7), (7, 8), (8, 8.2)]
    evs = [Event(i, "bar", i * MIN, {"key": "K", "open": o, "close": c}) for i, (o, c) in enumerate(oc, start=1)]
    got = run("PATTERN vshape(bar) v PARTITION BY key RETURN v.drop AS drop, v.recovery AS rec, "
              "v.fall_bars AS f, v.ts_start AS t0, v.end_price AS end", evs)
    assert [m.events["v"][0].id for m in got] == [4, 9]
    assert got[0].fields == {"drop": 2.0, "rec": 1.5, "f": 2, "t0": MIN, "end": 9.5}
    assert got[1].fields == {"drop": 3.0, "rec": pytest.approx(1.2), "f": 2, "t0": 6 * MIN, "end": 8.2}
    # legs = 3: neither V has three falling bars
    assert run("PATTERN vshape(bar, 3) v PARTITION BY key", evs) == []


def test_vshape_on_the_bundled_bars(bars: list[Event]) -> None:
    """The first V of BAC: 13:31 and 13:32 fall, 13:33 and 13:34 rise (checked by hand in bars_1m.csv)."""
    got = run("PATTERN SEQ(vshape(bar) v) PARTITION BY key RETURN v.key AS key, v.fall_bars AS f, "
              "v.rise_bars AS r, v.ts_start AS t0, v.ts_end AS t1", bars)
    bac = [m for m in got if m.fields["key"] == "BAC"]
    first = {e.ts: (e.attrs["open"], e.attrs["close"]) for e in bars if e.attrs["key"] == "BAC"}
    t0, t1 = bac[0].fields["t0"], bac[0].fields["t1"]
    legs = [first[t0 + k * MIN] for k in range(4)]
    assert [c < o for o, c in legs[:2]] == [True, True] and [c > o for o, c in legs[2:]] == [True, True]
    assert t1 == t0 + 3 * MIN and bac[0].fields["f"] >= 2 and bac[0].fields["r"] == 2
    assert len(got) == 246


def test_operator_component_composes_with_the_nfa(bars: list[Event]) -> None:
    """A V-shape followed within 10 min by a bar closing above the V's start price."""
    got = run("PATTERN SEQ(vshape(bar) v, bar b) WHERE b.close > v.start_price PARTITION BY key "
              "STRATEGY skip_till_next_match WITHIN 10 min RETURN v.start_price AS p, b.close AS c", bars)
    assert got and all(m.fields["c"] > m.fields["p"] for m in got)
    assert all(m.events["b"][0].ts > m.events["v"][0].ts for m in got)


def test_operator_errors() -> None:
    with pytest.raises(QueryError, match="unknown operator 'nosuch'"):
        parse("PATTERN nosuch(bar) v", SCHEMAS)
    with pytest.raises(QueryError, match="needs a duration"):
        parse("PATTERN dedup(bar, 10) v", SCHEMAS)
    with pytest.raises(QueryError, match="vshape needs a numeric 'open' attribute"):
        parse("PATTERN vshape(traffic) v", SCHEMAS)
    with pytest.raises(QueryError, match="only allowed in live-only queries"):
        parse("LIVE PATTERN dedup(bar, 1 h) a ARCHIVED PATTERN bar c LOOKBACK 1 d JOIN a.key = c.key")


# ------------------------------------------------------------------------------ the test plug-in package


@pytest.fixture(scope="module")
def test_plugin() -> None:
    try:
        metadata.distribution("lace-test-plugin")
    except metadata.PackageNotFoundError:
        if os.environ.get("CI"):
            pytest.fail("tests/plugin_pkg is not installed: `make venv` installs it")
        pytest.skip("tests/plugin_pkg is not installed (make venv installs it)")


@pytest.mark.usefixtures("test_plugin")
def test_a_third_party_plugin_works_from_lql(bars: list[Event]) -> None:
    src = registry().get("operator", "updown").source
    assert src == "lace-test-plugin 0.1.0"
    got = run("PATTERN updown(bar) u PARTITION BY key RETURN u.peak AS p, clamp(u.peak, 0, 20) AS c", bars)
    expect = 0
    by_key: dict[str, Event] = {}
    for e in bars:  # the definition: a rising bar then, next for its key, a falling bar
        prev = by_key.get(e.attrs["key"])
        if prev is not None and prev.attrs["close"] > prev.attrs["open"] and e.attrs["close"] < e.attrs["open"]:
            expect += 1
        by_key[e.attrs["key"]] = e
    assert len(got) == expect > 0
    assert all(m.fields["c"] == min(m.fields["p"], 20) for m in got)
    (m,) = run("PATTERN SEQ(A a, A+ b[]) STRATEGY skip_till_next_match RETURN spread(b.x) AS s",
               [Event(1, "A", 0, {"x": 1.0}), Event(2, "A", 1, {"x": 5.0}), Event(3, "A", 2, {"x": 2.0})])[:1]
    assert m.fields["s"] == 0.0


@pytest.mark.usefixtures("test_plugin")
def test_misbehaving_plugins_give_errors_naming_them(bars: list[Event]) -> None:
    with pytest.raises(PluginError, match=r"function plug-in 'explode' \(from lace-test-plugin 0.1.0\): raised "
                                          r"RuntimeError: boom"):
        run("PATTERN bar a RETURN explode(a.close) AS x", bars[:1])
    with pytest.raises(PluginError, match="function plug-in 'wrong_type' .* returned str, declared int"):
        run("PATTERN bar a WHERE wrong_type(a.close) > 1", bars[:1])
    with pytest.raises(PluginError, match=r"operator plug-in 'badshape' .* compose\(\) must return"):
        run("PATTERN badshape(bar) u PARTITION BY key", bars)
    with pytest.raises(QueryError, match=r"operator 'nocompose' \(lace-test-plugin 0.1.0\) is broken: .*compose"):
        parse("PATTERN nocompose(bar) u")
    broken = {p.name: p.error for p in registry().all() if p.error}
    assert "nocompose" in broken


# ------------------------------------------------------------------------------ lace operators, lace match


def test_lace_operators_lists_builtins_with_their_package() -> None:
    from typer.testing import CliRunner

    from cli.main import app

    result = CliRunner().invoke(app, ["operators"], catch_exceptions=False)
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0] == "functions:" and "operators:" in lines and "aggregates:" in lines
    assert any(line.startswith("  hour_of_day(timestamp) -> int  (lace") for line in lines)
    assert any(line.startswith("  dedup(Type, duration) v  (lace") and "cost 1, pass estimate 0.5" in line
               for line in lines)
    rows = [json.loads(line) for line in CliRunner().invoke(app, ["operators", "--json"]).output.splitlines()]
    assert {(r["kind"], r["name"]) for r in rows} >= {("function", "round"), ("aggregate", "stddev"),
                                                      ("operator", "vshape")}


@pytest.mark.usefixtures("test_plugin")
def test_lace_match_reports_a_misbehaving_plugin_on_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    query = tmp_path / "q.lql"
    query.write_text("PATTERN bar a RETURN explode(a.close) AS x")
    result = CliRunner().invoke(app, ["match", "-q", str(query), "-e", str(DATA / "bars_1m.csv")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip().splitlines() == [
        "error: function plug-in 'explode' (from lace-test-plugin 0.1.0): raised RuntimeError: boom"
    ]


@pytest.mark.usefixtures("test_plugin")
@pytest.mark.parametrize("batched", [False, True])
def test_a_failing_plugin_stops_its_statement_in_the_rule_graph_only(bars: list[Event], batched: bool) -> None:
    from engine.detector import compile_statement
    from engine.rules.graph import RuleGraph

    graph = RuleGraph()
    graph.add("bad", compile_statement("NAME bad PATTERN bar a RETURN explode(a.close) AS x"))
    graph.add("good", compile_statement("NAME good PATTERN bar a WHERE a.close < a.open RETURN abs(a.close) AS x"))
    if batched:  # the service's ingest path
        results = graph.push_batch(bars[:50]) + graph.push_batch(bars[50:100]) + graph.flush()
    else:
        results = [r for e in bars[:100] for r in graph.push(e)] + graph.flush()
    falling = [e for e in bars[:100] if e.attrs["close"] < e.attrs["open"]]
    assert [m.events["a"][0].id for name, m in results if name == "good"] == [e.id for e in falling]
    assert not [r for r in results if r[0] == "bad"]
    ((name, event, reason),) = graph.take_failures()  # reported once: the node stopped
    assert name == "bad" and event is bars[0] and "'explode' (from lace-test-plugin 0.1.0)" in reason
    assert graph.nodes["bad"].failed == reason


@pytest.mark.usefixtures("test_plugin")
def test_lace_match_with_several_statements_names_the_failing_one(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    query = tmp_path / "q.lql"
    query.write_text("NAME ok PATTERN bar a RETURN a.close AS c;\nNAME boom PATTERN bar a RETURN explode(a.close) AS x")
    result = CliRunner().invoke(app, ["match", "-q", str(query), "-e", str(DATA / "bars_1m.csv")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip().splitlines()[-1] == (
        "error: statement boom: function plug-in 'explode' (from lace-test-plugin 0.1.0): raised RuntimeError: boom"
    )


def test_the_registry_keeps_broken_plugins_apart_with_their_reason() -> None:
    from engine.plugins.api import Function
    from engine.plugins.registry import build

    def fails() -> object:
        raise ImportError("no module named nowhere")

    good = Function("twice", ("number",), "number", lambda x: 2 * x)
    reg = build([
        ("function", "twice", "pkg-a 1.0", lambda: good),
        ("function", "twice", "pkg-b 2.0", lambda: good),  # the same name from another package
        ("function", "lost", "pkg-c 1.0", fails),
        ("function", "typo", "pkg-d 1.0", lambda: Function("typo", ("numbr",), "int", abs)),
        ("function", "alias", "pkg-e 1.0", lambda: good),  # declares another name
        ("aggregate", "sum", "pkg-f 1.0", lambda: builtins._Sum),  # a class, not an instance
        ("operator", "cheap", "pkg-g 1.0", lambda: type("Cheap", (builtins.Dedup,), {"name": "cheap", "cost": 0})),
    ])
    errors = {p.name: p.error for p in reg.all()}
    assert errors["twice"] == "registered by both pkg-a 1.0 and pkg-b 2.0"
    assert errors["lost"] == "ImportError: no module named nowhere"
    assert errors["typo"].startswith("declared types must be among")
    assert errors["alias"] == "its name attribute is 'twice', the entry point says 'alias'"
    assert "not a class" in errors["sum"]
    assert errors["cheap"] == "the declared cost must be a number > 0, not 0"
    assert reg.names("function") == []
