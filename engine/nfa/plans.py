"""Expansion of a pattern tree into linear plans (docs/semantics.md section 2).

A *linear plan* is a tuple of components in match order. ``SEQ`` concatenates,
``OR`` unions, ``AND`` interleaves its parts (each part's own order kept), and a
Kleene star ``T* v[]`` becomes two alternatives: without the component and with
``T+ v[]``. Every plan then compiles to one NFA (:mod:`engine.nfa.compiler`).
"""
from __future__ import annotations

from itertools import product

from engine.lql.ast import And, Component, Or, PatternNode, Seq
from engine.lql.errors import QueryError

Plan = tuple[Component, ...]

MAX_PLANS = 256
"""Refuse patterns whose expansion exceeds this many linear plans (AND over many parts)."""


def expand(node: PatternNode) -> list[Plan]:
    """Linear plans of ``node``, duplicates removed, plans starting with a negation dropped.

    Raises
    ------
    QueryError
        When the expansion exceeds :data:`MAX_PLANS` plans.
    """
    plans = _expand(node)
    out: list[Plan] = []
    seen: set[Plan] = set()
    for plan in plans:
        if not plan or plan[0].kind == "neg" or all(c.kind == "neg" for c in plan):
            continue
        if plan not in seen:
            seen.add(plan)
            out.append(plan)
    return out


def _expand(node: PatternNode) -> list[Plan]:
    if isinstance(node, Component):
        if node.kind == "star":
            plus = Component("plus", node.types, node.var, node.pos)
            return [(), (plus,)]
        return [(node,)]
    parts = [_expand(item) for item in node.items]
    if isinstance(node, Or):
        return _limit([p for alts in parts for p in alts], node)
    if isinstance(node, Seq):
        return _limit([tuple(c for p in combo for c in p) for combo in product(*parts)], node)
    assert isinstance(node, And)
    out: list[Plan] = []
    for combo in product(*parts):
        out.extend(_interleavings(list(combo)))
        _limit(out, node)
    return out


def _interleavings(seqs: list[Plan]) -> list[Plan]:
    """Every merge of ``seqs`` that keeps each one's own order (a Kleene component moves as one block)."""
    seqs = [s for s in seqs if s]
    if not seqs:
        return [()]
    out: list[Plan] = []
    for k, s in enumerate(seqs):
        rest = seqs[:k] + [s[1:]] + seqs[k + 1 :]
        for tail in _interleavings(rest):
            out.append((s[0],) + tail)
    return out


def _limit(plans: list[Plan], node: PatternNode) -> list[Plan]:
    if len(plans) > MAX_PLANS:
        raise QueryError.at(
            node.pos, f"pattern expands into more than {MAX_PLANS} alternatives; simplify AND/OR nesting"
        )
    return plans
