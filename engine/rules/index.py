"""The rule index shared by all statements: which statements can an event affect?

003 (the CQ index: rules inserted, deleted and searched while the stream runs); issue 14 "The rule
index"; the layout is Esper's filter service (per event type, a tree of filter-parameter indexes:
equality by hash, ranges by sorted bounds, the rest in a residual list verified one by one).

**Entries.** A statement has an entry per (component variable, event type the variable reads): the
conjunction of the variable's *single-variable conjuncts* of WHERE (the top-level AND parts that
reference only that variable: ``v.attr``, or for a Kleene variable only ``v[i].attr``). Each is a
necessary condition for binding an event to the variable (docs/semantics.md sections 3 and 5: a
single-variable conjunct must hold for the event bound to ``v``, for every element of ``v[]``, and for a
negating event). An event *reaches* a statement when one of the statement's entries for the event's
type is satisfied; an event that reaches no entry of a statement could bind none of its variables, so
dropping it changes none of its matches (docs/semantics.md "Which statements an event reaches").

**Always reached** (every event of the statement's types): strict and partition contiguity (an event
of their types breaks runs), FILTER rules, statements of kinds this module does not know (e.g. interval
derivation). A live-and-archived query is indexed by its LIVE side only (its ARCHIVED side reads the
archive, not the live stream). An AGGREGATE statement is indexed by its WHERE.

**Exactness.** Every candidate an access path yields is verified with the entry's whole conjunction
compiled by :func:`engine.nfa.conditions.compile_bool` (the matcher's null rules: a missing value or
incomparable types make a comparison false). Access paths only need to return a superset of the
entries whose path conjunct holds: equality by a Python hash lookup (``1 == 1.0 == True`` share a hash,
so a value of another numeric type is still found, and verified), ranges by bisection in one sorted
list per comparable class (numbers and bools; strings), a missing value or NaN reaching no equality or
range entry (every comparison with it is false), and a value of any other type (unhashable, not
comparable) checking every entry of the index it would have used. :meth:`RuleIndex.scan` is the linear
scan the index must agree with.

**Access path per entry** (most selective first): the entry walks down one hash level per constant
equality ``v.a = c`` (attributes in name order, so entries that share attributes share levels, as in
Esper's filter-parameter tree), then it is stored in a range index under a constant range on one
attribute (two-sided ``lo <(=) v.a <(=) hi`` before one-sided), else in the node's residual list.
A two-sided numeric range is found by bisecting its lower bound within ``[x - widest range, x]``
(Esper's range index).

Timestamps (``v.ts``) are int microseconds UTC like everywhere else.
"""
from __future__ import annotations

import itertools
import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.events import Event, attr_getter
from engine.lql import ast
from engine.lql.checks import conjuncts, read_types
from engine.lql.errors import QueryError
from engine.nfa.conditions import Fn, compile_bool, compile_value

CONTIGUOUS = frozenset({"strict_contiguity", "partition_contiguity"})
"""Selection strategies under which every event of the statement's types matters (it breaks runs)."""

_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "="}
_NUM = 0
_STR = 1


def _kind(value: Any) -> int | None:
    """The comparable class of a value: numbers (bool, int, float), strings, or None (missing, NaN, other)."""
    if isinstance(value, (int, float)):
        if isinstance(value, float) and value != value:
            return None
        return _NUM
    if isinstance(value, str):
        return _STR
    return None


# --------------------------------------------------------------------------- entries of a statement


def _own(ref: ast.Expr, var: str, kleene: bool) -> bool:
    """Whether ``ref`` reads the event being bound to ``var`` (``v.attr``; ``v[i].attr`` for a Kleene ``v``)."""
    if not isinstance(ref, ast.AttrRef) or ref.var != var:
        return False
    if kleene:
        return ref.index is not None and ref.index.kind == "i"
    return ref.index is None


