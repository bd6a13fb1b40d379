"""EXPLAIN of a live pattern query: the NFA plan, the cost model's estimates and, with events, measured counts.

The cost model is 004's (section 4, formulas (5)-(10)) applied to a linear NFA (the
paper's left-deep tree ``((E1 S1 E2) S2 E3) ...``): node j is NFA state j, where
partial matches of slots ``0..j-1`` meet the events of slot j.

- ``input_rate`` (``Num_j`` per second): node 0 sees the events of its types,
  ``R_0``; node j >= 1 sees pairs (partial match, event of slot j) inside the window:
  ``Num_j = out_{j-1} * (R_j / K) * W / j``, where ``R_j`` is the rate of slot j's
  types, ``K`` the number of partition keys (events spread evenly) and ``W`` the window
  in seconds (a partial match of j events has on average ``W / j`` of its window left,
  for events arriving at a constant rate). ``out_j = Num_j * P_j``.
  With events, real streams are neither even over keys nor steady in time (markets close
  at night), so the formula is applied per *cell* (partition key x time bucket of
  ``CELL_WINDOWS`` windows, K = 1, the rates counted in that cell) and summed.
- ``pass_probability`` ``P_j``: the product of the pass probabilities of the node's
  conjuncts (formula (6)/(8)), independent conjuncts assumed; the final node includes
  the conjuncts checked on the complete match.
- ``cost_per_input`` ``C_j``: ``sum_i c_i * prod_{k<i} p_k + P_j * c_F`` (formulas (7),
  (9)): the conjuncts in their evaluation order, ``c_i`` in AST nodes, and ``c_F = 1`` for
  building the new partial match (the paper's F).
- ``cost``: ``Num_j * C_j`` per second, and the plan's ``total_cost`` the sum over nodes
  (formula (10)).

What the model leaves out: negations (treated as always passing), Kleene components
(treated as one event), and strategies other than skip_till_any_match (which bind fewer
events). The window without WITHIN is the stream's duration (with events) or 60 s.

The nodes are the linear NFA's; when the query runs as a tree plan (``PLAN``), ``plan_kind`` is
``tree`` and each plan's ``tree`` gives its shape, e.g. ``(a (b c))``.

Measured counts (with events): the query runs with run storage (one run per partial
match, so counts are the paper's ``Num``) and every conjunct group counted
(:class:`engine.nfa.conjunct_order.ConjunctPlanner` with ``measure_all``): per node,
``input`` = evaluations reaching the node, ``output`` = those that passed all its
conjuncts (before its negations), and per conjunct the measured pass rate.
Timestamps are int microseconds UTC; rates are events (or pairs) per second.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from engine.compiler import CompiledQuery
from engine.events import Event
from engine.matcher import Matcher
from engine.nfa.compiler import ConjunctMeta, NFAPlan
from engine.nfa.conditions import expected_cost
from engine.nfa.conjunct_order import ConjunctPlanner
from engine.nfa.tree import shape_text

DEFAULT_RATE = 1.0
"""Events per second assumed for a type without events or a given rate."""
DEFAULT_WINDOW_S = 60.0
"""Window assumed without WITHIN and without events (seconds)."""
BUILD_COST = 1.0
"""``c_F``: cost of building one partial match, in the unit of one AST-node evaluation."""
CELL_WINDOWS = 1
"""Time bucket of the per-cell model, in windows."""
ENTRY_GROUPS = ("entry_local", "entry_edge", "entry_general")
TAKE_GROUPS = ("take_local", "take_edge", "take_general")


@dataclass(frozen=True, slots=True)
class StreamProfile:
    """Rates of a stream.

    Attributes
    ----------
    rates : dict[str, float]
        Events per second per event type.
    keys : int
        Partition keys (>= 1).
    duration_s : float | None
        Time the stream spans (None when rates were given, not measured).
    source : str
        ``events``, ``rates`` or ``default``.
    cells : list of (counts per type, span in seconds, keys)
        The model's cells: with events one per (key, time bucket) with keys = 1; else one cell of
        one second over ``keys`` keys.
    """

    rates: dict[str, float]
    keys: int
    duration_s: float | None
    source: str
    cells: list[tuple[dict[str, float], float, int]]


def profile_events(query: CompiledQuery, events: list[Event]) -> StreamProfile:
    """Rates and partition keys of ``events`` for the types ``query`` reads, over the event time they span
    (``max ts - min ts``; 1 s when all events share one timestamp), and the per-cell counts."""
    counts: dict[str, int] = {}
    keys = set()
    lo = hi = None
    for e in events:
        if e.type not in query.types:
            continue
        counts[e.type] = counts.get(e.type, 0) + 1
        keys.add(query.key_of(e))
        lo = e.ts if lo is None or e.ts < lo else lo
        hi = e.ts if hi is None or e.ts > hi else hi
    duration = (hi - lo) / 1e6 if lo is not None and hi is not None and hi > lo else 1.0
    rates = {t: counts.get(t, 0) / duration for t in sorted(query.types)}
    bucket_us = query.window_us * CELL_WINDOWS if query.window_us is not None else None
    if bucket_us is None or bucket_us >= duration * 1e6:
        bucket_us = None
    cell_counts: dict[tuple[Any, int], dict[str, float]] = {}
    for e in events:
        if e.type not in query.types:
            continue
        cell = (query.key_of(e), 0 if bucket_us is None else e.ts // bucket_us)
        c = cell_counts.setdefault(cell, {})
        c[e.type] = c.get(e.type, 0) + 1
    span = duration if bucket_us is None else bucket_us / 1e6
    cells = [(c, span, 1) for c in cell_counts.values()]
    return StreamProfile(rates, max(len(keys), 1), duration, "events", cells)


def explain(
    query: CompiledQuery,
    *,
    events: Iterable[Event] | None = None,
    rates: Mapping[str, float] | None = None,
    keys: int = 1,
) -> dict[str, Any]:
    """EXPLAIN ``query``: plans, nodes with conjuncts in evaluation order, estimates and measured counts.

    Parameters
    ----------
    query : CompiledQuery
        Compiled with the estimates to use (``compile_query(..., estimates=...)``).
    events : iterable of Event, optional
        A sample stream: gives the rates and keys, and the measured counts (the query is run over it,
        sorted by (ts, id), with run storage).
    rates : mapping, optional
        Events per second per type when no events are given (e.g. archive counts over a range;
        missing types: :data:`DEFAULT_RATE`).
    keys : int
        Partition keys when no events are given.

    Returns
    -------
    dict
        JSON-ready: ``name``, ``strategy``, ``window_us``, ``stream`` (rates, keys, duration_s,
        source) and ``plans`` (see the module docstring for each node's fields).

    Raises
    ------
    ValueError
        For ``keys < 1`` or a negative rate.
    """
    if keys < 1:
        raise ValueError("keys must be >= 1")
    if rates is not None and any(r < 0 for r in rates.values()):
        raise ValueError("rates must be >= 0 events per second")
    sample = sorted(events, key=lambda e: (e.ts, e.id)) if events is not None else None
    if sample is not None:
        prof = profile_events(query, sample)
    elif rates is not None:
        given = {t: float(rates.get(t, DEFAULT_RATE)) for t in sorted(query.types)}
        prof = StreamProfile(given, keys, None, "rates", [(given, 1.0, keys)])
    else:
        default = {t: DEFAULT_RATE for t in sorted(query.types)}
        prof = StreamProfile(default, keys, None, "default", [(default, 1.0, keys)])
    planner = None
    matches = None
    if sample is not None:
        # measured on the NFA with one run per partial match (a tree plan finds the same matches)
        m = Matcher(replace(query, plan_kind="nfa"), storage="runs", adaptive=False, measure=True)
        n = 0
        for e in sample:
            n += len(m.push(e))
        n += len(m.flush())
        planner = m.planner
        matches = n
    if query.window_us is not None:
        window_s = query.window_us / 1e6
    elif prof.duration_s is not None:
        window_s = prof.duration_s
    else:
        window_s = DEFAULT_WINDOW_S
    plans = [_plan(p, prof, window_s, planner) for p in query.plans]
    if query.plan_kind == "tree":
        for row, p, (shape, _) in zip(plans, query.plans, query.trees):
            row["tree"] = shape_text(shape, [s.var for s in p.slots])
    return {
        "name": query.name,
        "plan_kind": query.plan_kind,
        "strategy": query.strategy,
        "window_us": query.window_us,
        "stream": {
            "rates": prof.rates,
            "keys": prof.keys,
            "duration_s": prof.duration_s,
            "source": prof.source,
        },
        "plans": plans,
        "measured_matches": matches,
    }


def _node_conjuncts(plan: NFAPlan, j: int, groups: tuple[str, ...]) -> list[tuple[str, ConjunctMeta]]:
    slot = plan.slots[j]
    out = [(g, m) for g in groups for m in slot.meta.get(g, [])]
    if groups is ENTRY_GROUPS and j == plan.final:
        out += [("emit_general", m) for m in plan.emit_meta]
    return out


def _plan(plan: NFAPlan, prof: StreamProfile, window_s: float, planner: ConjunctPlanner | None) -> dict[str, Any]:
    nodes = []
    total = 0.0
    # per cell: partial matches leaving the previous node (a count over the cell's span)
    out_prev = [0.0] * len(prof.cells)
    # counts are over the whole stream (events) or over one second (rates): rate = count / per
    per = prof.duration_s if prof.duration_s is not None else 1.0
    for j, slot in enumerate(plan.slots):
        entry = _node_conjuncts(plan, j, ENTRY_GROUPS)
        take = _node_conjuncts(plan, j, TAKE_GROUPS) if slot.kleene else []
        ps = [m.estimate for _, m in entry]
        p_node = 1.0
        for p in ps:
            p_node *= p
        n_in = 0.0
        for k, (counts, span, n_keys) in enumerate(prof.cells):
            events_j = sum(counts.get(t, 0.0) for t in slot.types)
            if j == 0:
                n_cell = events_j
            else:
                # with events, a window longer than the stream sees only the stream
                w = min(window_s, span) if prof.source == "events" else window_s
                n_cell = out_prev[k] * events_j / (span * n_keys) * w / j
            out_prev[k] = n_cell * p_node
            n_in += n_cell
        num = n_in / per
        c_node = expected_cost([float(m.cost) for _, m in entry], ps) + p_node * BUILD_COST
        cost = num * c_node
        total += cost
        duration = prof.duration_s
        node: dict[str, Any] = {
            "slot": j,
            "var": slot.var,
            "types": sorted(slot.types),
            "kleene": slot.kleene,
            "conjuncts": [_conjunct(g, m, plan.index, j, planner) for g, m in entry + take],
            "negations": [n.var for n in slot.negations]
            + ([n.var for n in plan.trailing] if j == plan.final else []),
            "estimate": {
                "input_rate": num,
                "pass_probability": p_node,
                "cost_per_input": c_node,
                "cost": cost,
                "input": num * duration if duration is not None else None,
                "output": num * p_node * duration if duration is not None else None,
            },
            "measured": _measured(plan, j, planner) if planner is not None else None,
        }
        nodes.append(node)
    return {
        "index": plan.index,
        "components": [s.var for s in plan.slots],
        "nodes": nodes,
        "total_cost": total,
        "tree": None,
    }


def _conjunct(
    group: str, meta: ConjunctMeta, plan: int, slot: int, planner: ConjunctPlanner | None
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "group": group,
        "text": meta.text,
        "cost": meta.cost,
        "pass_estimate": meta.estimate,
        "evaluations": None,
        "measured_pass": None,
    }
    if planner is not None:
        g = planner.group(plan, -1 if group == "emit_general" else slot, group)
        if g is not None:
            i = g.metas.index(meta)
            row["evaluations"] = round(g.stats.calls)
            row["measured_pass"] = g.stats.passes[i] / g.stats.calls if g.stats.calls else None
    return row


def _measured(plan: NFAPlan, j: int, planner: ConjunctPlanner) -> dict[str, Any]:
    first = planner.group(plan.index, j, "entry_local")
    last = planner.group(plan.index, -1, "emit_general") if j == plan.final else None
    general = planner.group(plan.index, j, "entry_general")
    n_in = round(first.stats.calls) if first is not None else 0
    if last is not None:
        n_out = round(last.stats.all_passed)
    elif general is not None:
        n_out = round(general.stats.all_passed)
    else:
        n_out = 0
    return {"input": n_in, "output": n_out, "pass_probability": n_out / n_in if n_in else None}


def measured_estimates(result: dict[str, Any]) -> dict[str, float]:
    """Pass probabilities measured by an :func:`explain` run with events, keyed by conjunct text: the
    ``estimates`` for compiling the same query for a live stream (e.g. EXPLAIN over an archive slice).

    A conjunct's rate is measured on the inputs that reached its edge group (within a group every
    conjunct is counted), which is what the node's pass probability needs. Conjuncts never evaluated
    are left out (their defaults stay).
    """
    out: dict[str, float] = {}
    for plan in result["plans"]:
        for node in plan["nodes"]:
            for c in node["conjuncts"]:
                if c["measured_pass"] is not None and c["text"] not in out:
                    out[c["text"]] = c["measured_pass"]
    return out
