"""Allen's interval relations with Esper-style tolerances, as ordinary LQL comparisons (issue 15).

A relation ``a REL(args) b`` between two events is rewritten into a conjunction of comparisons of
``ts`` (start) and ``ts_end`` (end) so that the NFA compiler pushes each part down to the edge where
both events are bound, like any other WHERE conjunct (partitioning and selectivity ordering keep
working). ``SEQ(...) BY rel`` becomes, per linear plan, one such conjunction for every two
consecutive bound events (:func:`by_conjuncts`).

Sources: J. F. Allen, "Maintaining knowledge about temporal intervals", CACM 26(11), 1983 (the 13
relations); the threshold forms are those of Esper's interval algebra reference (EsperTech, "Interval
Algebra Reference": before/after, coincides, during/includes, finishes/finished by, meets/met by,
overlaps/overlapped by, starts/started by); 002 (Zhang et al.) section "Multi-source Events of the
Regular Expression" for ``by <relation>``.

Interval ``a = [a.s, a.e)`` with ``a.s = a.ts`` and ``a.e = a.ts_end``; a point event is
``[ts, ts]``. Durations are int microseconds. Exact formulas (``d`` = a tolerance):

=============== ======================================= ==========================================
relation        no argument                             arguments
=============== ======================================= ==========================================
BEFORE          a.e < b.s                               (min): min <= b.s - a.e;
                                                        (min, max): min <= b.s - a.e <= max
AFTER           b.e < a.s                               same on a.s - b.e
MEETS           a.e = b.s                               (d): |b.s - a.e| <= d
MET_BY          b.e = a.s                               (d): |a.s - b.e| <= d
OVERLAPS        a.s < b.s < a.e < b.e                   (max): and a.e - b.s <= max;
                                                        (min, max): and min <= a.e - b.s <= max
OVERLAPPED_BY   b.s < a.s < b.e < a.e                   same on b.e - a.s
STARTS          a.s = b.s and a.e < b.e                 (d): |a.s - b.s| <= d and a.e < b.e
STARTED_BY      a.s = b.s and b.e < a.e                 (d): |a.s - b.s| <= d and b.e < a.e
DURING          b.s < a.s and a.e < b.e                 (max): 0 < a.s - b.s <= max and 0 < b.e - a.e <= max;
                                                        (min, max): min <= both <= max;
                                                        (min_s, max_s, min_e, max_e): each its own
CONTAINS        a.s < b.s and b.e < a.e                 as DURING with a and b swapped
FINISHES        b.s < a.s and a.e = b.e                 (d): b.s < a.s and |a.e - b.e| <= d
FINISHED_BY     a.s < b.s and a.e = b.e                 (d): a.s < b.s and |a.e - b.e| <= d
EQUALS          a.s = b.s and a.e = b.e                 (d): |a.s - b.s| <= d and |a.e - b.e| <= d;
                                                        (d_s, d_e): one tolerance per endpoint
INTERSECTS      (a.s < b.e and b.s < a.e) or a.s = b.s  (none)
=============== ======================================= ==========================================

INCLUDES is CONTAINS and COINCIDES is EQUALS. A negative tolerance, a wrong number of arguments or
``min > max`` is a :class:`QueryError` at the argument.
"""
from __future__ import annotations

from collections.abc import Sequence

from engine.lql import ast
from engine.lql.ast import Relation
from engine.lql.errors import QueryError

__all__ = ["ALIASES", "ARITY", "RELATIONS", "Relation", "by_conjuncts", "relation_expr", "relation_holds"]

RELATIONS: tuple[str, ...] = (
    "before", "after", "meets", "met_by", "overlaps", "overlapped_by", "starts", "started_by",
    "during", "contains", "finishes", "finished_by", "equals", "intersects",
)
"""The 13 relations of Allen plus INTERSECTS (canonical names, lower case)."""

ALIASES = {"includes": "contains", "coincides": "equals"}

ARITY: dict[str, tuple[int, ...]] = {
    "before": (0, 1, 2), "after": (0, 1, 2),
    "meets": (0, 1), "met_by": (0, 1),
    "overlaps": (0, 1, 2), "overlapped_by": (0, 1, 2),
    "starts": (0, 1), "started_by": (0, 1),
    "during": (0, 1, 2, 4), "contains": (0, 1, 2, 4),
    "finishes": (0, 1), "finished_by": (0, 1),
    "equals": (0, 1, 2),
    "intersects": (0,),
}
"""Relation -> the numbers of tolerance arguments it takes (Esper's forms)."""

CONVERSE = {
    "before": "after", "after": "before", "meets": "met_by", "met_by": "meets",
    "overlaps": "overlapped_by", "overlapped_by": "overlaps", "starts": "started_by", "started_by": "starts",
    "during": "contains", "contains": "during", "finishes": "finished_by", "finished_by": "finishes",
    "equals": "equals", "intersects": "intersects",
}