def single_variable_conjuncts(where: ast.Expr | None, var: str, kleene: bool = False) -> list[ast.Expr]:
    """The top-level AND parts of ``where`` that reference only the event bound to ``var``.

    For a Kleene variable only ``var[i].attr`` counts (``var[1]``, ``var[last]``, ``var[i-1]`` name
    other elements). A conjunct with no reference at all is not one (it names no variable).
    """
    if where is None:
        return []
    out = []
    for conjunct in conjuncts(where):
        refs = list(ast.references(conjunct))
        if refs and all(_own(r, var, kleene) for r in refs):
            out.append(conjunct)
    return out


@dataclass(frozen=True, slots=True)
class EntrySpec:
    """One entry of a statement before compilation: ``type`` and ``var`` it indexes, and the
    single-variable conjuncts (empty: the entry holds for every event of the type)."""

    type: str
    var: str
    kleene: bool
    conjuncts: tuple[ast.Expr, ...]


def statement_entries(query: Any) -> tuple[frozenset[str], list[EntrySpec]]:
    """``(always_types, entries)`` of a statement (module docstring).

    ``always_types``: the event types every event of which reaches the statement; ``entries``: the
    filtered entries. A pattern query under strict or partition contiguity, a FILTER rule and any
    statement kind not listed here are always reached by the types :func:`read_types` gives.
    """
    if isinstance(query, ast.LiveArchivedQuery):
        return statement_entries(query.live)
    if isinstance(query, ast.PatternQuery):
        comps = ast.components(query.pattern)
        if query.strategy in CONTIGUOUS:
            return frozenset(t for c in comps for t in c.types), []
        specs: list[EntrySpec] = []
        for c in comps:
            own = tuple(single_variable_conjuncts(query.where, c.var, c.is_kleene))
            specs.extend(EntrySpec(t, c.var, c.is_kleene, own) for t in c.types)
        return frozenset(), specs
    if isinstance(query, ast.AggregateQuery):
        own = tuple(single_variable_conjuncts(query.where, query.var, False))
        return frozenset(), [EntrySpec(query.type, query.var, False, own)]
    return read_types(query), []  # FILTER rules, and kinds this index does not know


def entry_resolver(var: str, kleene: bool) -> Any:
    """A resolver for :func:`compile_bool` reading the one event ``f(event, None, None)`` bound to ``var``.

    Raises
    ------
    QueryError
        For a reference to anything but ``var`` (``var[i]`` for a Kleene variable).
    """

    def resolve(ref: ast.AttrRef | ast.Aggregate) -> Fn:
        if not _own(ref, var, kleene):
            raise QueryError.at(ref.pos, f"the rule index reads only attributes of '{var}'")
        assert isinstance(ref, ast.AttrRef)
        get = attr_getter(ref.attr)
        return lambda e, b, c: get(e)

    return resolve


def _constant(expr: ast.Expr) -> tuple[bool, Any]:
    """``(True, value)`` when ``expr`` has no reference and folds to an int, float, str or bool (not NaN)."""
    if any(True for _ in ast.references(expr)) or isinstance(expr, (ast.Compare, ast.BoolOp, ast.Not)):
        return False, None

    def no_refs(ref: Any) -> Fn:  # pragma: no cover - guarded by the _refs test above
        raise ValueError("not a constant")

    value = compile_value(expr, no_refs)(None, None, None)
    if _kind(value) is None:
        return False, None
    return True, value


def _path_conjunct(conjunct: ast.Expr, var: str, kleene: bool) -> tuple[str, str, Any] | None:
    """``(attr, op, constant)`` for ``v.attr op c`` or ``c op v.attr`` with op in ``= < <= > >=``, else None."""
    if not isinstance(conjunct, ast.Compare) or conjunct.op == "!=":
        return None
    left, right = conjunct.left, conjunct.right
    op: str = conjunct.op
    if not (isinstance(left, ast.AttrRef) and _own(left, var, kleene)):
        left, right, op = right, left, _FLIP[op]
    if not (isinstance(left, ast.AttrRef) and _own(left, var, kleene)):
        return None
    ok, value = _constant(right)
    return (left.attr, op, value) if ok else None


