"""The event type: one model for the engine, the archive and the service (docs/architecture.md section 3).

An event type (a stream) is its name, its attributes and their kinds, its partition key, whether its events are
points or intervals, and what the service needs to take its events: the defaults of optional attributes, the
allowed lateness, an interval's longest duration, whether statements derive it (``EMIT INTO``), and whether its
stream has ended. Every layer uses this one class:

* the compiler reads the attribute kinds (:func:`schema`, the shape :data:`engine.lql.ast.Schema`);
* the archive (``archive/``) reads ``name``, ``attributes``, ``partition_key`` and ``interval``; its catalog
  (``<root>/_lace/types.json``) stores those (:meth:`EventType.catalog_json`, :meth:`EventType.from_catalog`),
  and its Arrow and Delta shapes are made in ``archive/schema.py``;
* the service stores it as a database row and shows it in the REST API; both shapes are converted to and from
  this class in one module, ``service/event_type.py``; ingest validates events against it
  (``service/live/events.py``).

A field added to the event type is added here, and to the row and the API shape in ``service/event_type.py``.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any, Literal, cast, get_args

AttrType = Literal["string", "int", "float", "bool", "timestamp"]
"""The kind of an attribute; a ``timestamp`` value is int microseconds UTC in events."""
ATTR_TYPES: tuple[str, ...] = get_args(AttrType)
RESERVED = frozenset({"id", "ts", "type", "date", "ingested_at", "ingest_seq", "ts_end", "duration"})
"""Names no attribute may take: the event header and the archive's own columns."""
NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")


class SchemaError(ValueError):
    """An invalid event type, an incompatible schema change, or events that do not fit their type."""


@dataclass(frozen=True)
class EventType:
    """A registered event type (a stream).

    Parameters
    ----------
    name : str
        Type name (``[A-Za-z][A-Za-z0-9_]*``); also the name of its Delta table directory in the archive.
    attributes : Mapping[str, AttrType]
        Attribute name -> ``string | int | float | bool | timestamp``, in column order.
    partition_key : str, optional
        The attribute archive requests select by (e.g. a sensor id); None: requests on this type select by
        time only.
    interval : bool
        An interval type (issue 15): its events carry ``ts_end`` > ``ts`` (a ``ts_end`` column in the archive);
        its watermark runs on ``ts_end``. It cannot change once registered.
    defaults : Mapping[str, Any]
        Optional attributes -> the value an event without one (or with ``null``) gets; a ``None`` default leaves
        it missing. Attributes not listed are required. Keyword only, like every field below.
    lateness_us : int
        Allowed lateness, microseconds: an event more than this behind the type's newest event is late.
    max_duration_us : int | None
        An interval type's longest event (``ts_end - ts``), microseconds; longer ones are refused. It bounds how
        long a partial match waits on an interval that started long ago (None: no bound).
    derived : bool
        Made by ``EMIT INTO`` (issue 24): its events come from statements only; producers cannot post it.
    ended : bool
        Its stream ended (``POST /event-types/{name}/end``): its watermark is the end of time and no event of it
        is taken again.
    end_ts_us : int | None
        Its newest event time when it ended, int microseconds UTC (None: not ended, or it had sent nothing).

    Raises
    ------
    SchemaError
        A malformed type name or attribute name, a reserved attribute name (:data:`RESERVED`), an unknown
        attribute kind, or a partition key that is not an attribute.

    Examples
    --------
    >>> t = EventType("traffic", {"key": "string", "speed": "int"}, "key")
    >>> t.evolve(EventType("traffic", {"status": "string"})).attributes
    {'key': 'string', 'speed': 'int', 'status': 'string'}
    """

    name: str
    attributes: Mapping[str, AttrType] = field(default_factory=dict)
    partition_key: str | None = None
    _: KW_ONLY
    interval: bool = False
    defaults: Mapping[str, Any] = field(default_factory=dict)
    lateness_us: int = 0
    max_duration_us: int | None = None
    derived: bool = False
    ended: bool = False
    end_ts_us: int | None = None

    def __post_init__(self) -> None:
        if not NAME_RE.match(self.name):
            raise SchemaError(f"event type name {self.name!r} must match {NAME_RE.pattern}")
        object.__setattr__(self, "attributes", dict(self.attributes))
        object.__setattr__(self, "defaults", dict(self.defaults))
        for attr, kind in self.attributes.items():
            if attr in RESERVED:
                reserved = ", ".join(sorted(RESERVED))
                raise SchemaError(f"type {self.name}: attribute name {attr!r} is reserved ({reserved})")
            if not NAME_RE.match(attr):
                raise SchemaError(f"type {self.name}: attribute name {attr!r} must match {NAME_RE.pattern}")
            if kind not in ATTR_TYPES:
                raise SchemaError(f"type {self.name}: attribute {attr!r} has unknown type {kind!r}")
        if self.partition_key is not None and self.partition_key not in self.attributes:
            raise SchemaError(f"type {self.name}: key {self.partition_key!r} is not an attribute")

    def evolve(self, newer: EventType) -> EventType:
        """This type with the new attributes of ``newer`` appended (schema evolution); every other field is
        ``newer``'s (the partition key stays this type's when ``newer`` has none).

        Raises
        ------
        SchemaError
            When ``newer`` is another type, changes point to interval or back, changes the type of an existing
            attribute, or changes the partition key.
        """
        if newer.name != self.name:
            raise SchemaError(f"cannot evolve type {self.name} with type {newer.name}")
        if newer.interval != self.interval:
            kinds = ("a point type", "an interval type")
            raise SchemaError(f"type {self.name} is {kinds[self.interval]}, cannot make it {kinds[newer.interval]}")
        old_key, new_key = self.partition_key, newer.partition_key
        if new_key is not None and old_key is not None and new_key != old_key:
            raise SchemaError(
                f"type {self.name}: key is {old_key!r}, cannot change it to {new_key!r}"
            )
        merged = dict(self.attributes)
        for attr, kind in newer.attributes.items():
            if attr in merged and merged[attr] != kind:
                raise SchemaError(f"type {self.name}: attribute {attr!r} is {merged[attr]}, cannot change it to {kind}")
            merged[attr] = kind
        return replace(newer, attributes=merged, partition_key=old_key if new_key is None else new_key)

    def catalog_json(self) -> dict[str, Any]:
        """The archive catalog's form: ``{"attributes": {...}, "key": str | None[, "interval": true]}``."""
        out: dict[str, Any] = {"attributes": dict(self.attributes), "key": self.partition_key}
        if self.interval:
            out["interval"] = True
        return out

    @classmethod
    def from_catalog(cls, name: str, doc: Mapping[str, Any]) -> EventType:
        """The type ``name`` from its :meth:`catalog_json` form (the service's fields take their defaults).

        Raises
        ------
        SchemaError
            When the stored type is not valid (see the class).
        """
        attrs = cast("dict[str, AttrType]", dict(doc["attributes"]))
        return cls(name, attrs, doc.get("key"), interval=bool(doc.get("interval", False)))


def schema(types: Iterable[EventType]) -> dict[str, dict[str, str]]:
    """The attribute kinds by type name (:data:`engine.lql.ast.Schema`) that the LQL compiler checks against."""
    return {t.name: dict(t.attributes) for t in types}