def make_relation(word: str, args: Sequence[int], pos: ast.Pos, arg_pos: Sequence[ast.Pos] = ()) -> Relation:
    """Validate a relation as written (name, tolerance count and signs, min <= max).

    Raises
    ------
    QueryError
        At the relation (wrong count) or at the offending argument (negative, min > max).
    """
    name = ALIASES.get(word.lower(), word.lower())
    if name not in ARITY:
        raise QueryError.at(pos, f"unknown relation '{word}'")
    if len(args) not in ARITY[name]:
        counts = " or ".join(str(n) for n in ARITY[name])
        raise QueryError.at(pos, f"{word.upper()} takes {counts} tolerance arguments, not {len(args)}")
    where = list(arg_pos) + [pos] * (len(args) - len(arg_pos))
    for value, at in zip(args, where, strict=True):
        if value < 0:
            raise QueryError.at(at, f"a tolerance of {word.upper()} must not be negative")
    pairs = ((0, 1),) if len(args) == 2 and name not in ("equals",) else ((0, 1), (2, 3)) if len(args) == 4 else ()
    for lo, hi in pairs:
        if args[lo] > args[hi]:
            top = ast.duration_text(args[hi]) if args[hi] else "0 s"
            raise QueryError.at(where[hi], f"{word.upper()}: the maximum ({top}) is less than the minimum")
    return Relation(name, tuple(args), pos)


# --------------------------------------------------------------------------- evaluation (for tests and tools)


