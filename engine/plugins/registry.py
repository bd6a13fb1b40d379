"""The installed plug-ins: entry points ``lace.functions``, ``lace.aggregates``, ``lace.operators``.

:func:`registry` loads them once, lazily (the first query that names a function, or ``lace
operators``), and checks each one's shape (name, arity, declared types; for operators the
``Z``/``Q``/``F`` methods, ``span``, cost and pass estimate). A plug-in that fails to load or is
declared wrongly is kept as *broken*: it is listed with its error, and a query that names it gets a
QueryError naming it; the other plug-ins still work. Two packages registering one name make it
broken too (the error names both).

LACE's own built-ins (:mod:`engine.plugins.builtins`) come through the same entry points (declared
in pyproject.toml). When the installed metadata predates them (an editable install made before the
entry points existed), they are loaded from the module directly, with source ``lace (built-in)``.
"""
from __future__ import annotations

import inspect
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from engine.plugins.api import TYPE_NAMES, Function

GROUPS: dict[str, str] = {"function": "lace.functions", "aggregate": "lace.aggregates", "operator": "lace.operators"}
"""Plug-in kind -> entry point group."""

_OPERATOR_METHODS = ("schema", "accepts", "compose", "span")
_AGGREGATE_METHODS = ("init", "add", "remove", "value")


@dataclass(slots=True)
class Plugin:
    """One registered plug-in: ``kind`` (function|aggregate|operator), ``name``, ``source`` (the
    distribution, ``name version``), ``obj`` (the loaded object: a Function, an aggregate, an
    operator factory) and ``error`` (why it is broken, else None)."""

    kind: str
    name: str
    source: str
    obj: Any = None
    error: str | None = None
    signature: str = ""
    doc: str = ""


@dataclass(slots=True)
class Registry:
    """Plug-ins by kind and name (see the module docstring)."""

    plugins: dict[str, dict[str, Plugin]] = field(default_factory=lambda: {k: {} for k in GROUPS})

    def get(self, kind: str, name: str) -> Plugin | None:
        """The plug-in ``name`` of ``kind`` (None when none is installed); may be broken (``error``)."""
        return self.plugins[kind].get(name.lower())

    def names(self, kind: str) -> list[str]:
        """Sorted names of the working plug-ins of ``kind``."""
        return sorted(n for n, p in self.plugins[kind].items() if p.error is None)

    def all(self) -> list[Plugin]:
        """Every plug-in, broken ones included, by kind then name."""
        return [p for kind in GROUPS for _, p in sorted(self.plugins[kind].items())]

    def add(self, plugin: Plugin) -> None:
        """Register ``plugin``; a second one with the same kind and name makes the name broken."""
        table = self.plugins[plugin.kind]
        seen = table.get(plugin.name)
        if seen is None:
            table[plugin.name] = plugin
        elif seen.source != plugin.source:
            seen.error = f"registered by both {seen.source} and {plugin.source}"


def _source(ep: EntryPoint) -> str:
    dist = ep.dist
    return f"{dist.name} {dist.version}" if dist is not None else "unknown package"


def _is_type(t: Any) -> bool:
    return isinstance(t, str) and t in TYPE_NAMES


