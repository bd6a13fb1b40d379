"""Plan benchmarks after 004 (section 5.1, figures 4(b) and 5): push-down, conjunct order, a rare-last query.

    python -m bench.plans                       # (a), (b), (c), (d), (t) at their default sizes
    python -m bench.plans --only a              # only (a)
    python -m bench.plans --only b --n-b 2000   # one experiment, smaller
    python -m bench.plans --only d --day 2013-10-08

(a) ``SEQ(A a, !B b, C* c[], D d)`` with equalities on uniform attributes, 10^4 events per type: every tree
    shape forced, ``PLAN auto`` given the rates, and the linear NFA. Target: auto within 5% of the best
    forced shape (004 found 21.7% between the best and the worst).
(b) ``SEQ(A a, B b, C c, D d)`` with 004's six predicates WE1..WE6 (pass probabilities 1/4, 1/8,
    1/2, 0.8, 1/4, 1/16 over AB, AB, AB, BC, CD, BD): push-down on (each predicate at the earliest
    NFA edge) against off (all on the complete match). Target >= 7.6x.
(c) ``SEQ(A a, B b)`` with WE1..WE3, 10^6 + 10^6 events: the six evaluation orders forced
    (``order="declared"``, no re-ordering) against auto (declared K123, re-ordered from measured
    rates). Target: auto within 5% of the best forced order.
(d) ``SEQ(quote q, trade t) WHERE t.size >= 10000 AND t.price < q.bid_price PARTITION BY key WITHIN 1 s``
    over one day of the LEAN equity ticks (../shared/data/equity): auto (cost order, push-down,
    chain storage) against declaration order evaluated one run per partial match (SASE/Esper style).
(t) ``SEQ(A a, B b, C c) WHERE c.x = b.x WITHIN 1 s`` with C rare: the linear NFA against the tree
    plan ``PLAN auto`` picks from the rates, and every tree shape forced.

Every variant of an experiment runs in this process over the same events already in memory,
side by side (variants interleaved, best of ``--repeat``), and must find the same matches. Each
experiment also reports the cost model's predicted per-node counts (``engine.nfa.explain``) against
the measured ones on a slice. Times (``s``) are the process's CPU seconds of ``Matcher.push`` over
every event plus ``flush`` (``wall_s`` beside them); record ``uptime`` with them (the machine is shared).
"""
from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.compiler import compile_query
from engine.events import Event
from engine.matcher import Matcher
from engine.nfa.explain import explain, measured_estimates

EQUITY = Path(os.environ.get("LACE_SHARED_DATA", "/work/shared/data")) / "equity"

# 004, section 5.1.2: WE1..WE6, (attribute, domain, operator, variables) -> pass probability
WE = {
    "WE1": ("b.p1 = a.p1", 0.25),
    "WE2": ("b.p2 = a.p2", 0.125),
    "WE3": ("b.p3 = a.p3", 0.5),
    "WE4": ("c.p4 != b.p4", 0.8),
    "WE5": ("d.p5 = c.p5", 0.25),
    "WE6": ("d.p6 = b.p6", 1 / 16),
}
DOMAINS = {"p1": 4, "p2": 8, "p3": 2, "p4": 5, "p5": 4, "p6": 16}
"""Uniform attribute domains giving WE's probabilities: = over 4 values is 1/4, != over 5 is 0.8..."""


def uniform_events(types: str, n_per_type: int, per_window: float, window_us: int, seed: int) -> list[Event]:
    """``n_per_type`` events of each type in ``types``, shuffled, timestamps at a constant mean rate such that
    ``per_window`` events of one type fall in one window; attributes ``p1..p6`` uniform over :data:`DOMAINS`."""
    rnd = random.Random(seed)
    kinds = [t for t in types for _ in range(n_per_type)]
    rnd.shuffle(kinds)
    gap = window_us / (per_window * len(types))
    out = []
    ts = 0.0
    for i, t in enumerate(kinds):
        ts += rnd.uniform(0.5, 1.5) * gap
        out.append(Event(i, t, int(ts), {p: rnd.randrange(d) for p, d in DOMAINS.items()}))
    return out


