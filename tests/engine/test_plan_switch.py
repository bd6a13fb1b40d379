"""A plan switch in the middle of a stream changes no result (issue 16): ``RuleGraph.replace`` swaps a running
statement's plan (NFA with declared or cost order, a tree plan under skip_till_any_match), rebuilds its state from
the current window's events, and the results before and after the switch are the oracle's, each once."""
from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.compiler import compile_query
from engine.detector import make_detector
from engine.events import Event
from engine.lql.errors import QueryError
from engine.rules.graph import RuleGraph
from tests.engine.oracle import enumerate_matches
from tests.engine.patterns import Case, cases

HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


def _plans(case: Case) -> list:
    """The plans the query can switch between: the NFA in declaration order and in cost order, and a tree."""
    plans = [compile_query(case.query, order="declared"), compile_query(case.query, order="cost")]
    try:
        plans.append(compile_query(dataclasses.replace(case.query, plan="tree")))
    except QueryError:
        pass  # not skip_till_any_match, or a Kleene closure or negation: no tree plan
    return plans


def _window_events(seen: list[Event], within_us: int | None) -> list[Event]:
    """What the service replays from its recent buffer: the events from ``newest ts - WITHIN`` on."""
    if within_us is None or not seen:
        return list(seen)
    since = max(e.ts for e in seen) - within_us
    return [e for e in seen if e.ts >= since]


@settings(max_examples=300, deadline=None, suppress_health_check=HEALTH)
@given(case=cases(), cut=st.floats(0.0, 1.0), pick=st.integers(0, 5))
def test_a_plan_switch_mid_stream_changes_no_result(case: Case, cut: float, pick: int) -> None:
    plans = _plans(case)
    first, second = plans[pick % len(plans)], plans[(pick + 1) % len(plans)]
    graph = RuleGraph()
    graph.add("q", first, make_detector(first))
    k = round(cut * len(case.events))
    out = [m for e in case.events[:k] for _, m in graph.push(e)]
    history = _window_events(case.events[:k], case.query.within_us)
    graph.replace("q", second, make_detector(second), history, graph.watermark if k else None)
    out += [m for e in case.events[k:] for _, m in graph.push(e)]
    out += [m for _, m in graph.flush()]
    keys = [m.key() for m in out]
    assert set(keys) == enumerate_matches(case.query, case.events), case.describe()
    assert len(keys) == len(set(keys)), f"a result repeated after the switch\n{case.describe()}"


def test_replace_keeps_the_statement() -> None:
    graph = RuleGraph()
    a = compile_query("PATTERN SEQ(A a, B b) WITHIN 1 s")
    graph.add("q", a, make_detector(a))
    other = compile_query("PATTERN SEQ(A a, C c) WITHIN 1 s")
    try:
        graph.replace("q", other, make_detector(other), [], None)
    except ValueError as e:
        assert "a plan switch keeps the statement" in str(e)
    else:
        raise AssertionError("a different statement was taken as a plan switch")
