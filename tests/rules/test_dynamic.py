"""Rules inserted, updated and deleted between ingest batches (003 section 4, issue 14 "Dynamic").

Reference: each rule version runs alone, from empty, over exactly the events ingested while it was active
(``state=reset``); the graph with every change applied between batches must give the same results.
"""
from __future__ import annotations

import random

import pytest

from engine.detector import compile_statement
from engine.events import Event
from engine.matcher import Matcher
from engine.rules.graph import RuleGraph

S = 1_000_000


def _text(rng: random.Random) -> str:
    lo = rng.randrange(0, 60)
    shape = rng.choice(
        [
            "PATTERN SEQ(R a, R b) WHERE a.x > {lo} AND b.x > a.x WITHIN {w} s",
            "PATTERN SEQ(R a, R+ b[]) WHERE a.x > {lo} AND b[i].x > b[i-1].x PARTITION BY k WITHIN {w} s "
            "STRATEGY skip_till_next_match",
            "PATTERN SEQ(R a, R b, R c) WHERE a.k = b.k AND b.k = c.k AND c.x < {lo} WITHIN {w} s",
        ]
    )
    return shape.format(lo=lo, w=rng.choice((3, 10, 30)))


def _events(rng: random.Random, n: int) -> list[Event]:
    ts = 0
    out = []
    for i in range(1, n + 1):
        ts += rng.choice((0, 1, 2)) * S
        out.append(Event(i, "R", ts, {"k": rng.randrange(3), "x": rng.randrange(100)}))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_changes_between_batches_equal_each_version_over_its_active_interval(seed: int) -> None:
    rng = random.Random(seed)
    events = _events(rng, 600)
    batches = [events[i : i + 30] for i in range(0, len(events), 30)]
    graph = RuleGraph()
    active: dict[str, tuple[str, int, int]] = {}  # name -> (text, version, first batch)
    versions: list[tuple[str, int, str, int, int | None]] = []  # name, version, text, from batch, to batch
    got: set[tuple[str, int, tuple]] = set()
    counter = 0
    for b, batch in enumerate(batches):
        for _ in range(rng.randrange(3)):
            op = rng.choice(("insert", "update", "delete")) if active else "insert"
            if op == "insert":
                counter += 1
                name = f"r{counter}"
                text = _text(rng)
                graph.add(name, compile_statement(f"NAME {name} {text}"))
                active[name] = (text, 1, b)
            else:
                name = rng.choice(sorted(active))
                text, version, since = active.pop(name)
                graph.remove(name)
                versions.append((name, version, text, since, b))
                if op == "update":
                    text = _text(rng)
                    graph.add(name, compile_statement(f"NAME {name} {text}"))
                    active[name] = (text, version + 1, b)
        current = {name: v for name, (_, v, _) in active.items()}
        for e in batch:
            for name, m in graph.push(e):
                got.add((name, current[name], m.key()))
    current = {name: v for name, (_, v, _) in active.items()}
    for name, m in graph.flush():
        got.add((name, current[name], m.key()))
    versions.extend((name, v, text, since, None) for name, (text, v, since) in active.items())

    want: set[tuple[str, int, tuple]] = set()
    for name, version, text, since, until in versions:
        matcher = Matcher(compile_statement(f"NAME {name} {text}"))
        for batch in batches[since:until]:
            for e in batch:
                want.update((name, version, m.key()) for m in matcher.push(e))
        if until is None:
            want.update((name, version, m.key()) for m in matcher.flush())
    assert got == want
    assert len(versions) > 3 and got