def timed(make: Callable[[], Matcher], events: list[Event]) -> tuple[float, float, int, Matcher]:
    """(wall seconds, CPU seconds of this process, matches, matcher) of pushing every event and flushing."""
    gc.collect()
    m = make()
    push = m.push
    n = 0
    t0 = time.perf_counter()
    c0 = time.process_time()
    for e in events:
        n += len(push(e))
    n += len(m.flush())
    return time.perf_counter() - t0, time.process_time() - c0, n, m


def side_by_side(
    variants: dict[str, Callable[[], Matcher]], events: list[Event], repeat: int
) -> dict[str, dict[str, Any]]:
    """Run the variants interleaved ``repeat`` times; best CPU time (``s``) and wall time of each, match counts
    checked equal. CPU time is the comparison: on the shared machine the wall time varies with the load."""
    best: dict[str, dict[str, Any]] = {}
    for _ in range(repeat):
        for name, make in variants.items():
            wall, cpu, n, m = timed(make, events)
            row = best.setdefault(
                name, {"s": cpu, "wall_s": wall, "matches": n, "reorders": m.stats()["conjunct_reorders"]}
            )
            row["s"] = min(row["s"], cpu)
            row["wall_s"] = min(row["wall_s"], wall)
            if row["matches"] != n:
                raise AssertionError(f"{name}: {n} matches, earlier run {row['matches']}")
    counts = {r["matches"] for r in best.values()}
    if len(counts) != 1:
        raise AssertionError(f"variants disagree on the matches: { {k: v['matches'] for k, v in best.items()} }")
    return best


def model_vs_measured(text: str, events: list[Event], estimates: dict[str, float]) -> list[dict[str, Any]]:
    """Per node of plan 0: the cost model's predicted input/output counts and the measured ones, and their ratio."""
    result = explain(compile_query(text, estimates=estimates), events=events)
    rows = []
    for n in result["plans"][0]["nodes"]:
        e, m = n["estimate"], n["measured"]
        rows.append(
            {
                "node": n["var"],
                "predicted_in": round(e["input"]),
                "measured_in": m["input"],
                "predicted_out": round(e["output"]),
                "measured_out": m["output"],
                "ratio_in": round(e["input"] / m["input"], 3) if m["input"] else None,
                "ratio_out": round(e["output"] / m["output"], 3) if m["output"] else None,
            }
        )
    return rows


# ---------------------------------------------------------------- (a) negation, Kleene closure, tree shapes

QUERY_A = (
    "PATTERN SEQ(A a, !B b, C* c[], D d) WHERE d.p1 = a.p1 AND b.p3 = a.p3 AND c[i].p2 = a.p2 AND d.p6 = 0 "
    "WITHIN 1 s"
)
ESTIMATES_A = {"d.p1 = a.p1": 0.25, "b.p3 = a.p3": 0.5, "c[i].p2 = a.p2": 0.125, "d.p6 = 0": 1 / 16}
"""The conjuncts' pass probabilities over the uniform attributes (:data:`DOMAINS`)."""