# --------------------------------------------------------------------------- the index structures


@dataclass(slots=True, eq=False)
class _Entry:
    sid: str
    seq: int
    uid: int
    type: str
    var: str
    check: Fn | None  # the whole conjunction over f(event, None, None); None: always true
    place: tuple[Any, ...] = ()  # where it is stored (for remove)
    path: list[tuple[_Node, str, Any]] = field(default_factory=list)  # hash levels walked down


class _Sorted:
    """Entries sorted by a bound: parallel lists ``keys`` / ``entries`` (bisect in C; inserts are rare)."""

    __slots__ = ("keys", "entries")

    def __init__(self) -> None:
        self.keys: list[Any] = []
        self.entries: list[_Entry] = []

    def add(self, key: Any, entry: _Entry) -> None:
        i = bisect_right(self.keys, key)
        self.keys.insert(i, key)
        self.entries.insert(i, entry)

    def remove(self, key: Any, entry: _Entry) -> None:
        i = bisect_left(self.keys, key)
        while self.entries[i] is not entry:
            i += 1
        del self.keys[i]
        del self.entries[i]


class _Ranges:
    """Constant ranges on one attribute: lower-only, upper-only and two-sided, per comparable class."""

    __slots__ = ("get", "lower", "upper", "both", "max_width", "size")

    def __init__(self, attr: str) -> None:
        self.get = attr_getter(attr)
        self.lower = (_Sorted(), _Sorted())  # v > lo / v >= lo, by lo; numbers, strings
        self.upper = (_Sorted(), _Sorted())  # v < hi / v <= hi, by hi
        self.both = _Sorted()  # numeric lo <(=) v <(=) hi, by lo; entries' widths in max_width
        self.max_width: Any = None
        self.size = 0

    def stab(self, value: Any, out: list[_Entry]) -> None:
        """Append every entry whose range may contain ``value`` (a superset; the caller verifies)."""
        t = type(value)
        if t is int or t is bool or (t is float and value == value):
            kind = _NUM
        elif t is str:
            kind = _STR
        elif value is None or (isinstance(value, float) and value != value):
            return  # every comparison with a missing value or NaN is false
        else:
            k = _kind(value)  # a subclass of int, float or str
            if k is None:
                self.everything(out)  # an exotic value: let the compiled conjunctions decide
                return
            kind = k
        lower = self.lower[kind]
        if lower.keys:
            out += lower.entries[: bisect_right(lower.keys, value)]
        upper = self.upper[kind]
        if upper.keys:
            out += upper.entries[bisect_left(upper.keys, value) :]
        both = self.both
        if kind == _NUM and both.keys:
            keys = both.keys
            hi = bisect_right(keys, value)
            lo = _minus(value, self.max_width)
            out += both.entries[bisect_left(keys, lo, 0, hi) if lo is not None else 0 : hi]

    def everything(self, out: list[_Entry]) -> None:
        for lists in (self.lower, self.upper):
            for sl in lists:
                out += sl.entries
        out += self.both.entries

    def add_both(self, lo: Any, width: Any, entry: _Entry) -> None:
        self.both.add(lo, entry)
        if self.max_width is None or width > self.max_width:
            self.max_width = width

    def remove_both(self, lo: Any, width: Any, entry: _Entry) -> None:
        self.both.remove(lo, entry)
        if width == self.max_width:  # recompute the widest (rare: only when the widest goes)
            widths = [e.place[4] for e in self.both.entries]
            self.max_width = max(widths) if widths else None


def _pad(x: Any) -> float:
    """An upper bound of the rounding error of one float subtraction involving ``x``."""
    return abs(float(x)) * 2.0**-40 + 1e-300


