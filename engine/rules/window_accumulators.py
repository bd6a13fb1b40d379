"""Exact mergeable partial aggregates of one attribute's values, for the window operator
(:mod:`engine.rules.windows`; docs/semantics.md section 8, docs/architecture.md section 7.9).

:class:`_Acc` holds, for the values of one attribute over some events (a pane, or a merged window), what
``sum``/``avg``/``min``/``max`` need, and merges with another in O(partials): the count of non-missing values,
the exact sum of the ints, Shewchuk's exact non-overlapping partials of the finite floats, the inf/nan seen,
whether a non-numeric value was seen (sum/avg -> None), and min/max unless the values were incomparable
(min/max -> None). :meth:`_Acc.total` rounds once, with :func:`math.fsum`, so a window's sum equals
``math.fsum`` of its values whatever the panes (ints above 2**53 are added exactly).
"""
from __future__ import annotations

import math
from typing import Any


def _grow(partials: list[float], x: float) -> None:
    """Add finite ``x`` to Shewchuk's non-overlapping partials (exact; "Adaptive precision floating-point
    arithmetic", Discrete Comput. Geom. 18, 1997; the algorithm of :func:`math.fsum`)."""
    i = 0
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            partials[i] = lo
            i += 1
        x = hi
    partials[i:] = [x]


def _int_as_floats(n: int) -> list[float]:
    """Floats whose exact sum is the int ``n`` (empty for 0)."""
    out: list[float] = []
    while n:
        f = float(n)
        out.append(f)
        n -= int(f)
    return out


class _Acc:
    """The partial aggregate of one attribute's values over some events (a pane, or a merged window)."""

    __slots__ = ("order", "n", "isum", "fparts", "special", "bad", "mn", "mx", "unordered")

    def __init__(self, order: bool) -> None:
        self.order = order  # keep min/max (only when the query asks for them)
        self.n = 0  # values that are not missing
        self.isum = 0  # exact sum of the int values
        self.fparts: list[float] | None = None  # exact partials of the float values (None: no float yet)
        self.special: float | None = None  # inf / -inf / nan seen
        self.bad = False  # a non-numeric value (sum/avg -> None)
        self.mn: Any = None
        self.mx: Any = None
        self.unordered = False  # incomparable values (min/max -> None)

    def add(self, v: Any) -> None:
        if v is None:
            return
        self.n += 1
        if isinstance(v, int):
            self.isum += v
        elif isinstance(v, float):
            if math.isfinite(v):
                if self.fparts is None:
                    self.fparts = [v]
                else:
                    _grow(self.fparts, v)
            else:
                self.special = _special(self.special, v)
                if self.fparts is None:
                    self.fparts = []
        else:
            self.bad = True
        if self.order and not self.unordered:
            try:
                if self.mn is None or v < self.mn:
                    self.mn = v
                if self.mx is None or v > self.mx:
                    self.mx = v
            except TypeError:
                self.unordered = True

    def merge(self, other: _Acc) -> None:
        n = other.n
        if not n:
            return
        self.n += n
        self.isum += other.isum
        if other.fparts is not None:
            if self.fparts is None:
                self.fparts = other.fparts[:]
            else:
                self.fparts = self.fparts + other.fparts
                if len(self.fparts) > 16:  # keep merged partials short (exact: the same sum)
                    parts: list[float] = []
                    for x in self.fparts:
                        _grow(parts, x)
                    self.fparts = parts
            if other.special is not None:
                self.special = _special(self.special, other.special)
        if other.bad:
            self.bad = True
        if not self.order:
            return
        if other.unordered:
            self.unordered = True
        if not self.unordered:
            try:
                if self.mn is None or other.mn < self.mn:
                    self.mn = other.mn
                if self.mx is None or other.mx > self.mx:
                    self.mx = other.mx
            except TypeError:
                self.unordered = True

    def total(self) -> Any:
        """The sum (int when every value is an int), None when there is no value or a non-numeric one."""
        if not self.n or self.bad:
            return None
        if self.fparts is None:
            return self.isum
        if self.special is not None:
            return self.special
        try:
            return math.fsum(self.fparts + _int_as_floats(self.isum))
        except (OverflowError, ValueError):
            return None

    def mean(self) -> Any:
        total = self.total()
        if total is None:
            return None
        try:
            return total / self.n
        except OverflowError:
            return None


def _merge_accs(accs: list[_Acc], order: bool) -> _Acc:
    """A new _Acc of all ``accs`` (a fast path for the common case: int values, no min/max)."""
    out = _Acc(order)
    if not order:
        n = isum = 0
        for a in accs:
            if a.fparts is not None or a.bad:
                break
            n += a.n
            isum += a.isum
        else:
            out.n, out.isum = n, isum
            return out
    for a in accs:
        out.merge(a)
    return out


def _special(acc: float | None, v: float) -> float:
    if acc is None or acc == v:
        return v
    return math.nan  # nan with anything, or +inf with -inf
