"""Events: the unit of every stream (docs/architecture.md section 7.3)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Event:
    """One event ``(id, type, ts, attrs, ts_end)``: a point event, or an interval event ``[ts, ts_end)``.

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
    ts_end : int, optional
        End of an interval event (exclusive), int microseconds UTC; ``ts_end > ts`` for an event of
        an interval type (checked where events enter: files, REST). Default ``ts``: a point event is
        the interval ``[ts, ts]`` (issue 15; Allen's relations, docs/semantics.md section 8).

    Events are treated as immutable by the engine: it never changes them.
    ``get("ts")``, ``get("id")``, ``get("type")``, ``get("ts_end")`` and ``get("duration")``
    (``ts_end - ts``) read the header fields. The matcher orders events on ``(ts_end, id)``, which is
    ``(ts, id)`` for point events: an interval event is complete at its end.
    """

    __slots__ = ("id", "type", "ts", "attrs", "ts_end")

    # The defaults of id, type and ts serve only the slot-state pickles written before __reduce__: unpickling one
    # calls ``Event.__new__(Event)``, which in the compiled build (issue 45) runs __init__ without arguments; the
    # pickle then sets every slot (tests/engine/test_pickles.py).
    def __init__(
        self, id: int = 0, type: str = "", ts: int = 0, attrs: dict[str, Any] | None = None, ts_end: int | None = None
    ) -> None:
        self.id = id
        self.type = type
        self.ts = ts
        self.attrs = attrs if attrs is not None else {}
        self.ts_end = ts if ts_end is None else ts_end

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its constructor's arguments (a point event without ``ts_end``): about 2/3 of the size and
        time of the default for slotted objects, which names every slot in every pickle. Events cross process
        boundaries by pickle (query processes, Spark's Python workers, ``lace stream``'s tables)."""
        if self.ts_end == self.ts:
            return self.__class__, (self.id, self.type, self.ts, self.attrs)
        return self.__class__, (self.id, self.type, self.ts, self.attrs, self.ts_end)

    def get(self, attr: str) -> Any:
        """Value of ``attr``; header fields ``ts``, ``id``, ``type`` first. Missing -> None."""
        if attr == "ts":
            return self.ts
        if attr == "id":
            return self.id
        if attr == "type":
            return self.type
        if attr == "ts_end":
            return self.ts_end
        if attr == "duration":
            return self.ts_end - self.ts
        return self.attrs.get(attr)

    def __setstate__(self, state: Any) -> None:
        """Loads the slot-state pickles written before :meth:`__reduce__`: ``(None, {slot: value})``."""
        for name, value in state[1].items():
            setattr(self, name, value)

    @property
    def is_interval(self) -> bool:
        """True for an interval event (``ts_end > ts``)."""
        return self.ts_end != self.ts

    def order_key(self) -> tuple[int, int]:
        """The processing order: ``(ts_end, id)`` (``(ts, id)`` for a point event)."""
        return (self.ts_end, self.id)

    def __repr__(self) -> str:
        end = "" if self.ts_end == self.ts else f", ts_end={self.ts_end}"
        return f"Event(id={self.id}, type={self.type!r}, ts={self.ts}, attrs={self.attrs!r}{end})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Event)
            and self.id == other.id
            and self.type == other.type
            and self.ts == other.ts
            and self.ts_end == other.ts_end
            and self.attrs == other.attrs
        )

    def __hash__(self) -> int:
        return hash((self.id, self.type, self.ts))