def relation_holds(rel: Relation, a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether ``a REL b`` holds for intervals ``a = (start, end)`` and ``b`` (the formulas above, directly)."""
    (as_, ae), (bs, be) = a, b
    t = rel.args
    n = len(t)
    name = rel.name
    if name == "before":
        d = bs - ae
        return d > 0 if n == 0 else (t[0] <= d if n == 1 else t[0] <= d <= t[1])
    if name == "after":
        return relation_holds(Relation("before", t), b, a)
    if name == "meets":
        return ae == bs if n == 0 else abs(bs - ae) <= t[0]
    if name == "met_by":
        return relation_holds(Relation("meets", t), b, a)
    if name == "overlaps":
        if not (as_ < bs < ae < be):
            return False
        d = ae - bs
        return True if n == 0 else (d <= t[0] if n == 1 else t[0] <= d <= t[1])
    if name == "overlapped_by":
        return relation_holds(Relation("overlaps", t), b, a)
    if name == "starts":
        return (as_ == bs if n == 0 else abs(as_ - bs) <= t[0]) and ae < be
    if name == "started_by":
        return (as_ == bs if n == 0 else abs(as_ - bs) <= t[0]) and be < ae
    if name == "during":
        ds, de = as_ - bs, be - ae
        if n == 0:
            return ds > 0 and de > 0
        if n == 1:
            return 0 < ds <= t[0] and 0 < de <= t[0]
        if n == 2:
            return t[0] <= ds <= t[1] and t[0] <= de <= t[1]
        return t[0] <= ds <= t[1] and t[2] <= de <= t[3]
    if name == "contains":
        return relation_holds(Relation("during", t), b, a)
    if name == "finishes":
        return bs < as_ and (ae == be if n == 0 else abs(ae - be) <= t[0])
    if name == "finished_by":
        return as_ < bs and (ae == be if n == 0 else abs(ae - be) <= t[0])
    if name == "equals":
        if n == 0:
            return as_ == bs and ae == be
        ts, te = (t[0], t[0]) if n == 1 else t
        return abs(as_ - bs) <= ts and abs(ae - be) <= te
    if name == "intersects":
        return (as_ < be and bs < ae) or as_ == bs
    raise ValueError(f"unknown relation {name!r}")


# --------------------------------------------------------------------------- rewriting into comparisons


def _ref(var: str, index: ast.Index | None, attr: str, pos: ast.Pos) -> ast.AttrRef:
    return ast.AttrRef(var, attr, index, pos)


def relation_expr(
    rel: Relation, left: tuple[str, ast.Index | None], right: tuple[str, ast.Index | None], pos: ast.Pos
) -> ast.Expr:
    """``left REL right`` as an AND of comparisons of ``ts`` / ``ts_end`` (or an OR for INTERSECTS).

    ``left`` and ``right`` are ``(variable, index or None)``: ``a`` or ``b[i]``, ``b[i-1]``, ``b[1]``...
    """
    a_s, a_e = _ref(left[0], left[1], "ts", pos), _ref(left[0], left[1], "ts_end", pos)
    b_s, b_e = _ref(right[0], right[1], "ts", pos), _ref(right[0], right[1], "ts_end", pos)

    def lit(us: int) -> ast.Literal:
        return ast.Literal(us, pos, is_duration=True)

    def cmp(op: str, x: ast.Expr, y: ast.Expr) -> ast.Compare:
        return ast.Compare(op, x, y, pos)  # type: ignore[arg-type]

    def diff(x: ast.Expr, y: ast.Expr) -> ast.BinOp:
        return ast.BinOp("-", x, y, pos)

    def within(x: ast.Expr, y: ast.Expr, d: int) -> list[ast.Expr]:
        """|x - y| <= d as two comparisons (no abs() in LQL)."""
        return [cmp("<=", diff(x, y), lit(d)), cmp("<=", diff(y, x), lit(d))]

    def ranged(d: ast.Expr, lo: int | None, hi: int | None, strict_lo: bool = False) -> list[ast.Expr]:
        out: list[ast.Expr] = []
        if lo is not None:
            out.append(cmp("<" if strict_lo else "<=", lit(lo), d))
        if hi is not None:
            out.append(cmp("<=", d, lit(hi)))
        return out

    t = rel.args
    n = len(t)
    name = rel.name
    if name in ("after", "met_by", "overlapped_by", "contains"):
        # the converse with the operands swapped (finished_by / started_by are not symmetric forms)
        return relation_expr(Relation(CONVERSE[name], t, rel.pos), right, left, pos)
    parts: list[ast.Expr]
    if name == "before":
        d = diff(b_s, a_e)
        parts = [cmp("<", a_e, b_s)] if n == 0 else ranged(d, t[0], t[1] if n == 2 else None)
    elif name == "meets":
        parts = [cmp("=", a_e, b_s)] if n == 0 else within(b_s, a_e, t[0])
    elif name == "overlaps":
        parts = [cmp("<", a_s, b_s), cmp("<", b_s, a_e), cmp("<", a_e, b_e)]
        if n:
            parts += ranged(diff(a_e, b_s), t[0] if n == 2 else None, t[-1])
    elif name in ("starts", "started_by"):
        parts = [cmp("=", a_s, b_s)] if n == 0 else within(a_s, b_s, t[0])
        parts.append(cmp("<", a_e, b_e) if name == "starts" else cmp("<", b_e, a_e))
    elif name == "during":
        ds, de = diff(a_s, b_s), diff(b_e, a_e)
        if n == 0:
            parts = [cmp("<", b_s, a_s), cmp("<", a_e, b_e)]
        elif n == 1:
            parts = ranged(ds, 0, t[0], strict_lo=True) + ranged(de, 0, t[0], strict_lo=True)
        elif n == 2:
            parts = ranged(ds, t[0], t[1]) + ranged(de, t[0], t[1])
        else:
            parts = ranged(ds, t[0], t[1]) + ranged(de, t[2], t[3])
    elif name in ("finishes", "finished_by"):
        parts = [cmp("<", b_s, a_s) if name == "finishes" else cmp("<", a_s, b_s)]
        parts += [cmp("=", a_e, b_e)] if n == 0 else within(a_e, b_e, t[0])
    elif name == "equals":
        if n == 0:
            parts = [cmp("=", a_s, b_s), cmp("=", a_e, b_e)]
        else:
            ts, te = (t[0], t[0]) if n == 1 else t
            parts = within(a_s, b_s, ts) + within(a_e, b_e, te)
    elif name == "intersects":
        overlap = ast.BoolOp("and", (cmp("<", a_s, b_e), cmp("<", b_s, a_e)), pos)
        return ast.BoolOp("or", (overlap, cmp("=", a_s, b_s)), pos)
    else:  # pragma: no cover - make_relation rejects the rest
        raise ValueError(f"unknown relation {name!r}")
    return parts[0] if len(parts) == 1 else ast.BoolOp("and", tuple(parts), pos)


# --------------------------------------------------------------------------- SEQ(...) BY rel


def _by_scopes(node: ast.PatternNode) -> list[tuple[frozenset[str], Relation]]:
    """Every ``SEQ(...) BY rel`` of a pattern tree: (its variables, the relation)."""
    if isinstance(node, ast.Component):
        return []
    out = []
    by = getattr(node, "by", None)
    if by is not None:
        out.append((frozenset(c.var for c in ast.components(node) if c.kind != "neg"), by))
    for item in node.items:
        out.extend(_by_scopes(item))
    return out


def by_conjuncts(pattern: ast.PatternNode, plan: Sequence[ast.Component]) -> list[ast.Expr]:
    """The conjuncts that ``SEQ(...) BY rel`` adds to one linear plan of ``pattern``.

    In the plan's order (the matcher's order of the bound events), for each BY scope: ``rel`` between
    every two consecutive positive components of the scope (``x`` or ``b[last]`` on the left, ``y`` or
    ``c[1]`` on the right) and inside each Kleene component (``b[i-1] rel b[i]``). A Kleene star that
    matched nothing is not in the plan, so its neighbours become consecutive (002: "every two
    consecutive bound events").
    """
    out: list[ast.Expr] = []
    for scope, rel in _by_scopes(pattern):
        comps = [c for c in plan if c.kind != "neg" and c.var in scope]
        for prev, cur in zip(comps, comps[1:]):
            left = (prev.var, ast.Index("last") if prev.is_kleene else None)
            right = (cur.var, ast.Index("first") if cur.is_kleene else None)
            out.append(relation_expr(rel, left, right, rel.pos))
        for c in comps:
            if c.is_kleene:
                out.append(relation_expr(rel, (c.var, ast.Index("prev")), (c.var, ast.Index("i")), rel.pos))
    return out