def validate(kind: str, name: str, obj: Any) -> tuple[str, str]:
    """Check a loaded plug-in's shape; return (signature text, doc line).

    Raises
    ------
    ValueError
        Naming what is wrong (the caller names the plug-in).
    """
    declared = getattr(obj, "name", None)
    if not isinstance(declared, str) or declared.lower() != name:
        raise ValueError(f"its name attribute is {declared!r}, the entry point says {name!r}")
    doc = str(getattr(obj, "doc", "") or (inspect.getdoc(obj) or "").split("\n")[0])
    if kind == "function":
        if not isinstance(obj, Function):
            raise ValueError("a lace.functions entry point must name an engine.plugins.api.Function")
        if not callable(obj.fn):
            raise ValueError("fn is not callable")
        if not all(_is_type(t) for t in obj.params) or not _is_type(obj.returns):
            raise ValueError(f"declared types must be among {sorted(TYPE_NAMES)}")
        low = len(obj.params) if obj.min_args is None else obj.min_args
        if not 0 <= low <= len(obj.params):
            raise ValueError(f"min_args {obj.min_args} is not between 0 and {len(obj.params)}")
        args = [t if i < low else f"[{t}]" for i, t in enumerate(obj.params)]
        return f"{name}({', '.join(args)}) -> {obj.returns}", doc
    if kind == "aggregate":
        if inspect.isclass(obj):
            raise ValueError("a lace.aggregates entry point must name an aggregate object (an instance), not a class")
        for method in _AGGREGATE_METHODS:
            if not callable(getattr(obj, method, None)):
                raise ValueError(f"it has no {method}() method (aggregates need init, add, remove, value)")
        arg, ret = getattr(obj, "arg_type", None), getattr(obj, "returns", None)
        if not _is_type(arg) or not _is_type(ret):
            raise ValueError(f"arg_type and returns must be among {sorted(TYPE_NAMES)}")
        return f"{name}(v.{arg}) -> {ret}", doc
    if not callable(obj):
        raise ValueError("a lace.operators entry point must name a factory (a class) of operators")
    for method in _OPERATOR_METHODS:
        if not callable(getattr(obj, method, None)):
            raise ValueError(f"its operators have no {method}() method (Z schema, Q accepts, F compose, span)")
    arity, params = getattr(obj, "arity", None), getattr(obj, "params", ())
    if not isinstance(arity, int) or arity < 1:
        raise ValueError(f"arity must be an int >= 1, not {arity!r}")
    if not isinstance(params, tuple) or not all(_is_type(t) for t in params):
        raise ValueError(f"params must be a tuple of type names among {sorted(TYPE_NAMES)}")
    low = getattr(obj, "min_params", len(params))
    if not isinstance(low, int) or not 0 <= low <= len(params):
        raise ValueError(f"min_params must be an int between 0 and {len(params)}")
    cost, pass_estimate = getattr(obj, "cost", None), getattr(obj, "pass_estimate", None)
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not cost > 0:
        raise ValueError(f"the declared cost must be a number > 0, not {cost!r}")
    if isinstance(pass_estimate, bool) or not isinstance(pass_estimate, (int, float)) or not 0 < pass_estimate <= 1:
        raise ValueError(f"the declared pass estimate must be a number in (0, 1], not {pass_estimate!r}")
    inputs = ", ".join(["Type"] * arity)
    extra = "".join(f", {t}" if i < low else f"[, {t}]" for i, t in enumerate(params))
    return f"{name}({inputs}{extra}) v", doc


def build(items: Iterable[tuple[str, str, str, Any]]) -> Registry:
    """A registry from ``(kind, name, source, loader)`` items; ``loader()`` returns the plug-in object.

    Each item is validated; a loader that raises or an object of the wrong shape gives a broken entry.
    """
    reg = Registry()
    for kind, name, source, loader in items:
        plugin = Plugin(kind, name.lower(), source)
        try:
            plugin.obj = loader()
            plugin.signature, plugin.doc = validate(kind, plugin.name, plugin.obj)
        except Exception as err:  # a broken plug-in must not break the others
            plugin.error = f"{type(err).__name__}: {err}" if not isinstance(err, ValueError) else str(err)
        reg.add(plugin)
    return reg


def _from_entry_points() -> Registry:
    items: list[tuple[str, str, str, Any]] = []
    for kind, group in GROUPS.items():
        for ep in entry_points(group=group):
            items.append((kind, ep.name, _source(ep), ep.load))
    from engine.plugins import builtins

    shipped = [(k, n) for k, table in builtins.BUILTINS.items() for n in table]
    found = {(kind, name.lower()) for kind, name, _, _ in items}
    for kind, name in shipped:  # stale install metadata: the built-ins from the module itself
        if (kind, name) not in found:
            items.append((kind, name, "lace (built-in)", lambda k=kind, n=name: builtins.BUILTINS[k][n]))
    return build(items)


_LOCK = threading.Lock()
_REGISTRY: Registry | None = None


def registry() -> Registry:
    """The installed plug-ins, loaded once (thread-safe); :func:`reload` forgets them."""
    global _REGISTRY
    with _LOCK:
        if _REGISTRY is None:
            _REGISTRY = _from_entry_points()
        return _REGISTRY


def reload() -> Registry:
    """Load the entry points again (after installing a plug-in package in a running process)."""
    global _REGISTRY
    with _LOCK:
        _REGISTRY = None
    return registry()


def catalog() -> list[dict[str, object]]:
    """Every installed plug-in as a dict (for ``lace operators`` and ``GET /operators``), by kind then name.

    Keys: ``kind`` (function|aggregate|operator), ``name``, ``source`` (package and version),
    ``signature`` (LQL usage), ``doc`` (one line), ``cost`` and ``pass_estimate`` (operators; else
    None), ``error`` (why it is broken; None when it works).
    """
    out: list[dict[str, object]] = []
    for p in registry().all():
        operator = p.kind == "operator" and p.error is None
        out.append({
            "kind": p.kind,
            "name": p.name,
            "source": p.source,
            "signature": p.signature,
            "doc": p.doc,
            "cost": float(p.obj.cost) if operator else None,
            "pass_estimate": float(p.obj.pass_estimate) if operator else None,
            "error": p.error,
        })
    return out
