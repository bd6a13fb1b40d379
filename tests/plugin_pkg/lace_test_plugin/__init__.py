"""Test plug-ins for LACE (issue 16): installed by `make venv`, used by tests/engine/test_plugins.py.

Working: ``clamp(x, lo, hi)``, the aggregate ``spread`` (max - min) and the operator
``updown(Type) v`` (a rising bar immediately followed by a falling one, per key).
Misbehaving on purpose: ``explode`` raises, ``wrong_type`` returns a string though it declares an int,
``badshape`` composes a 2-tuple, ``nocompose`` lacks compose() (its entry is broken at load).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.events import Event
from engine.plugins.api import Function


def _clamp(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def _explode(x: float) -> float:
    raise RuntimeError("boom")


clamp = Function("clamp", ("number", "number", "number"), "number", _clamp, doc="clamp(x, lo, hi)")
explode = Function("explode", ("number",), "number", _explode, doc="always raises (test)")
wrong_type = Function("wrong_type", ("number",), "int", lambda x: "oops", doc="returns a string (test)")


class Spread:
    """spread(b.x): max - min of the values (test aggregate)."""

    name, arg_type, returns = "spread", "number", "number"

    def init(self) -> list[Any]:
        return []

    def add(self, state: list[Any], value: Any) -> list[Any]:
        state.append(value)
        return state

    def remove(self, state: list[Any], value: Any) -> list[Any]:
        state.remove(value)
        return state

    def value(self, state: list[Any]) -> Any:
        return max(state) - min(state) if state else None


def _move(e: Event) -> int:
    o, c = e.attrs.get("open"), e.attrs.get("close")
    return 0 if o is None or c is None or o == c else (1 if c > o else -1)


class UpDown:
    """updown(Type) v: a rising bar followed at once by a falling bar of the same key."""

    name = "updown"
    arity = 1
    params: tuple[str, ...] = ()
    min_params = 0
    cost = 1.0
    pass_estimate = 0.2
    doc = "a rising bar then a falling bar (test operator)"

    def schema(self, children: Sequence[Mapping[str, str]]) -> dict[str, str]:
        return {"peak": "float"}

    def accepts(self, binding: Sequence[Event], event: Event) -> bool:
        if not binding:
            return _move(event) > 0
        return len(binding) == 1 and _move(event) < 0

    def compose(self, children: Sequence[Event]) -> tuple[int, int, dict[str, Any]] | None:
        if len(children) < 2:
            return None
        return (children[0].ts, children[1].ts, {"peak": float(children[0].attrs["close"])})

    def span(self) -> int | None:
        return None


class BadShape(UpDown):
    """Composes a 2-tuple (test: a clear error naming it)."""

    name = "badshape"

    def compose(self, children: Sequence[Event]) -> Any:
        return (children[0].ts, {}) if len(children) == 2 else None


class NoCompose:
    """Lacks compose(): broken at load (test)."""

    name = "nocompose"
    arity = 1
    params: tuple[str, ...] = ()
    cost = 1.0
    pass_estimate = 0.5

    def schema(self, children: Sequence[Mapping[str, str]]) -> dict[str, str]:
        return {}

    def accepts(self, binding: Sequence[Event], event: Event) -> bool:
        return True

    def span(self) -> int | None:
        return None


spread = Spread()
