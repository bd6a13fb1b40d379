"""How far back an operator's state reaches (issue 24, item 7): the optional ``history_us()`` of the operator
contract, and a pattern's ``state_span_us`` (WITHIN plus it), which a restart's replay begins before."""
from __future__ import annotations

from engine.compiler import compile_query
from engine.plugins.stage import operators_history_us

MIN = 60_000_000


def test_dedup_remembers_its_period_beyond_the_window() -> None:
    q = compile_query("PATTERN SEQ(dedup(alarm, 5 min) d, alarm b) PARTITION BY key WITHIN 1 min")
    assert operators_history_us(q.operators) == 5 * MIN
    assert q.state_span_us == 6 * MIN


def test_an_operator_without_the_declaration_remembers_nothing_beyond_the_window() -> None:
    q = compile_query("PATTERN SEQ(vshape(bar) v, bar b) WITHIN 10 min")
    assert operators_history_us(q.operators) == 0
    assert q.state_span_us == 10 * MIN


def test_without_operators_or_without_within() -> None:
    assert compile_query("PATTERN SEQ(a x, b y) WITHIN 2 min").state_span_us == 2 * MIN
    assert compile_query("PATTERN SEQ(dedup(alarm, 5 min) d, alarm b)").state_span_us is None


def test_a_pattern_of_one_event_keeps_no_state() -> None:
    """One event without WITHIN keeps no partial match: a restart replays nothing for it (it was reported as a
    statement without a bound, with a warning that partial matches were lost, when it had none)."""
    assert compile_query("PATTERN s x WHERE x.v > 88").state_span_us == 0
    assert compile_query("PATTERN SEQ(s x)").state_span_us == 0
    assert compile_query("PATTERN SEQ(s+ x[])").state_span_us is None  # a Kleene closure without WITHIN
    assert compile_query("PATTERN SEQ(a x, b y)").state_span_us is None
