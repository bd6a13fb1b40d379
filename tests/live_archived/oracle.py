"""Brute-force reference of live-and-archived results, independent of engine.live_archived.

Straight from docs/semantics.md section 6: every live instance (a match of P_L over the whole
stream) times every archived instance (a match of P_A over the whole stream) that lies in its
access range ``[I.start - lookback, I.start)``: every event starts at or after ``I.start - lookback``
and ends (``ts_end``; ``ts`` of a point event) before ``I.start`` (with the whole negation window when P_A has a
trailing negation), filtered by JOIN read like WHERE. Pattern matches come from the engine's own
brute-force oracle (tests/engine/oracle.py), which reads only the syntax tree.
"""
from __future__ import annotations

from engine.events import Event
from engine.lql import ast as A
from tests.engine.oracle import analyse, enumerate_matches, expand, holds, split_and, walk


def _kinds(query: A.PatternQuery) -> dict[str, str]:
    return {c.var: c.kind for c in A.components(query.pattern)}


def _instances(query: A.PatternQuery, events: list[Event]) -> list[tuple[frozenset, dict, int, int]]:
    by_id = {e.id: e for e in events}
    kinds = _kinds(query)
    out = []
    for key in enumerate_matches(query, events):
        binding: dict = {}
        starts, ends = [], []
        for var, ids in key:
            evs = tuple(by_id[i] for i in ids)
            starts += [e.ts for e in evs]
            ends += [e.ts_end for e in evs]  # = ts for a point event
            binding[var] = evs[0] if kinds[var] == "single" else evs
        out.append((key, binding, min(starts), max(ends)))
    return out


def has_trailing_negation(query: A.PatternQuery) -> bool:
    """Some linear plan (section 2; plans starting with a negation dropped) ends with a negation."""
    for plan in expand(query.pattern):
        if plan and plan[0].kind != "neg" and plan[-1].kind == "neg":
            return True
    return False


def join_holds(join: A.Expr | None, binding: dict) -> bool:
    for expr in split_and(join):
        mentioned = {x.var for x in walk(expr) if isinstance(x, A.AttrRef)}
        if not mentioned <= binding.keys():
            continue  # a variable the pair does not bind: ignored, as in WHERE
        if not holds(analyse(expr), binding):
            return False
    return True


def expected_results(query: A.LiveArchivedQuery, events: list[Event]) -> set[frozenset]:
    """Identities (as ``Match.key()``) of every result of ``query`` over the finite stream ``events``."""
    lives = _instances(query.live, events)
    archived = _instances(query.archived, events)
    deadline = query.archived.within_us if has_trailing_negation(query.archived) else None
    out: set[frozenset] = set()
    for ikey, ibind, istart, _ in lives:
        lo = istart - query.lookback_us
        for jkey, jbind, jstart, jend in archived:
            if jstart < lo or jend >= istart:
                continue
            if deadline is not None and jstart + deadline >= istart:
                continue
            if join_holds(query.join, {**ibind, **jbind}):
                out.add(ikey | jkey)
    return out
