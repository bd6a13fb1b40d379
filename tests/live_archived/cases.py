"""Random live-and-archived cases for the property tests (hypothesis).

Each side is a random pattern query of tests/engine/patterns.py (every operator, Kleene, negation,
windows, partitions, strategies); the archived side's variables are renamed (``a`` -> ``a2``). The
JOIN relates random positive variables of both sides (key equalities, comparisons, time
differences) or is absent; the stream covers both sides' types.
"""
from __future__ import annotations

from dataclasses import fields, is_dataclass, replace

from hypothesis import strategies as st

from engine.lql import ast as A
from tests.engine.patterns import (
    arith,
    cmp,
    events_for,
    expr_text,
    neg,
    plus,
    queries,
    query,
    ref,
    secs,
    seq,
    single,
    to_lql,
)


def rename(node, suffix: str = "2"):
    """A copy of a syntax tree with every variable ``v`` renamed ``v + suffix``."""
    if isinstance(node, tuple):
        return tuple(rename(x, suffix) for x in node)
    if not is_dataclass(node) or isinstance(node, type):
        return node
    changes = {}
    for f in fields(node):
        value = getattr(node, f.name)
        if f.name == "var" and isinstance(value, str):
            changes[f.name] = value + suffix
        elif is_dataclass(value) or isinstance(value, tuple):
            changes[f.name] = rename(value, suffix)
    return replace(node, **changes)


def _positive_refs(query: A.PatternQuery, attr: str) -> list[A.AttrRef]:
    out = []
    for c in A.components(query.pattern):
        if c.kind == "single":
            out.append(ref(c.var, attr))
        elif c.kind in ("plus", "star"):
            out.append(ref(c.var, attr, "1"))
            out.append(ref(c.var, attr, "last"))
    return out


@st.composite
def small_queries(draw, partitioned: bool | None = None) -> A.PatternQuery:
    """A one- or two-component pattern (dense matches), often partitioned by k (always with ``partitioned``)."""
    t1, t2 = draw(st.sampled_from("ABC")), draw(st.sampled_from("ABC"))
    shape = draw(st.sampled_from(["one", "one", "two", "plus", "neg"]))
    if shape == "one":
        node = seq(single(t1, "a"))
    elif shape == "two":
        node = seq(single(t1, "a"), single(t2, "b"))
    elif shape == "plus":
        node = seq(single(t1, "a"), plus(t2, "b"))
    else:
        node = seq(single(t1, "a"), neg(t2, "n"))
    where = cmp(draw(st.sampled_from(["<", ">="])), ref("a"), draw(st.integers(0, 5))) if draw(st.booleans()) else None
    within = draw(st.integers(1, 4)) if shape == "neg" or draw(st.booleans()) else None
    strategy = draw(st.sampled_from(A.STRATEGIES))
    if partitioned is None:
        partitioned = draw(st.sampled_from([True, True, False]))
    partition = ("k",) if partitioned else ()
    return query(node, where, partition_by=partition, strategy=strategy, within_s=within)


@st.composite
def join_exprs(draw, live: A.PatternQuery, archived: A.PatternQuery) -> A.Expr | None:
    parts = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["key", "key", "key", "x", "ts"]))
        attr = {"key": "k", "x": "x", "ts": "ts"}[kind]
        left = draw(st.sampled_from(_positive_refs(live, attr)))
        right = draw(st.sampled_from(_positive_refs(archived, attr)))
        if kind == "key":
            parts.append(cmp("=", left, right))
        elif kind == "x":
            parts.append(cmp(draw(st.sampled_from(["=", "<", ">=", "!="])), left, right))
        else:
            parts.append(cmp("<", arith("-", left, right), secs(draw(st.integers(1, 6)))))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else A.BoolOp("and", tuple(parts))


class LACase:
    def __init__(self, text: str, events: list) -> None:
        self.text = text
        self.events = events

    def __repr__(self) -> str:
        evs = "\n".join(f"  {e.id:>2} {e.type} ts={e.ts / 1e6:g}s {e.attrs}" for e in self.events)
        return f"LACase(\n{self.text}\nstream ({len(self.events)} events):\n{evs}\n)"


@st.composite
def la_cases(draw, keyed: bool = False) -> LACase:
    """A random case; ``keyed``: both sides partitioned by k and the JOIN equates their k (OLLAA may filter)."""
    if keyed:
        live = draw(small_queries(partitioned=True))
        archived = rename(draw(small_queries(partitioned=True)))
        key = cmp("=", ref("a", "k"), ref("a2", "k"))
        more = draw(join_exprs(live, archived))
        extra = () if more is None else more.operands if isinstance(more, A.BoolOp) else (more,)
        join = A.BoolOp("and", (key, *extra)) if extra else key
    else:
        live = draw(st.one_of(small_queries(), queries()))
        archived = rename(draw(st.one_of(small_queries(), small_queries(), queries())))
        join = draw(join_exprs(live, archived))
    lookback = draw(st.integers(1, 12))
    text = (
        "LIVE " + to_lql(live)
        + "\nARCHIVED " + to_lql(archived)
        + f"\nLOOKBACK {lookback} seconds"
        + ("" if join is None else "\nJOIN " + expr_text(join))
    )
    both = A.PatternQuery(seq(live.pattern, archived.pattern))
    return LACase(text, draw(events_for(both, min_events=6)))
