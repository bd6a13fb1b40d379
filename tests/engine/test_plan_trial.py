"""Plan trial (``EXPLAIN ... USING ARCHIVE``, issue 16): candidates run over a slice, same matches, cheapest wins."""
from __future__ import annotations

import random

import pytest

from engine.compiler import compile_query
from engine.events import Event
from engine.lql.parser import parse
from engine.matcher import Matcher
from engine.nfa.plan_trial import trial_plans


def _stream(n: int = 3_000, seed: int = 7) -> list[Event]:
    rnd = random.Random(seed)
    return [
        Event(i + 1, rnd.choice("ABC"), i * 1_000, {"key": rnd.randrange(4), "x": rnd.randrange(100)})
        for i in range(n)
    ]


def _matches(text: str, events: list[Event]) -> int:
    m = Matcher(compile_query(text))
    return sum(len(m.push(e)) for e in events) + len(m.flush())


def test_every_candidate_finds_the_nfa_matches_and_the_cheapest_is_chosen() -> None:
    events = _stream()
    text = "PATTERN SEQ(A a, B b, C c) WHERE a.x < 20 AND b.x > 90 AND c.x > a.x PARTITION BY key WITHIN 50 ms"
    trial = trial_plans(parse(text), events, min_cpu_s=0.0, max_runs=1)
    assert [c["name"] for c in trial["candidates"]] == ["nfa/declared", "nfa/cost", "tree"]
    want = _matches(text, events)
    assert want > 0 and {c["matches"] for c in trial["candidates"]} == {want}
    assert trial["chosen"] == min(trial["candidates"], key=lambda c: c["cpu_s"])["name"]
    assert trial["events"] == len(events) and trial["keys"] == 4
    n_a = sum(e.type == "A" for e in events)
    low = sum(e.type == "A" and e.attrs["x"] < 20 for e in events)
    assert trial["estimates"]["a.x < 20"] == pytest.approx(low / n_a)
    assert trial["candidates"][2]["tree"] is not None


def test_an_explicit_plan_and_a_kleene_pattern_limit_the_candidates() -> None:
    events = _stream(1_000)
    nfa_only = "PATTERN SEQ(A a, B b) WHERE b.x > a.x PARTITION BY key WITHIN 20 ms PLAN nfa"
    assert [c["name"] for c in trial_plans(parse(nfa_only), events, max_runs=1)["candidates"]] == [
        "nfa/declared",
        "nfa/cost",
    ]
    trailing = "PATTERN SEQ(A a, C c, !B n) WHERE c.x > a.x PARTITION BY key WITHIN 20 ms"
    trial = trial_plans(parse(trailing), events, max_runs=1)
    assert [c["name"] for c in trial["candidates"]] == ["nfa/declared", "nfa/cost"]  # a tree cannot take !B n
    kleene = "PATTERN SEQ(A a, B+ b[], C c) WHERE c.x > a.x PARTITION BY key WITHIN 20 ms"
    trial = trial_plans(parse(kleene), events, max_runs=1)
    assert [c["name"] for c in trial["candidates"]] == ["nfa/declared", "nfa/cost", "tree"]
    next_match = "PATTERN SEQ(A a, B b) PARTITION BY key STRATEGY skip_till_next_match WITHIN 20 ms"
    assert "tree" not in [c["name"] for c in trial_plans(parse(next_match), events, max_runs=1)["candidates"]]


def test_an_empty_slice_still_measures_the_candidates() -> None:
    trial = trial_plans(parse("PATTERN SEQ(A a, B b) WITHIN 1 s"), [], max_runs=1)
    assert trial["events"] == 0 and all(c["matches"] == 0 for c in trial["candidates"]) and trial["chosen"]
