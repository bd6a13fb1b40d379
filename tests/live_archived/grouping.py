"""The grouped RETURN form built by hand from the pairwise form (the reference of the grouped tests).

Independent of :meth:`engine.live_archived.plan.LiveArchivedPlan.group`: the pairwise results are
grouped by live instance (its variables' event ids), each archived variable's events are the union
over the group, once per id, in (ts, id) order, ``start``/``end`` the extremes of the group, and the
aggregates of :data:`AGGREGATES` are computed here in plain Python.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from engine.events import Event
from engine.match import Match


def _values(evs: Sequence[Event], attr: str) -> list[Any]:
    return [e.ts if attr == "ts" else e.attrs.get(attr) for e in evs]


def _present(evs: Sequence[Event], attr: str) -> list[Any]:
    return [v for v in _values(evs, attr) if v is not None]


AGGREGATES: dict[str, Callable[[Sequence[Event], str], Any]] = {
    "count": lambda evs, attr: len(evs),
    "min": lambda evs, attr: min(_present(evs, attr), default=None),
    "max": lambda evs, attr: max(_present(evs, attr), default=None),
    "sum": lambda evs, attr: sum(_present(evs, attr)) if _present(evs, attr) else None,
    "avg": lambda evs, attr: sum(_present(evs, attr)) / len(_present(evs, attr)) if _present(evs, attr) else None,
    "first": lambda evs, attr: _values(evs, attr)[0] if evs else None,
    "last": lambda evs, attr: _values(evs, attr)[-1] if evs else None,
}


def return_clause(items: Sequence[tuple[str, str, str | None, str]]) -> str:
    """``RETURN func(var.attr) AS alias, ...`` from ``(func, var, attr, alias)``; attr None: ``count(var)``."""
    parts = [f"{f}({v})" if a is None else f"{f}({v}.{a})" for f, v, a, _ in items]
    return "RETURN " + ", ".join(f"{p} AS {alias}" for p, (_, _, _, alias) in zip(parts, items))


def group_pairs(
    pairs: Iterable[Match],
    live_vars: Iterable[str],
    aggregates: Sequence[tuple[str, str, str | None, str]] = (),
    live_fields: Sequence[str] = (),
) -> dict[frozenset, tuple[dict[str, list[int]], int, int, dict[str, Any]]]:
    """Pairwise results grouped by live instance: identity -> (event ids by variable, start, end, fields).

    ``aggregates``: ``(func, archived var, attr, alias)`` computed over the group's archived events;
    ``live_fields``: aliases of pairwise fields that only read live variables (copied).
    """
    live = set(live_vars)
    groups: dict[frozenset, list[Match]] = {}
    for m in pairs:
        ident = frozenset((v, tuple(e.id for e in evs)) for v, evs in m.events.items() if v in live and evs)
        groups.setdefault(ident, []).append(m)
    out = {}
    for ident, ms in groups.items():
        merged: dict[str, dict[int, Event]] = {}
        for m in ms:
            for var, evs in m.events.items():
                if var not in live:
                    bucket = merged.setdefault(var, {})
                    for e in evs:
                        bucket[e.id] = e
        events = {var: sorted(b.values(), key=lambda e: (e.ts, e.id)) for var, b in merged.items()}
        ids = {var: [e.id for e in evs] for var, evs in ms[0].events.items() if var in live}
        ids.update({var: [e.id for e in evs] for var, evs in events.items()})
        fields = {alias: ms[0].fields[alias] for alias in live_fields}
        for func, var, attr, alias in aggregates:
            fields[alias] = AGGREGATES[func](events.get(var, []), attr or "")
        out[ident] = (ids, min(m.start for m in ms), max(m.end for m in ms), fields)
    return out


def as_groups(results: Iterable[Match], live_vars: Iterable[str]) -> dict[frozenset, tuple]:
    """Grouped results in the shape of :func:`group_pairs` (each live instance must appear once)."""
    live = set(live_vars)
    out: dict[frozenset, tuple] = {}
    for m in results:
        ident = frozenset((v, tuple(e.id for e in evs)) for v, evs in m.events.items() if v in live and evs)
        assert ident not in out, f"two grouped results for live instance {sorted(ident)}"
        out[ident] = (m.ids(), m.start, m.end, dict(m.fields))
    return out
