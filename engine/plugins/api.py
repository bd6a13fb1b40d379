"""What a LACE plug-in is: scalar functions, aggregates and operators (issue 16; paper 004, Definition 1).

A plug-in is a Python package that declares entry points (``importlib.metadata``) in three groups;
each entry point names an object of the matching shape (LQL text only ever *names* a plug-in):

``lace.functions`` -> a :class:`Function`
    A scalar function usable in WHERE, JOIN and RETURN: ``hour_of_day(a.ts)``.
``lace.aggregates`` -> an object with the :class:`AggregateProtocol` shape
    An aggregate over the elements of a Kleene variable in RETURN (``stddev(b.price)``) and, with
    ``remove``, over a sliding window.
``lace.operators`` -> a factory (usually a class) of objects with the :class:`OperatorProtocol` shape
    An operator ``S = <Z, Q, F>`` (004, Definition 1) used as a pattern component
    ``name(Type, param...) v``: ``Q`` accepts(binding, event), ``F`` compose(children),
    ``Z`` schema(children), plus ``span()``, a declared ``cost`` and ``pass_estimate``.

Types are named as in schemas: ``int``, ``float``, ``number`` (int or float), ``timestamp`` (int
microseconds UTC), ``duration`` (int microseconds), ``string``, ``bool``, ``any``.

Errors: a plug-in that raises, returns a value of the wrong type or shape, or is declared wrongly
makes a :class:`PluginError` that names it and the package it comes from.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from engine.events import Event

TYPE_NAMES: frozenset[str] = frozenset(
    {"int", "float", "number", "timestamp", "duration", "string", "bool", "any"}
)
"""The type names a plug-in may declare."""


class PluginError(Exception):
    """A plug-in misbehaved (raised, returned the wrong shape or type) or is declared wrongly.

    ``kind`` is ``function``, ``aggregate`` or ``operator``; ``name`` the plug-in's name in LQL;
    ``source`` the distribution (package) that registered it; ``reason`` one line.
    """

    def __init__(self, kind: str, name: str, source: str, reason: str) -> None:
        self.kind, self.name, self.source, self.reason = kind, name, source, reason
        super().__init__(f"{kind} plug-in '{name}' (from {source}): {reason}")


def value_has_type(value: Any, type_name: str) -> bool:
    """Whether a non-None ``value`` is of the declared plug-in type ``type_name`` (see module docstring)."""
    if type_name == "any":
        return True
    if type_name == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if type_name in ("int", "timestamp", "duration"):
        return isinstance(value, int)
    if type_name == "float":
        return isinstance(value, (int, float))
    if type_name == "number":
        return isinstance(value, (int, float))
    if type_name == "string":
        return isinstance(value, str)
    return False


@dataclass(frozen=True, slots=True)
class Function:
    """A scalar function plug-in (entry point group ``lace.functions``).

    Parameters
    ----------
    name : str
        The name in LQL (lower case, an identifier).
    params : tuple[str, ...]
        Declared parameter types (see :data:`TYPE_NAMES`), one per argument.
    returns : str
        Declared result type; a result of another type is a :class:`PluginError`.
    fn : callable
        ``fn(*args) -> value``. Called only with non-None arguments of the declared types: an
        argument that is None or of another type makes the call None (the null rules of
        docs/semantics.md section 3), without calling ``fn``.
    min_args : int, optional
        Fewest arguments (the rest are optional and not passed); default ``len(params)``.
    doc : str
        One line for ``lace operators``.
    """

    name: str
    params: tuple[str, ...]
    returns: str
    fn: Callable[..., Any]
    min_args: int | None = None
    doc: str = ""


@runtime_checkable
class AggregateProtocol(Protocol):
    """An aggregate plug-in (entry point group ``lace.aggregates``): a small incremental protocol.

    Attributes ``name`` (str), ``arg_type`` and ``returns`` (type names), ``doc`` (str), and:

    - ``init() -> state``: the state of an empty group;
    - ``add(state, value) -> state``: include one non-None value (may mutate ``state`` and return it);
    - ``remove(state, value) -> state``: exclude a value added before (sliding windows; first in,
      first out is enough), or raise NotImplementedError when the aggregate cannot;
    - ``value(state) -> result``: the current result (None for an empty group).

    None values are skipped by the caller, never passed to ``add``/``remove``.
    """

    name: str
    arg_type: str
    returns: str

    def init(self) -> Any: ...

    def add(self, state: Any, value: Any) -> Any: ...

    def remove(self, state: Any, value: Any) -> Any: ...

    def value(self, state: Any) -> Any: ...


Composite = tuple[int, int, Mapping[str, Any]]
"""What ``compose`` returns: ``(ts, ts_end, attrs)``, int microseconds UTC and the attributes."""


@runtime_checkable
class OperatorProtocol(Protocol):
    """An operator instance ``S = <Z, Q, F>`` (004, Definition 1), built by the entry point's factory
    from the query's literal parameters: ``factory(*params)``.

    Class attributes: ``name`` (str), ``arity`` (number of input event types), ``params`` (declared
    parameter types), ``min_params`` (int), ``cost`` (float > 0: evaluation cost per input event,
    relative to one comparison), ``pass_estimate`` (float in (0, 1]: composites per input event),
    ``doc`` (str). Methods:

    - ``schema(children) -> dict`` (Z): attribute name -> type of the composite events, given the
      schemas (attribute -> type) of the input event types;
    - ``accepts(binding, event) -> bool`` (Q): whether ``event`` extends ``binding`` (the events
      gathered so far, oldest first, read-only); with an empty binding, whether ``event`` may start one;
    - ``compose(children) -> (ts, ts_end, attrs) | None`` (F): the composite event of ``children``
      when they form a complete instance, else None; ``ts <= ts_end <= `` the newest child's ts;
    - ``span() -> int | None``: the longest time (microseconds) a binding may cover (None: unbounded).

    Optional (issue 24):

    - ``history_us() -> int | None``: how far (microseconds) before the oldest event of a query's window (its
      WITHIN) the operator's state may still depend on events: a restart's replay rebuilds the query's state
      from the archive and must begin that much earlier, or a binding alive at the crash starts again in
      another place (``dedup``: its period, or an alarm it absorbed comes out as a new one). None: unbounded
      (the replay goes back its limit, ``LACE_REPLAY_MAX_S``). Without the method: 0, nothing beyond the
      window. :func:`engine.plugins.stage.operators_history_us` reads it.

    How the engine drives an operator is in :mod:`engine.plugins.stage`.
    """

    name: str
    arity: int
    cost: float
    pass_estimate: float

    def schema(self, children: Sequence[Mapping[str, str]]) -> dict[str, str]: ...

    def accepts(self, binding: Sequence[Event], event: Event) -> bool: ...

    def compose(self, children: Sequence[Event]) -> Composite | None: ...

    def span(self) -> int | None: ...
