"""Events: the unit of every stream (DESIGN.md section 3)."""
from __future__ import annotations

from typing import Any


class Event:
    """One event ``(id, type, ts, attrs)``.

    Parameters
    ----------
    id : int
        int64, strictly increasing in arrival order unless the producer gave one;
        breaks ties between equal ``ts``.
    type : str
        The event type (stream) name.
    ts : int
        Event time, int microseconds since the Unix epoch, UTC.
    attrs : dict
        Attribute name -> value (str, int, float, bool, or int microseconds for timestamps).

    Events are treated as immutable by the engine: it never changes them.
    ``get("ts")``, ``get("id")`` and ``get("type")`` read the header fields.
    """

    __slots__ = ("id", "type", "ts", "attrs")

    def __init__(self, id: int, type: str, ts: int, attrs: dict[str, Any] | None = None) -> None:
        self.id = id
        self.type = type
        self.ts = ts
        self.attrs = attrs if attrs is not None else {}

    def get(self, attr: str) -> Any:
        """Value of ``attr``; header fields ``ts``, ``id``, ``type`` first. Missing -> None."""
        if attr == "ts":
            return self.ts
        if attr == "id":
            return self.id
        if attr == "type":
            return self.type
        return self.attrs.get(attr)

    def order_key(self) -> tuple[int, int]:
        """The processing order: ``(ts, id)``."""
        return (self.ts, self.id)

    def __repr__(self) -> str:
        return f"Event(id={self.id}, type={self.type!r}, ts={self.ts}, attrs={self.attrs!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Event)
            and self.id == other.id
            and self.type == other.type
            and self.ts == other.ts
            and self.attrs == other.attrs
        )

    def __hash__(self) -> int:
        return hash((self.id, self.type, self.ts))


MICROS_PER_MS = 1_000
MICROS_PER_S = 1_000_000
MIN_TS_US = -62_135_596_800_000_000
"""0001-01-01T00:00:00Z: the earliest timestamp the archive (Delta, Spark, Arrow dates) can store."""
MAX_TS_US = 253_402_300_799_999_999
"""9999-12-31T23:59:59.999999Z: the latest timestamp the archive can store."""
