"""Plan trial: run a live query's candidate plans over a slice of history and pick by measured cost.

``EXPLAIN ... USING ARCHIVE [from, to)`` (issue 16, "better than any peer"): where 004's cost
model (formulas (5)-(10), :mod:`engine.nfa.explain`) *estimates* each plan's cost, a trial
*measures* it. The candidates, each compiled from the same syntax tree:

- ``nfa/declared``: the linear NFA, WHERE conjuncts in declaration order on every edge;
- ``nfa/cost``: the linear NFA, conjuncts ordered by ascending ``cost / (1 - p)`` with the pass
  probabilities ``p`` measured over the slice (004 Strategy 1; :func:`measured_estimates`);
- ``tree``: the tree plan the cost model picks with the slice's rates (ZStream-style, rare
  components first), when the strategy is skip_till_any_match and the pattern has no trailing
  negation (:func:`engine.nfa.tree.tree_supported`, :func:`engine.compiler.choose_plan`).

A query's explicit ``PLAN nfa`` or ``PLAN tree`` limits the candidates to that kind. Each candidate
runs over the slice (events in (ts, id) order, then ``flush``) at least once and until it has used
``min_cpu_s`` of CPU (at most ``max_runs`` runs); its cost is its smallest CPU time per run. Every
candidate must find the same number of matches (plans never change results; a difference is an
engine bug and raises). The winner is the cheapest; ties keep the earlier candidate.

Pure engine code: the caller reads the slice (the service and ``lace explain --archive`` read it from
the Delta archive through Spark, :meth:`archive.stats.ArchiveStats.plan_trial`).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from typing import Any

from engine.compiler import CompiledQuery, compile_query
from engine.events import Event
from engine.lql.ast import PatternQuery, Schema
from engine.lql.errors import QueryError
from engine.matcher import Matcher
from engine.nfa.explain import explain, measured_estimates, profile_events
from engine.nfa.tree import shape_text

MIN_CPU_S = 0.2
"""Each candidate runs until it has used this much CPU time (seconds), at least once."""
MAX_RUNS = 5
"""At most this many runs per candidate."""


class PlanTrialError(RuntimeError):
    """Two candidate plans found different numbers of matches over the same slice (an engine bug)."""


def _run(query: Any, events: list[Event]) -> tuple[float, int]:
    """(CPU seconds, matches) of one run of ``query`` over ``events`` with a fresh matcher."""
    started = time.thread_time()
    m = Matcher(query)
    n = 0
    push = m.push
    for e in events:
        n += len(push(e))
    n += len(m.flush())
    return time.thread_time() - started, n


def trial_plans(
    query: PatternQuery,
    events: Iterable[Event],
    schemas: Schema | None = None,
    *,
    min_cpu_s: float = MIN_CPU_S,
    max_runs: int = MAX_RUNS,
) -> dict[str, Any]:
    """Run the candidate plans of the live query ``query`` over ``events`` and pick the cheapest.

    Parameters
    ----------
    query : PatternQuery
        A parsed live-only pattern query (``engine.lql.parser.parse``).
    events : iterable of Event
        The slice (any order; sorted by (ts, id) here). Events of other types are ignored.
    schemas : dict, optional
        Event type -> {attribute -> type}, to type-check as the service does.
    min_cpu_s, max_runs : float, int
        See the module docstring.

    Returns
    -------
    dict
        JSON-ready: ``events`` (of the query's types), ``keys`` (partition keys seen), ``estimates``
        (measured pass probability per conjunct text), ``rates`` (events per second per type and key),
        ``candidates`` (per candidate ``name``, ``plan_kind``, ``order``, ``tree`` (shape text or
        None), ``runs``, ``cpu_s`` (best run), ``events_per_s``, ``matches``) and ``chosen`` (the
        winner's ``name``).

    Raises
    ------
    PlanTrialError
        When two candidates disagree on the number of matches.
    QueryError
        When the query does not compile against ``schemas``.
    """
    base = compile_query(query, schemas)
    sample = sorted((e for e in events if e.type in base.types), key=lambda e: (e.ts, e.id))
    estimates = measured_estimates(explain(base, events=sample)) if sample else {}
    prof = profile_events(base, sample)
    rates = {t: r / prof.keys for t, r in prof.rates.items()}
    wanted = query.plan
    specs: list[tuple[str, str, str]] = []  # (name, plan kind, order)
    if wanted in ("auto", "nfa"):
        specs += [("nfa/declared", "nfa", "declared"), ("nfa/cost", "nfa", "cost")]
    if wanted in ("auto", "tree") and query.strategy == "skip_till_any_match":
        specs.append(("tree", "tree", "cost"))
    candidates: list[dict[str, Any]] = []
    found: int | None = None
    for name, kind, order in specs:
        try:
            compiled = compile_query(
                dataclasses.replace(query, plan=kind), schemas, estimates=estimates, order=order, rates=rates
            )
        except QueryError:  # a tree this pattern cannot take (trailing negation ...): not a candidate
            if kind == "tree" and wanted == "auto":
                continue
            raise
        best, runs, spent, n = float("inf"), 0, 0.0, 0
        while runs < max(1, max_runs) and (runs == 0 or spent < min_cpu_s):
            cpu, n = _run(compiled, sample)
            best, runs, spent = min(best, cpu), runs + 1, spent + cpu
        if found is not None and n != found:
            raise PlanTrialError(f"plan {name} found {n} matches where {candidates[0]['name']} found {found}")
        found = n
        tree = None
        if compiled.plan_kind == "tree":
            shapes = zip(compiled.plans, compiled.trees)
            tree = "; ".join(shape_text(s, [v.var for v in p.slots]) for p, (s, _) in shapes)
        candidates.append(
            {
                "name": name,
                "plan_kind": compiled.plan_kind,
                "order": order,
                "tree": tree,
                "runs": runs,
                "cpu_s": round(best, 6),
                "events_per_s": round(len(sample) / best, 1) if best > 0 else None,
                "matches": n,
            }
        )
    chosen = min(candidates, key=lambda c: c["cpu_s"])["name"] if candidates else None
    return {
        "events": len(sample),
        "keys": prof.keys,
        "estimates": estimates,
        "rates": rates,
        "candidates": candidates,
        "chosen": chosen,
    }


def plan_choice(trial: dict[str, Any]) -> dict[str, Any] | None:
    """What a query keeps of a trial to be compiled as its winner: ``{"chosen", "plan_kind", "order",
    "estimates", "rates"}`` (JSON-ready; stored with a registered query), or None when nothing ran."""
    chosen = next((c for c in trial["candidates"] if c["name"] == trial["chosen"]), None)
    if chosen is None:
        return None
    return {
        "chosen": chosen["name"],
        "plan_kind": chosen["plan_kind"],
        "order": chosen["order"],
        "estimates": dict(trial["estimates"]),
        "rates": dict(trial["rates"]),
    }


def compile_chosen(query: PatternQuery, schemas: Schema | None, choice: dict[str, Any]) -> CompiledQuery:
    """Compile ``query`` as the plan :func:`plan_choice` describes: its plan kind, conjunct order, and the
    slice's pass probabilities and rates (the online planner re-orders from there as rates drift).

    Raises
    ------
    QueryError
        When the query no longer compiles against ``schemas``.
    """
    return compile_query(
        dataclasses.replace(query, plan=choice["plan_kind"]),
        schemas,
        estimates=choice.get("estimates") or None,
        order=choice.get("order", "cost"),
        rates=choice.get("rates") or None,
    )


def choose_by_trial(
    query: CompiledQuery, events: Iterable[Event], schemas: Schema | None = None
) -> tuple[dict[str, Any], CompiledQuery]:
    """:func:`trial_plans` over ``events`` for the compiled live query ``query`` (its syntax tree, strategy
    override included), then the winner compiled (:func:`compile_chosen`; ``query`` itself when no candidate
    ran). Returns ``(trial, compiled)``; ``trial["choice"]`` is :func:`plan_choice`'s, what a registered query
    keeps. Raises as :func:`trial_plans`."""
    trial = trial_plans(query.ast, events, schemas)
    choice = trial["choice"] = plan_choice(trial)
    return trial, (query if choice is None else compile_chosen(query.ast, schemas, choice))


def explain_chosen(compiled: CompiledQuery, trial: dict[str, Any]) -> dict[str, Any]:
    """EXPLAIN of the plan a trial chose (:func:`engine.nfa.explain.explain`), its cost model fed with the
    slice's rates and keys, and the trial under ``"trial"``."""
    keys = trial["keys"]
    result = explain(compiled, rates={t: r * keys for t, r in trial["rates"].items()}, keys=keys)
    result["trial"] = trial
    return result