def _width(lo: Any, hi: Any) -> Any:
    """``hi - lo`` rounded up: never below the exact width (ints stay exact)."""
    w = hi - lo
    if isinstance(w, float):
        w += _pad(hi) + _pad(lo)
    return w


def _minus(x: Any, w: Any) -> Any:
    """``x - w`` rounded down (None on overflow): a lower bound of every ``lo`` with ``lo <= x <= lo + w``."""
    try:
        v = x - w
        if isinstance(v, float):
            v -= _pad(x) + _pad(w)
            if math.isinf(v) or v != v:
                return None
        return v
    except OverflowError:
        return None


class _Node:
    """One level of the filter-parameter tree: hash tables by attribute, range indexes, residual entries."""

    __slots__ = ("eq", "ranges", "residual", "size")

    def __init__(self) -> None:
        self.eq: dict[str, tuple[Callable[[Event], Any], dict[Any, _Node]]] = {}
        self.ranges: dict[str, _Ranges] = {}
        self.residual: list[_Entry] = []
        self.size = 0

    def collect(self, event: Event, out: list[_Entry]) -> None:
        """Append the candidate entries for ``event`` (a superset of the satisfied ones)."""
        for get, table in self.eq.values():
            value = get(event)
            if value is None:
                continue
            try:
                child = table.get(value)
            except TypeError:  # unhashable: every child is a candidate
                for node in table.values():
                    node.everything(out)
                continue
            if child is not None:
                child.collect(event, out)
        for rng in self.ranges.values():
            rng.stab(rng.get(event), out)
        if self.residual:
            out.extend(self.residual)

    def everything(self, out: list[_Entry]) -> None:
        for _get, table in self.eq.values():
            for node in table.values():
                node.everything(out)
        for rng in self.ranges.values():
            rng.everything(out)
        out.extend(self.residual)


@dataclass(slots=True)
class _TypeIndex:
    root: _Node = field(default_factory=_Node)
    always: dict[int, int] = field(default_factory=dict)  # statement seq -> count of always-reached reasons
    entries: int = 0


@dataclass(slots=True)
class _Statement:
    sid: str
    seq: int
    always_types: frozenset[str]
    entries: list[_Entry]


