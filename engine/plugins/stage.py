"""Running operator plug-ins in front of the NFA (issue 16; 004, Definition 1: S = <Z, Q, F>).

An operator component ``name(T, params...) v`` binds *composite* events that the operator builds from
the events of type ``T``. :class:`OperatorStage` drives each operator use per partition key (the
query's PARTITION BY; one key without it), over the events in the matcher's processing order
((ts, id), after the allowed-lateness buffer):

1. the key's current binding (the events gathered so far, oldest first) is dropped when the new
   event ``e`` is more than ``span()`` after its first event;
2. if ``accepts(binding, e)`` (Q) the binding becomes ``binding + [e]``; else a new binding starts:
   ``[e]`` if ``accepts([], e)``, else none;
3. while the binding has not produced a composite yet, ``compose(binding)`` (F) is asked; the first
   non-None answer ``(ts, ts_end, attrs)`` is emitted, and the binding keeps absorbing events
   (``accepts``) without emitting again, until it is rejected.

A composite is an :class:`Event` of type ``use.derived_type`` placed in the stream right after the
event that completed it: same ``ts`` and ``id`` as that event, attributes ``attrs`` plus ``ts_start``
(= ts) and ``ts_end`` from ``compose``, plus the partition key attributes. The NFA then matches it like
any event (``v.ts`` is the completion time, ``v.ts_start`` the first child's time).

A plug-in that raises, returns a non-bool from ``accepts`` or a wrong shape from ``compose`` raises
:class:`engine.plugins.api.PluginError` naming it.

How far back an operator's state reaches beyond the query's window (its optional ``history_us()``, 0 without
it) is read by :func:`operators_history_us`: a restart's replay begins that much earlier (issue 24).
"""
from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from engine.events import Event
from engine.lql.ast import OperatorUse
from engine.plugins.api import PluginError
from engine.plugins.registry import registry


class _Use:
    """One operator use's state: per key ``[binding, emitted]``."""

    __slots__ = ("use", "op", "source", "span", "keys", "name", "derived")

    def __init__(self, use: OperatorUse) -> None:
        plugin = registry().get("operator", use.name)
        if plugin is None or plugin.error is not None:
            raise KeyError(use.name)
        self.use, self.name, self.source, self.derived = use, use.name, plugin.source, use.derived_type
        try:
            self.op = plugin.obj(*use.params)
            span = self.op.span()
        except Exception as err:
            raise self._error(f"raised {type(err).__name__}: {err}") from err
        if span is not None and (isinstance(span, bool) or not isinstance(span, int) or span <= 0):
            raise self._error(f"span() must return int microseconds > 0 or None, not {span!r}")
        self.span: int | None = span
        self.keys: dict[Hashable, list[Any]] = {}

    def _error(self, reason: str) -> PluginError:
        return PluginError("operator", self.name, self.source, reason)

    def history_us(self) -> int | None:
        """The operator's declared ``history_us()`` (0 when it declares none; None: unbounded)."""
        declared = getattr(self.op, "history_us", None)
        if declared is None:
            return 0
        try:
            reach = declared()
        except Exception as err:
            raise self._error(f"history_us() raised {type(err).__name__}: {err}") from err
        if reach is not None and (isinstance(reach, bool) or not isinstance(reach, int) or reach < 0):
            raise self._error(f"history_us() must return int microseconds >= 0 or None, not {reach!r}")
        return reach

    def _accepts(self, binding: Sequence[Event], e: Event) -> bool:
        try:
            ok = self.op.accepts(binding, e)
        except Exception as err:
            raise self._error(f"accepts() raised {type(err).__name__}: {err}") from err
        if not isinstance(ok, bool):
            raise self._error(f"accepts() must return a bool, not {type(ok).__name__}")
        return ok

    def push(self, e: Event, key: Hashable, key_attrs: Mapping[str, Any]) -> Event | None:
        state = self.keys.get(key)
        if state is None:
            state = self.keys[key] = [[], False]
        binding: list[Event] = state[0]
        if binding and self.span is not None and e.ts - binding[0].ts > self.span:
            binding = state[0] = []
            state[1] = False
        if binding and self._accepts(binding, e):
            binding.append(e)
        else:
            binding = state[0] = [e] if self._accepts((), e) else []
            state[1] = False
            if not binding:
                del self.keys[key]
                return None
        if state[1]:
            return None
        try:
            out = self.op.compose(binding)
        except Exception as err:
            raise self._error(f"compose() raised {type(err).__name__}: {err}") from err
        if out is None:
            return None
        if not (isinstance(out, tuple) and len(out) == 3 and isinstance(out[2], Mapping)):
            raise self._error(f"compose() must return (ts, ts_end, attrs) or None, not {out!r:.80}")
        ts, ts_end, attrs = out
        if not (isinstance(ts, int) and isinstance(ts_end, int) and ts <= ts_end <= e.ts):
            raise self._error(f"compose() returned ts={ts!r}, ts_end={ts_end!r}; need ints with ts <= ts_end <= {e.ts}")
        state[1] = True
        return Event(e.id, self.derived, e.ts, {**attrs, **key_attrs, "ts_start": ts, "ts_end": ts_end})


def operators_history_us(uses: Sequence[OperatorUse]) -> int | None:
    """How far (int microseconds) before a query's window its operators' state may depend on events: the largest
    ``history_us()`` of ``uses`` (an operator without the method: 0; no operator: 0), None when one is unbounded.

    Raises
    ------
    PluginError
        When an operator's factory raises or ``history_us()`` misbehaves.
    KeyError
        For an operator that is not installed.
    """
    reach = 0
    for use in uses:
        r = _Use(use).history_us()
        if r is None:
            return None
        reach = max(reach, r)
    return reach


class OperatorStage:
    """The operator uses of one query (see the module docstring), fed event by event.

    Parameters
    ----------
    uses : sequence of OperatorUse
        From :func:`engine.lql.checks.operator_uses`.
    partition_by : tuple[str, ...]
        The query's partition key attributes.

    Raises
    ------
    PluginError
        When an operator's factory or ``span()`` misbehaves.
    """

    def __init__(self, uses: Sequence[OperatorUse], partition_by: tuple[str, ...]) -> None:
        self.partition_by = partition_by
        self.by_type: dict[str, list[_Use]] = {}
        for use in uses:
            runner = _Use(use)
            for t in dict.fromkeys(use.input_types):
                self.by_type.setdefault(t, []).append(runner)
        self.input_types = frozenset(self.by_type)

    def push(self, e: Event) -> list[Event]:
        """The composite events ``e`` completes (usually none), in operator-use order.

        Raises
        ------
        PluginError
            When an operator raises or returns a wrong shape.
        """
        runners = self.by_type.get(e.type)
        if not runners:
            return []
        pb = self.partition_by
        key_attrs = {a: e.get(a) for a in pb}
        key = tuple(key_attrs.values())
        out = []
        for runner in runners:
            d = runner.push(e, key, key_attrs)
            if d is not None:
                out.append(d)
        return out

    def clear(self) -> None:
        """Forget every binding (end of stream)."""
        for runners in self.by_type.values():
            for r in runners:
                r.keys.clear()

    def bindings(self) -> int:
        """Open bindings over all uses and keys (for stats)."""
        return sum(len(r.keys) for rs in self.by_type.values() for r in rs)
