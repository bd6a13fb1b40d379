"""``join_instances`` (the archive join ``lace stream`` runs per micro-batch and key): completed live instances and
the archived events give exactly what a replay gives, in its order, however the instances are batched."""
from __future__ import annotations

import random
from pathlib import Path

from engine.events import Event
from engine.io import read_events
from engine.live_archived import compile_live_archived, join_instances, run_memory
from engine.live_archived.plan import NO_KEY
from engine.match_files import match_line
from engine.matcher import Matcher

DATA = Path(__file__).resolve().parents[2] / "cli" / "demo_data"
QUERIES = DATA / "queries"


def bars(n: int = 3_000) -> list[Event]:
    return sorted(read_events(DATA / "bars_1m.csv"), key=Event.order_key)[:n]


def live_instances(plan, events: list[Event]):
    matcher = Matcher(plan.live)
    found = [m for e in events for m in matcher.push(e)]
    return found + matcher.flush()


def test_batches_of_instances_give_the_replay_results_in_its_order():
    plan = compile_live_archived((QUERIES / "drop_after_rebound.lql").read_text())
    events = bars()
    expected = [match_line(r) for r in run_memory(plan, "sllaa", events, tolerance_us=60_000_000)[0]]
    assert len(expected) >= 10
    instances = live_instances(plan, events)
    rng = random.Random(7)
    got: list[str] = []
    i = 0
    while i < len(instances):  # batches of any size, each with the archived events of its keys only, shuffled
        batch = instances[i:i + rng.randint(1, 9)]
        i += len(batch)
        keys = {plan.key_of(m) for m in batch}
        archived = [e for e in events if e.get("key") in keys]
        rng.shuffle(archived)
        results = join_instances(plan, batch, archived)
        assert len(results) == len(batch)
        got += [match_line(r) for found in results for r in found]
    assert got == expected


def test_grouped_results_one_per_instance_and_a_missing_key_joins_nothing():
    plan = compile_live_archived(
        "NAME g LIVE PATTERN SEQ(bar a, bar b) WHERE b.close < a.close PARTITION BY key WITHIN 2 min "
        "ARCHIVED PATTERN SEQ(bar c) WHERE c.close > 0 PARTITION BY key LOOKBACK 1 hour "
        "JOIN a.key = c.key RETURN a.key AS symbol, count(c) AS before"
    )
    events = bars(600)
    expected = [match_line(r) for r in run_memory(plan, "llaa", events)[0]]
    instances = live_instances(plan, events)
    results = join_instances(plan, instances, events)
    assert all(len(found) <= 1 for found in results)
    assert [match_line(r) for found in results for r in found] == expected
    assert len(expected) >= 10
    keyless = [Event(10**9, "bar", 0, {"close": 2.0}), Event(10**9 + 1, "bar", 60_000_000, {"close": 1.0})]
    none_key = live_instances(plan, keyless)
    assert none_key and plan.key_of(none_key[0]) is NO_KEY
    assert join_instances(plan, none_key, events) == [[]]
    assert join_instances(plan, [], events) == []