class RuleIndex:
    """Which statements an event can affect (module docstring; Esper's filter service, 003's CQ index).

    ``add(statement_id, query_ast)`` and ``remove(statement_id)`` change it at any time (cost: one walk
    down the tree per entry, O(log n) per sorted insert); ``reached(event)`` gives the statement ids,
    in insertion order, that ``event`` reaches. ``scan(event)`` is the linear scan it always equals.

    Raises
    ------
    ValueError
        From :meth:`add` for an id already indexed.
    KeyError
        From :meth:`remove` for an unknown id.
    """

    def __init__(self) -> None:
        self._types: dict[str, _TypeIndex] = {}
        self._statements: dict[str, _Statement] = {}
        self._by_seq: dict[int, str] = {}
        self._seq = itertools.count()
        self._uid = itertools.count()
        self.events = 0
        self.candidates = 0
        self.reached_total = 0

    def __len__(self) -> int:
        return len(self._statements)

    def __contains__(self, statement_id: object) -> bool:
        return statement_id in self._statements

    # ------------------------------------------------------------------ changes

    def add(self, statement_id: str, query_ast: Any) -> None:
        """Index a statement (any syntax tree of :mod:`engine.lql.ast`, or an unknown kind: always reached).

        Raises
        ------
        ValueError
            When ``statement_id`` is already indexed.
        """
        if statement_id in self._statements:
            raise ValueError(f"statement '{statement_id}' is already in the rule index")
        seq = next(self._seq)
        always, specs = statement_entries(query_ast)
        entries = [self._add_entry(statement_id, seq, spec) for spec in specs]
        for t in always:
            ti = self._types.setdefault(t, _TypeIndex())
            ti.always[seq] = ti.always.get(seq, 0) + 1
        self._statements[statement_id] = _Statement(statement_id, seq, always, entries)
        self._by_seq[seq] = statement_id

    def remove(self, statement_id: str) -> None:
        """Remove a statement and all its entries.

        Raises
        ------
        KeyError
            For an id not in the index.
        """
        st = self._statements.pop(statement_id)
        del self._by_seq[st.seq]
        for t in st.always_types:
            ti = self._types[t]
            n = ti.always.pop(st.seq) - 1
            if n:
                ti.always[st.seq] = n
            self._drop_if_empty(t)
        for entry in st.entries:
            self._remove_entry(entry)

    def _add_entry(self, sid: str, seq: int, spec: EntrySpec) -> _Entry:
        conj = spec.conjuncts
        check: Fn | None = None
        if conj:
            expr = conj[0] if len(conj) == 1 else ast.BoolOp("and", conj)
            check = compile_bool(expr, entry_resolver(spec.var, spec.kleene))
        entry = _Entry(sid, seq, next(self._uid), spec.type, spec.var, check)
        ti = self._types.setdefault(spec.type, _TypeIndex())
        ti.entries += 1
        if check is None:  # no condition: the statement is reached by every event of the type
            ti.always[seq] = ti.always.get(seq, 0) + 1
            entry.place = ("always",)
            return entry
        paths = [p for p in (_path_conjunct(c, spec.var, spec.kleene) for c in conj) if p is not None]
        eqs = sorted(((a, v) for a, op, v in paths if op == "="), key=lambda av: av[0])
        node = ti.root
        node.size += 1
        for attr, value in eqs:
            slot = node.eq.get(attr)
            if slot is None:
                slot = node.eq[attr] = (attr_getter(attr), {})
            child = slot[1].get(value)
            if child is None:
                child = slot[1][value] = _Node()
            entry.path.append((node, attr, value))
            node = child
            node.size += 1
        ranges = [p for p in paths if p[1] != "="]
        if not ranges:
            node.residual.append(entry)
            entry.place = ("residual", node)
            return entry
        attr, lo, hi = _choose_range(ranges)
        rng = node.ranges.get(attr)
        if rng is None:
            rng = node.ranges[attr] = _Ranges(attr)
        rng.size += 1
        if lo is not None and hi is not None:
            width = _width(lo, hi)
            entry.place = ("both", node, attr, lo, width)
            rng.add_both(lo, width, entry)
        elif lo is not None:
            entry.place = ("lower", node, attr, lo, _kind(lo))
            rng.lower[_kind(lo)].add(lo, entry)  # type: ignore[index]
        else:
            entry.place = ("upper", node, attr, hi, _kind(hi))
            rng.upper[_kind(hi)].add(hi, entry)  # type: ignore[index]
        return entry

    def _remove_entry(self, entry: _Entry) -> None:
        ti = self._types[entry.type]
        ti.entries -= 1
        kind = entry.place[0]
        if kind == "always":
            n = ti.always.pop(entry.seq) - 1
            if n:
                ti.always[entry.seq] = n
            self._drop_if_empty(entry.type)
            return
        node = entry.place[1]
        if kind == "residual":
            node.residual.remove(entry)
        else:
            attr, bound = entry.place[2], entry.place[3]
            rng = node.ranges[attr]
            if kind == "both":
                rng.remove_both(bound, entry.place[4], entry)
            elif kind == "lower":
                rng.lower[entry.place[4]].remove(bound, entry)
            else:
                rng.upper[entry.place[4]].remove(bound, entry)
            rng.size -= 1
            if not rng.size:
                del node.ranges[attr]
        # walk back up the hash levels, pruning emptied nodes
        node.size -= 1
        for parent, attr, value in reversed(entry.path):
            if not node.size:
                table = parent.eq[attr][1]
                del table[value]
                if not table:
                    del parent.eq[attr]
            node = parent
            node.size -= 1
        self._drop_if_empty(entry.type)

    def _drop_if_empty(self, type_name: str) -> None:
        ti = self._types[type_name]
        if not ti.entries and not ti.always:
            del self._types[type_name]

    # ------------------------------------------------------------------ lookups

    def reached(self, event: Event) -> list[str]:
        """The ids of the statements ``event`` can affect, in insertion order (equal to :meth:`scan`)."""
        self.events += 1
        ti = self._types.get(event.type)
        if ti is None:
            return []
        hit = set(ti.always)
        if ti.root.size:
            out: list[_Entry] = []
            ti.root.collect(event, out)
            self.candidates += len(out)
            for entry in out:
                if entry.seq not in hit and entry.check(event, None, None):  # type: ignore[misc]
                    hit.add(entry.seq)
        self.reached_total += len(hit)
        by_seq = self._by_seq
        return [by_seq[s] for s in sorted(hit)]

    def scan(self, event: Event) -> list[str]:
        """The linear scan :meth:`reached` must equal: every statement, every entry's whole conjunction."""
        out = []
        for st in self._statements.values():
            if event.type in st.always_types:
                out.append(st.sid)
                continue
            for entry in st.entries:
                if entry.type == event.type and (entry.check is None or entry.check(event, None, None)):
                    out.append(st.sid)
                    break
        return out

    def stats(self) -> dict[str, Any]:
        """Counters (JSON-ready): statements, entries, always-reached statements per type, tree sizes, and
        per event looked up: candidates verified and statements reached (means)."""
        per_type: dict[str, Any] = {}
        for t, ti in self._types.items():
            nodes, hashed, ranged, residual = _tree_stats(ti.root)
            per_type[t] = {
                "entries": ti.entries,
                "always": len(ti.always),
                "nodes": nodes,
                "hash_levels": hashed,
                "range_entries": ranged,
                "residual_entries": residual,
            }
        n = max(self.events, 1)
        return {
            "statements": len(self._statements),
            "entries": sum(len(s.entries) for s in self._statements.values()),
            "types": per_type,
            "events": self.events,
            "candidates_per_event": self.candidates / n,
            "reached_per_event": self.reached_total / n,
        }