def bench_a(n: int, per_window: float, repeat: int) -> dict[str, Any]:
    """``QUERY_A`` over ``n`` events per type, ``per_window`` of one type per 1 s window: the linear NFA (chain
    storage), ``PLAN auto`` given the rates and :data:`ESTIMATES_A`, and every tree shape forced. The negation
    is not a leaf (it is checked at the node joining ``a`` with the component after it, ZStream's NSEQ), so the
    shapes are those over the positive components of each linear plan: ``(a d)`` for the plan without ``c``,
    ``((a c) d)`` and ``(a (c d))`` for the one with ``C+ c[]``."""
    import dataclasses

    from engine.nfa.tree import all_shapes, shape_text

    events = uniform_events("ABCD", n, per_window, 1_000_000, seed=3)
    rates = {t: per_window for t in "ABCD"}  # events per second (per key: one key)
    auto = compile_query(QUERY_A, estimates=ESTIMATES_A, rates=rates)
    forced = compile_query(QUERY_A + " PLAN tree", estimates=ESTIMATES_A, rates=rates)
    names = [[s.var for s in p.slots] for p in forced.plans]
    variants: dict[str, Callable[[], Matcher]] = {
        "nfa": lambda: Matcher(compile_query(QUERY_A + " PLAN nfa", estimates=ESTIMATES_A)),
        "auto": lambda: Matcher(auto),
    }
    for combo in itertools.product(*(list(all_shapes(0, len(p.slots) - 1)) for p in forced.plans)):
        q = dataclasses.replace(forced, trees=[(shape, t[1]) for shape, t in zip(combo, forced.trees)])
        name = "tree " + "; ".join(shape_text(shape, v) for shape, v in zip(combo, names))
        variants[name] = lambda q=q: Matcher(q)
    res = side_by_side(variants, events, repeat)
    trees = {k: v["s"] for k, v in res.items() if k.startswith("tree ")}
    best, worst = min(trees, key=lambda k: trees[k]), max(trees, key=lambda k: trees[k])
    chosen = (
        "; ".join(shape_text(t[0], v) for t, v in zip(auto.trees, names)) if auto.plan_kind == "tree" else "nfa"
    )
    return {
        "experiment": "a",
        "query": QUERY_A,
        "events": len(events),
        "per_window": per_window,
        "auto_plan": chosen,
        "model_tree": "; ".join(shape_text(t[0], v) for t, v in zip(forced.trees, names)),
        "variants": res,
        "best_forced": best,
        "worst_forced": worst,
        "worst_over_best": round(trees[worst] / trees[best], 3),
        "auto_over_best": round(res["auto"]["s"] / trees[best], 3),
    }


# --------------------------------------------------------------------------- (b) push-down


def query_b() -> str:
    where = " AND ".join(text for text, _ in WE.values())
    return f"PATTERN SEQ(A a, B b, C c, D d) WHERE {where} WITHIN 1 s"


def bench_b(n: int, per_window: float, repeat: int) -> dict[str, Any]:
    events = uniform_events("ABCD", n, per_window, 1_000_000, seed=4)
    text = query_b()
    est = {t: p for t, p in WE.values()}
    variants = {
        "push-down on": lambda: Matcher(compile_query(text, estimates=est)),
        "push-down off": lambda: Matcher(compile_query(text, estimates=est, push_down=False)),
    }
    res = side_by_side(variants, events, repeat)
    return {
        "experiment": "b",
        "query": text,
        "events": len(events),
        "per_window": per_window,
        "variants": res,
        "speedup": round(res["push-down off"]["s"] / res["push-down on"]["s"], 2),
        "model": model_vs_measured(text, events[: min(len(events), 8000)], est),
    }


# --------------------------------------------------------------------------- (c) conjunct order


def bench_c(n: int, per_window: float, repeat: int) -> dict[str, Any]:
    events = uniform_events("AB", n, per_window, 1_000_000, seed=5)
    texts = {k: WE[k][0] for k in ("WE1", "WE2", "WE3")}

    def q(order: tuple[str, ...]) -> str:
        return "PATTERN SEQ(A a, B b) WHERE " + " AND ".join(texts[k] for k in order) + " WITHIN 1 s"

    variants: dict[str, Callable[[], Matcher]] = {}
    for perm in itertools.permutations(("WE1", "WE2", "WE3")):
        name = "K" + "".join(k[-1] for k in perm)
        text = q(perm)
        variants[name] = lambda text=text: Matcher(compile_query(text, order="declared"), adaptive=False)
    k123 = q(("WE1", "WE2", "WE3"))
    variants["auto"] = lambda: Matcher(compile_query(k123, order="declared"), adaptive=True)
    res = side_by_side(variants, events, repeat)
    forced = {k: v["s"] for k, v in res.items() if k != "auto"}
    best = min(forced, key=lambda k: forced[k])
    est = {WE[k][0]: WE[k][1] for k in texts}
    return {
        "experiment": "c",
        "query": k123,
        "events": len(events),
        "per_window": per_window,
        "variants": res,
        "best_forced": best,
        "auto_over_best": round(res["auto"]["s"] / forced[best], 3),
        "model": model_vs_measured(k123, events[:20000], est),
    }


