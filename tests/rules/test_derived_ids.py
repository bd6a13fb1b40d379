"""Derived event ids (issue 24, item 2): a hash of the emitting statement, its version and the result's inputs
(engine/rules/derived.py ``derived_event_id``), so a replay derives the same events under the same ids."""
from __future__ import annotations

import random

from engine.detector import compile_statement
from engine.events import Event
from engine.lql.parser import parse_script
from engine.match import Match
from engine.rules.derived import DERIVED_ID_MIN, derived_event_id
from engine.rules.graph import RuleGraph

S = 1_000_000

TEXT = """
NAME hi
PATTERN s x WHERE x.v > 80 RETURN x.key AS key, x.v AS v EMIT INTO hi;

NAME per_key
AGGREGATE s x GROUP BY key WINDOW TUMBLING 10 s RETURN count(x) AS n EMIT INTO load;

NAME pairs
AGGREGATE s x GROUP BY key WINDOW COUNT 2 EVERY 1 RETURN count(x) AS n EMIT INTO twos;

NAME pair
PATTERN SEQ(hi a, hi b) PARTITION BY key WITHIN 2 min RETURN a.v AS av, b.v AS bv;

NAME loads
PATTERN SEQ(load a, load b) WITHIN 1 min;

NAME twos_seen
PATTERN twos t
"""


def _stream(n: int, seed: int) -> list[Event]:
    rng = random.Random(seed)
    ts, out = 0, []
    for i in range(1, n + 1):
        ts += rng.choice((0, 0, 1, 2)) * S  # equal timestamps: count windows with the same bounds
        out.append(Event(i, "s", ts, {"key": f"k{rng.randrange(3)}", "v": rng.randrange(100)}))
    return out


def _run(events: list[Event], *, version: int = 1, batch: int = 0) -> tuple[list[tuple[str, Event]], list[Match]]:
    """The derived events (statement, event) and the results of a fresh graph over ``events``."""
    graph = RuleGraph()
    graph.keep_derived = True
    for q in parse_script(TEXT):
        graph.add(q.name or "q", compile_statement(q), version=version)
    results: list[Match] = []
    if batch:
        graph.auto_advance = False
        for i in range(0, len(events), batch):
            part = events[i : i + batch]
            results.extend(m for _, m in graph.push_batch(part))
            wm = part[-1].ts - 1
            results.extend(m for _, m in graph.advance(wm, lambda types, wm=wm: wm))
    else:
        for e in events:
            results.extend(m for _, m in graph.push(e))
    results.extend(m for _, m in graph.flush())
    return graph.take_derived(), results


def test_the_same_input_derives_the_same_ids() -> None:
    events = _stream(600, 1)
    first, results = _run(events)
    again, results_again = _run(events, batch=37)  # another process, other batches: the same events, the same ids
    assert sorted((n, e.id, e.ts, sorted(e.attrs.items())) for n, e in first) == sorted(
        (n, e.id, e.ts, sorted(e.attrs.items())) for n, e in again
    )
    assert sorted(repr(m) for m in results) == sorted(repr(m) for m in results_again)  # readers see equal ids
    kinds = {n for n, _ in first}
    assert kinds == {"hi", "per_key", "pairs"}
    assert {m.query for m in results} == {"pair", "loads", "twos_seen"}


def test_derived_ids_are_distinct_and_above_every_ingested_id() -> None:
    derived, _ = _run(_stream(600, 2))
    ids = [e.id for _, e in derived]
    assert all(DERIVED_ID_MIN <= i < 1 << 63 for i in ids)
    assert len(ids) == len(set(ids))  # two groups of one window (equal fields: n) and two count windows differ
    per_key = [(e.ts, e.attrs["window_end"], e.attrs["n"]) for n, e in derived if n == "per_key"]
    assert len(per_key) > len(set(per_key))  # there are results with equal window and fields, ids still differ
    twos = [(e.ts, e.attrs["window_end"]) for n, e in derived if n == "pairs"]
    assert len(twos) > len(set(twos))  # count windows of equal bounds (equal timestamps) in one group, too


def test_another_version_or_statement_derives_other_ids() -> None:
    events = _stream(200, 3)
    v1 = {e.id for _, e in _run(events)[0]}
    v2 = {e.id for _, e in _run(events, version=2)[0]}
    assert v1 and not v1 & v2
    m = Match("hi", {"x": (events[0],)}, events[0].ts, events[0].ts)
    assert derived_event_id("1", 1, m) == derived_event_id("1", 1, m)
    assert derived_event_id("1", 1, m) != derived_event_id("2", 1, m)
    w1 = Match("w", {}, 0, 10, {"n": 1}, window_key=(("a",), (1, 1), (1, 1)))
    w2 = Match("w", {}, 0, 10, {"n": 1}, window_key=(("b",), (2, 2), (2, 2)))
    assert derived_event_id("1", 1, w1) != derived_event_id("1", 1, w2)
