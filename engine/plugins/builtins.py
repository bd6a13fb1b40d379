"""LACE's built-in plug-ins, shipped through the same entry points as any other (pyproject.toml).

Functions (``lace.functions``): ``hour_of_day(ts)``, ``day_of_week(ts)``, ``abs(x)``, ``round(x[, n])``.
Aggregates (``lace.aggregates``): ``count``, ``sum``, ``avg``, ``min``, ``max``, ``stddev``.
Operators (``lace.operators``): ``dedup(Type, period)`` (004's alarm de-duplication) and
``vshape(Type[, legs])`` (a V-shaped price move over bars).

Timestamps are int microseconds since the Unix epoch, UTC: the calendar functions use UTC (no time
zone or daylight saving time), like every timestamp in LACE.
"""
from __future__ import annotations

import builtins as _py
import math
from collections.abc import Mapping, Sequence
from typing import Any

from sortedcontainers import SortedList

from engine.events import Event
from engine.plugins.api import Composite, Function

HOUR_US = 3_600_000_000
DAY_US = 86_400_000_000

# ------------------------------------------------------------------------------ functions


def _hour_of_day(ts: int) -> int:
    return (ts // HOUR_US) % 24


def _day_of_week(ts: int) -> int:
    # 1970-01-01 was a Thursday (ISO 4); floor division keeps times before 1970 right
    return (ts // DAY_US + 3) % 7 + 1


def _round(x: float, n: int = 0) -> float | int:
    return _py.round(x, n) if n else _py.round(x)


hour_of_day = Function(
    "hour_of_day", ("timestamp",), "int", _hour_of_day,
    doc="hour of the day of a timestamp, 0-23, UTC: hour_of_day(a.ts)",
)
day_of_week = Function(
    "day_of_week", ("timestamp",), "int", _day_of_week,
    doc="ISO day of the week of a timestamp, Monday = 1 ... Sunday = 7, UTC",
)
abs_ = Function("abs", ("number",), "number", _py.abs, doc="absolute value: abs(a.x - b.x)")
round_ = Function(
    "round", ("number", "int"), "number", _round, min_args=1,
    doc="round(x) to an int, round(x, n) to n decimals (half to even, as Python's round)",
)

# ------------------------------------------------------------------------------ aggregates


class _Count:
    """count(b.x): the number of non-None values."""

    name, arg_type, returns = "count", "any", "int"

    def init(self) -> list[int]:
        return [0]

    def add(self, state: list[int], value: Any) -> list[int]:
        state[0] += 1
        return state

    def remove(self, state: list[int], value: Any) -> list[int]:
        state[0] -= 1
        return state

    def value(self, state: list[int]) -> int:
        return state[0]


class _Sum:
    """sum(b.x): the sum of the non-None values (None for none)."""

    name, arg_type, returns = "sum", "number", "number"

    def init(self) -> list[Any]:
        return [0, 0]  # sum, n

    def add(self, state: list[Any], value: Any) -> list[Any]:
        state[0] += value
        state[1] += 1
        return state

    def remove(self, state: list[Any], value: Any) -> list[Any]:
        state[0] -= value
        state[1] -= 1
        return state

    def value(self, state: list[Any]) -> Any:
        return state[0] if state[1] else None


class _Avg(_Sum):
    """avg(b.x): the mean of the non-None values (None for none)."""

    name, arg_type, returns = "avg", "number", "float"

    def value(self, state: list[Any]) -> Any:
        return state[0] / state[1] if state[1] else None


class _Extreme:
    """min/max over a sorted multiset, so that remove() is exact (O(log n))."""

    name, arg_type, returns = "min", "any", "any"
    index = 0

    def init(self) -> SortedList:
        return SortedList()

    def add(self, state: SortedList, value: Any) -> SortedList:
        state.add(value)
        return state

    def remove(self, state: SortedList, value: Any) -> SortedList:
        state.remove(value)
        return state

    def value(self, state: SortedList) -> Any:
        return state[self.index] if state else None


class _Min(_Extreme):
    """min(b.x): the smallest non-None value."""


class _Max(_Extreme):
    """max(b.x): the largest non-None value."""

    name, index = "max", -1


class _Stddev:
    """stddev(b.x): population standard deviation of the non-None values (None for none).

    Welford's update, and its inverse for remove.
    """

    name, arg_type, returns = "stddev", "number", "float"

    def init(self) -> list[float]:
        return [0, 0.0, 0.0]  # n, mean, M2

    def add(self, state: list[float], value: Any) -> list[float]:
        n, mean, m2 = state
        n += 1
        delta = value - mean
        mean += delta / n
        state[:] = [n, mean, m2 + delta * (value - mean)]
        return state

    def remove(self, state: list[float], value: Any) -> list[float]:
        n, mean, m2 = state
        if n <= 1:
            state[:] = [0, 0.0, 0.0]
            return state
        old = (n * mean - value) / (n - 1)
        state[:] = [n - 1, old, _py.max(0.0, m2 - (value - old) * (value - mean))]
        return state

    def value(self, state: list[float]) -> float | None:
        n, _, m2 = state
        return math.sqrt(m2 / n) if n else None


count, sum_, avg, min_, max_, stddev = _Count(), _Sum(), _Avg(), _Min(), _Max(), _Stddev()

# ------------------------------------------------------------------------------ operators


class Dedup:
    """``dedup(Type, period) v``: alarm de-duplication (004, the alarm example of section 5).

    Alert at the first event, absorb the repeats (events of the same partition key) that come less
    than ``period`` after it; the first event at or after ``first.ts + period`` alerts again.
    The composite event is the first event itself (its attributes, ``ts_start = ts_end =`` its ts),
    emitted when it arrives. Its state (the open binding) reaches back one period: ``history_us()``.
    """

    name = "dedup"
    arity = 1
    params = ("duration",)
    min_params = 1
    cost = 1.0
    pass_estimate = 0.5
    doc = "alert at the first event, absorb repeats for a period: dedup(alarm, 10 min) d"

    def __init__(self, period_us: int) -> None:
        if period_us <= 0:
            raise ValueError("dedup needs a period greater than zero, e.g. dedup(alarm, 10 min)")
        self.period_us = period_us

    def schema(self, children: Sequence[Mapping[str, str]]) -> dict[str, str]:
        return dict(children[0])

    def accepts(self, binding: Sequence[Event], event: Event) -> bool:
        return not binding or event.ts - binding[0].ts < self.period_us

    def compose(self, children: Sequence[Event]) -> Composite | None:
        first = children[0]
        return (first.ts, first.ts, first.attrs) if len(children) == 1 else None

    def span(self) -> int | None:
        return self.period_us

    def history_us(self) -> int | None:
        """A binding alive now started less than a period ago: a replay must begin a period earlier. (Exact when
        the alarms of a key pause for a period at least once in it; repeats that never pause for a period chain
        bindings further back, and a replay that starts inside such a chain may place them otherwise.)"""
        return self.period_us


class VShape:
    """``vshape(Type[, legs]) v``: a V-shaped move over bars (attributes ``open`` and ``close``).

    A falling bar has ``close < open``, a rising bar ``close > open``. A V is ``legs`` or more
    consecutive falling bars followed by ``legs`` or more consecutive rising bars of one partition
    key (default ``legs`` 2). It is emitted at its ``legs``-th rising bar; later rising bars extend
    it without a new composite; a bar that is neither falling nor rising, or a falling bar after
    the rise, ends it (a falling bar then starts the next candidate).

    Attributes of the composite: ``start_price`` (open of the first falling bar), ``bottom_price``
    (close of the last falling bar), ``end_price`` (close of the bar that completed the V),
    ``drop = start_price - bottom_price``, ``recovery = end_price - bottom_price``, ``fall_bars``,
    ``rise_bars``; ``ts_start`` the first bar's ts, ``ts_end`` the completing bar's ts.
    """

    name = "vshape"
    arity = 1
    params = ("int",)
    min_params = 0
    cost = 2.0
    pass_estimate = 0.01
    doc = "k+ falling bars then k+ rising bars (close vs open; k default 2): vshape(bar, 3) v"

    def __init__(self, legs: int = 2) -> None:
        if legs < 1:
            raise ValueError("vshape needs legs >= 1")
        self.legs = legs

    def schema(self, children: Sequence[Mapping[str, str]]) -> dict[str, str]:
        attrs = children[0]
        for need in ("open", "close"):
            if attrs.get(need) not in ("int", "float"):
                raise ValueError(f"vshape needs a numeric '{need}' attribute")
        out = {k: "float" for k in ("start_price", "bottom_price", "end_price", "drop", "recovery")}
        return {**out, "fall_bars": "int", "rise_bars": "int"}

    @staticmethod
    def _move(e: Event) -> int:
        o, c = e.attrs.get("open"), e.attrs.get("close")
        if o is None or c is None:
            return 0
        return -1 if c < o else (1 if c > o else 0)

    def accepts(self, binding: Sequence[Event], event: Event) -> bool:
        move = self._move(event)
        if not binding:
            return move < 0
        if move > 0:
            return True
        return move < 0 and self._move(binding[-1]) < 0

    def compose(self, children: Sequence[Event]) -> Composite | None:
        falls = 0
        for e in children:
            if self._move(e) >= 0:
                break
            falls += 1
        rises = len(children) - falls
        if falls < self.legs or rises != self.legs:
            return None
        first, bottom, last = children[0], children[falls - 1], children[-1]
        start, low, end = first.attrs["open"], bottom.attrs["close"], last.attrs["close"]
        attrs = {
            "start_price": float(start), "bottom_price": float(low), "end_price": float(end),
            "drop": float(start - low), "recovery": float(end - low), "fall_bars": falls, "rise_bars": rises,
        }
        return (first.ts, last.ts, attrs)

    def span(self) -> int | None:
        return None


BUILTINS: dict[str, dict[str, Any]] = {
    "function": {f.name: f for f in (hour_of_day, day_of_week, abs_, round_)},
    "aggregate": {a.name: a for a in (count, sum_, avg, min_, max_, stddev)},
    "operator": {"dedup": Dedup, "vshape": VShape},
}
"""What this module ships, by kind and name (the entry points in pyproject.toml name the same objects)."""