# --------------------------------------------------------------------------- (d) rare-last real query

QUERY_D = (
    "PATTERN SEQ(quote q, trade t) WHERE t.size >= 10000 AND t.price < q.bid_price PARTITION BY key WITHIN 1 s"
)


def equity_events(day: str, hours: float | None) -> list[Event]:
    """Quotes (bid_price) and trades (price, size) of one UTC day (``YYYY-MM-DD``), optionally its first
    ``hours`` of regular session, in (ts, id) order; ts in microseconds."""
    import datetime as dt

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    start = int(dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC).timestamp() * 1000)
    lo = start + (13 * 3600 + 30 * 60) * 1000 if hours is not None else start  # 09:30 New York (EDT)
    hi = lo + int(hours * 3600 * 1000) if hours is not None else start + 86_400_000
    rows: list[tuple[int, int, str, dict[str, Any]]] = []
    for name, kind, cols in (
        ("lean_quotes_tick.parquet", "quote", ["bid_price"]),
        ("lean_trades_tick.parquet", "trade", ["price", "size"]),
    ):
        t = pq.read_table(EQUITY / name, columns=["key", "ts_ms", *cols])
        t = t.filter(pc.and_(pc.greater_equal(t["ts_ms"], lo), pc.less(t["ts_ms"], hi)))
        data = t.to_pydict()
        for i in range(t.num_rows):
            attrs = {"key": data["key"][i], **{c: data[c][i] for c in cols}}
            rows.append((data["ts_ms"][i] * 1000, 0 if kind == "quote" else 1, kind, attrs))
    rows.sort(key=lambda r: (r[0], r[1]))
    return [Event(i, kind, ts, attrs) for i, (ts, _, kind, attrs) in enumerate(rows)]


def bench_d(day: str, hours: float | None, repeat: int) -> dict[str, Any]:
    events = equity_events(day, hours)
    trades = [e for e in events if e.type == "trade"]
    big = sum(1 for e in trades if e.attrs["size"] >= 10000)
    variants = {
        "auto": lambda: Matcher(compile_query(QUERY_D)),
        "declaration order, run per partial match": lambda: Matcher(
            compile_query(QUERY_D, order="declared"), storage="runs", adaptive=False
        ),
        "declaration order, chain storage": lambda: Matcher(compile_query(QUERY_D, order="declared"), adaptive=False),
        "push-down off": lambda: Matcher(compile_query(QUERY_D, push_down=False)),
    }
    res = side_by_side(variants, events, repeat)
    # the model predicts the counts on 300,000 events after the first fifth of the day, with pass rates
    # (1) measured on that same slice (the count model alone) and (2) measured on the first fifth, as an
    # EXPLAIN over archived events would give them (the count model plus the drift of the rates)
    cut = len(events) // 5
    model_slice = events[cut : cut + 300_000]
    est = measured_estimates(explain(compile_query(QUERY_D), events=model_slice))
    est_before = measured_estimates(explain(compile_query(QUERY_D), events=events[:cut]))
    return {
        "experiment": "d",
        "query": QUERY_D,
        "slice": {"day": day, "hours_from_open": hours},
        "events": len(events),
        "trades": len(trades),
        "qualifying_trades": big,
        "variants": res,
        "speedup_vs_runs": round(res["declaration order, run per partial match"]["s"] / res["auto"]["s"], 2),
        "speedup_vs_chain_declared": round(res["declaration order, chain storage"]["s"] / res["auto"]["s"], 2),
        "model": model_vs_measured(QUERY_D, model_slice, est),
        "model_events": len(model_slice),
        "model_estimates": est,
        "model_from_earlier_rates": model_vs_measured(QUERY_D, model_slice, est_before),
        "earlier_estimates": est_before,
    }