def _choose_range(ranges: list[tuple[str, str, Any]]) -> tuple[str, Any, Any]:
    """The range access path of an entry: ``(attr, lo, hi)`` (one of lo/hi may be None).

    A two-sided numeric range on one attribute first (attributes in name order), else the first
    one-sided bound. Bounds stay inclusive here: the compiled conjunction decides equality at a bound.
    """
    by_attr: dict[str, tuple[Any, Any]] = {}
    for attr, op, value in sorted(ranges, key=lambda r: r[0]):
        lo, hi = by_attr.get(attr, (None, None))
        if op in (">", ">=") and lo is None:
            lo = value
        elif op in ("<", "<=") and hi is None:
            hi = value
        by_attr[attr] = (lo, hi)
    for attr, (lo, hi) in by_attr.items():
        if lo is not None and hi is not None and _kind(lo) == _NUM and _kind(hi) == _NUM:
            return attr, lo, hi
    attr, (lo, hi) = next(iter(by_attr.items()))
    return (attr, lo, None) if lo is not None else (attr, None, hi)


def _tree_stats(node: _Node) -> tuple[int, int, int, int]:
    nodes, hashed, ranged, residual = 1, 0, 0, len(node.residual)
    for _get, table in node.eq.values():
        hashed += 1
        for child in table.values():
            n, h, r, s = _tree_stats(child)
            nodes, hashed, ranged, residual = nodes + n, hashed + h, ranged + r, residual + s
    ranged += sum(r.size for r in node.ranges.values())
    return nodes, hashed, ranged, residual


__all__ = ["CONTIGUOUS", "EntrySpec", "RuleIndex", "entry_resolver", "single_variable_conjuncts", "statement_entries"]
