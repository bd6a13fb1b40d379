"""The structures of the rule index (:mod:`engine.rules.index`; Esper's filter service: per event type, a tree
of filter-parameter indexes): one level of hash tables by attribute (:class:`_Node`), constant ranges on one
attribute sorted by bound (:class:`_Ranges`, :class:`_Sorted`), and the entries stored in them (:class:`_Entry`).

Lookups only need a superset of the satisfied entries (the caller verifies each candidate with the entry's
compiled conjunction): a missing value or NaN reaches no equality or range entry, an unhashable or
incomparable value checks every entry of the index it would have used. Values fall in comparable classes
(:func:`_kind`: numbers and bools; strings); a two-sided numeric range is found by bisecting its lower bound
within ``[x - widest range, x]``, with widths rounded up and bounds rounded down so floats never lose an entry.
"""
from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.events import Event, attr_getter
from engine.nfa.conditions import Fn

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


def _tree_stats(node: _Node) -> tuple[int, int, int, int]:
    nodes, hashed, ranged, residual = 1, 0, 0, len(node.residual)
    for _get, table in node.eq.values():
        hashed += 1
        for child in table.values():
            n, h, r, s = _tree_stats(child)
            nodes, hashed, ranged, residual = nodes + n, hashed + h, ranged + r, residual + s
    ranged += sum(r.size for r in node.ranges.values())
    return nodes, hashed, ranged, residual