# --------------------------------------------------------------------------- (t) tree plan, rare last component

QUERY_T = "PATTERN SEQ(A a, B b, C c) WHERE c.x = b.x WITHIN 1 s"
RATES_T = {"A": 100.0, "B": 100.0, "C": 0.5}


def bench_t(n: int, repeat: int) -> dict[str, Any]:
    """``SEQ(A, B, C)`` with C rare (Poisson arrivals at :data:`RATES_T` per second): the linear NFA (chain
    storage) against ``PLAN auto`` given the rates, which picks the tree ``(a (b c))``, and every other tree."""
    from engine.nfa.tree import all_shapes, shape_text

    rnd = random.Random(6)
    total = sum(RATES_T.values())
    events = []
    ts = 0.0
    for i in range(n):
        ts += rnd.expovariate(total) * 1e6
        r = rnd.random() * total
        t = "A" if r < RATES_T["A"] else "B" if r < RATES_T["A"] + RATES_T["B"] else "C"
        events.append(Event(i, t, int(ts), {"x": rnd.randrange(10)}))
    auto = compile_query(QUERY_T, rates=RATES_T)
    variants: dict[str, Callable[[], Matcher]] = {
        "nfa": lambda: Matcher(compile_query(QUERY_T + " PLAN nfa")),
        "auto": lambda: Matcher(auto),
    }
    import dataclasses

    for shape in all_shapes(0, 2):
        forced = dataclasses.replace(auto, plan_kind="tree", trees=[(shape, auto.trees[0][1])])
        variants["tree " + shape_text(shape, ["a", "b", "c"])] = lambda forced=forced: Matcher(forced)
    res = side_by_side(variants, events, repeat)
    return {
        "experiment": "t",
        "query": QUERY_T,
        "rates": RATES_T,
        "events": len(events),
        "auto_plan": auto.plan_kind + " " + shape_text(auto.trees[0][0], ["a", "b", "c"]),
        "variants": res,
        "speedup": round(res["nfa"]["s"] / res["auto"]["s"], 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="a,b,c,d,t", help="comma-separated experiments among a, b, c, d, t")
    ap.add_argument("--n-a", type=int, default=10_000, help="(a) events per type")
    ap.add_argument("--per-window-a", type=float, default=4.0, help="(a) events of one type per window")
    ap.add_argument("--n-t", type=int, default=200_000, help="(t) events")
    ap.add_argument("--n-b", type=int, default=3000, help="(b) events per type")
    ap.add_argument("--per-window-b", type=float, default=12.0, help="(b) events of one type per window")
    ap.add_argument("--n-c", type=int, default=1_000_000, help="(c) events per type")
    ap.add_argument("--per-window-c", type=float, default=4.0, help="(c) A events per window")
    ap.add_argument("--day", default="2013-10-08", help="(d) UTC day of the equity slice")
    ap.add_argument("--hours", type=float, default=None, help="(d) only the first HOURS after the open")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)
    gc.freeze()
    out = []
    for exp in args.only.split(","):
        load = os.getloadavg()
        if exp == "a":
            r = bench_a(args.n_a, args.per_window_a, args.repeat)
        elif exp == "b":
            r = bench_b(args.n_b, args.per_window_b, args.repeat)
        elif exp == "c":
            r = bench_c(args.n_c, args.per_window_c, args.repeat)
        elif exp == "d":
            r = bench_d(args.day, args.hours, args.repeat)
        elif exp == "t":
            r = bench_t(args.n_t, args.repeat)
        else:
            ap.error(f"unknown experiment {exp!r}")
        r["load_before"] = [round(x, 2) for x in load]
        r["load_after"] = [round(x, 2) for x in os.getloadavg()]
        r["machine"] = f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
        print(json.dumps(r), flush=True)
        out.append(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