def make_events(
    first_id: int,
    ids: list[int] | None,
    types: list[str],
    ts: list[int],
    attrs: list[dict[str, Any]],
    ends: list[int] | None = None,
) -> list[Event]:
    """Events from columns of Python values, one per row: what ``list(map(Event, ids, types, ts, attrs[, ends]))``
    gives, made by a loop that the compiled build (issue 45) runs natively (:mod:`engine.event_table`'s batches).

    Parameters
    ----------
    first_id : int
        The id of the first event when ``ids`` is None (then ids run ``first_id, first_id + 1, ...``).
    ids : list[int] or None
        Event ids, or None.
    types : list[str]
        Event types; their length is the number of events.
    ts : list[int]
        Event times, int microseconds UTC, as long as ``types``.
    attrs : list[dict]
        Each event's attributes (the dicts are the events' own, not copied), as long as ``types``.
    ends : list[int] or None
        ``ts_end`` of each event (int microseconds UTC; ``ts`` for a point event), or None: point events.

    Returns
    -------
    list[Event]
        In row order. IndexError when a column is shorter than ``types``.
    """
    out: list[Event] = []
    n = len(types)
    if ends is None:
        if ids is None:
            for i in range(n):
                out.append(Event(first_id + i, types[i], ts[i], attrs[i]))
        else:
            for i in range(n):
                out.append(Event(ids[i], types[i], ts[i], attrs[i]))
        return out
    for i in range(n):
        out.append(Event(first_id + i if ids is None else ids[i], types[i], ts[i], attrs[i], ends[i]))
    return out


def make_events_from_columns(
    first_id: int,
    ids: list[int] | None,
    types: list[str],
    ts: list[int],
    names: tuple[str, ...],
    columns: list[list[Any]],
) -> list[Event] | None:
    """Point events with their attribute dicts built from columns: what :func:`make_events` gives for
    ``attrs = [dict(zip(names, row)) for row in zip(*columns)]``, each dict a display made natively by the compiled
    build (issue 45); None for more than 4 columns (the caller builds the dicts).

    Parameters
    ----------
    first_id, ids, types, ts
        As for :func:`make_events`.
    names : tuple[str, ...]
        The attribute names, one per column (1 to 4).
    columns : list[list]
        Each attribute's values, as long as ``types``.

    Returns
    -------
    list[Event] or None
        In row order; None when ``len(columns)`` is not 1 to 4. IndexError when a column is shorter than ``types``.
    """
    out: list[Event] = []
    n = len(types)
    k = len(columns)
    if k == 1:
        (k0,) = names
        c0 = columns[0]
        for i in range(n):
            out.append(Event(first_id + i if ids is None else ids[i], types[i], ts[i], {k0: c0[i]}))
    elif k == 2:
        k0, k1 = names
        c0, c1 = columns
        for i in range(n):
            out.append(Event(first_id + i if ids is None else ids[i], types[i], ts[i], {k0: c0[i], k1: c1[i]}))
    elif k == 3:
        k0, k1, k2 = names
        c0, c1, c2 = columns
        for i in range(n):
            attrs = {k0: c0[i], k1: c1[i], k2: c2[i]}
            out.append(Event(first_id + i if ids is None else ids[i], types[i], ts[i], attrs))
    elif k == 4:
        k0, k1, k2, k3 = names
        c0, c1, c2, c3 = columns
        for i in range(n):
            attrs = {k0: c0[i], k1: c1[i], k2: c2[i], k3: c3[i]}
            out.append(Event(first_id + i if ids is None else ids[i], types[i], ts[i], attrs))
    else:
        return None
    return out


def attr_getter(attr: str) -> Callable[[Event], Any]:
    """``event -> value`` of attribute ``attr`` as :meth:`Event.get` reads it (header fields ``ts``, ``id``,
    ``type``, ``ts_end``, ``duration`` first; a missing attribute is None), specialised once per attribute:
    the one getter of the matcher, the live-and-archived plan and the rule index."""
    if attr == "ts":
        return lambda e: e.ts
    if attr == "id":
        return lambda e: e.id
    if attr == "type":
        return lambda e: e.type
    if attr == "ts_end":
        return lambda e: e.ts_end
    if attr == "duration":
        return lambda e: e.ts_end - e.ts
    return lambda e: e.attrs.get(attr)


MICROS_PER_MS = 1_000
MICROS_PER_S = 1_000_000
MIN_TS_US = -62_135_596_800_000_000
"""0001-01-01T00:00:00Z: the earliest timestamp the archive (Delta, Spark, Arrow dates) can store."""
MAX_TS_US = 253_402_300_799_999_999
"""9999-12-31T23:59:59.999999Z: the latest timestamp the archive can store."""
END_OF_TIME = (1 << 63) - 1
"""The watermark after the end of input (an ended stream, a flush): every event time has passed."""
