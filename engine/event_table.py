"""The events of one event file as typed columns, and the :class:`~engine.events.Event` objects made from them
in batches (docs/architecture.md section 7.3; the readers are :mod:`engine.event_files`).

Columns are pyarrow arrays: ids int64, ts and ts_end int64 microseconds UTC, each attribute one type
(:data:`engine.event_files.COLUMN_TYPES`), null = missing (the attribute is left out of the event). Events are
built a batch at a time (:data:`BATCH_ROWS`), with string values interned (one str object per distinct value)
and numbers read through numpy, never through pandas.
"""
from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.events import Event, make_events, make_events_from_columns

BATCH_ROWS = 65_536


class EventTable:
    """The events of one file as typed columns; :meth:`batches` makes :class:`Event` objects.

    Attributes
    ----------
    ids : pa.Array | None
        int64 ids, or None: id = 1-based row number.
    types : pa.Array
        Event types (string, no nulls).
    ts : pa.Array
        int64 microseconds UTC, no nulls.
    attrs : dict[str, pa.Array]
        Attribute -> typed values, null = missing.
    column_types : dict[str, str]
        Attribute -> one of ``engine.event_files.COLUMN_TYPES``.
    ts_end : pa.Array | None
        int64 microseconds UTC, the end of each interval event (null: a point event), or None when
        the file has no ``ts_end`` column; checked ``> ts`` by :func:`engine.event_files.interval_ends`.
    string_fallbacks : list[engine.event_columns.StringFallback]
        CSV columns inferred as string because of a minority of their values (set by the CSV reader).
    """

    def __init__(
        self,
        ids: pa.Array | None,
        types: pa.Array,
        ts: pa.Array,
        attrs: dict[str, pa.Array],
        column_types: dict[str, str],
        ts_end: pa.Array | None = None,
    ) -> None:
        self.ids = ids
        self.types = types
        self.ts = ts
        self.ts_end = ts_end
        self.attrs = {n: a for n, a in attrs.items() if a.null_count < len(a)}  # all-missing: never set
        self.column_types = column_types
        self.string_fallbacks: list[Any] = []

    def __len__(self) -> int:
        return len(self.types)

    def batches(self, rows: int = BATCH_ROWS) -> Iterator[list[Event]]:
        """Events in file order, ``rows`` at a time."""
        # strings as one str object per distinct value (hashed once: cheap dict lookups by type and key)
        types = _Interned(self.types)
        columns = [_Interned(a) if _is_text(a.type) else _Plain(a) for a in self.attrs.values()]
        for lo in range(0, len(self), rows):
            with _gc_paused():
                batch = self._batch(types, columns, lo, min(rows, len(self) - lo))
            yield batch

    def _batch(self, types: _Interned, columns: list[_Plain], lo: int, n: int) -> list[Event]:
        names = tuple(sys.intern(n) for n in self.attrs)  # the matcher's partition-key lookup then hits by identity
        ids = None if self.ids is None else _py_values(self.ids.slice(lo, n))  # None: id = row number
        cols = [c.values(lo, n) for c in columns]
        ts = _py_values(self.ts.slice(lo, n))
        # point events with 1-4 attributes: the dicts made with the events, natively in the compiled build
        batch = None if self.ts_end is not None else make_events_from_columns(lo + 1, ids, types.values(lo, n), ts,
                                                                              names, cols)
        if batch is not None:
            for name, c in zip(names, self.attrs.values()):
                part = c.slice(lo, n)
                if part.null_count:
                    for i in _py_values(pc.indices_nonzero(part.is_null())):
                        del batch[i].attrs[name]
            return batch
        if not cols:
            attrs: list[dict[str, Any]] = [{} for _ in range(n)]
        elif len(cols) in _ATTR_ROWS:
            attrs = _ATTR_ROWS[len(cols)](names, cols)
        else:
            attrs = [dict(zip(names, row)) for row in zip(*cols)]
        for name, c in zip(names, self.attrs.values()):
            part = c.slice(lo, n)
            if part.null_count:
                for i in _py_values(pc.indices_nonzero(part.is_null())):
                    del attrs[i][name]
        ends = None if self.ts_end is None else _py_values(self.ts_end.slice(lo, n))
        return make_events(lo + 1, ids, types.values(lo, n), ts, attrs, ends)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a batch of events is built: they hold no cycles, and each of the
    collections their allocations would start walks the half-built lists of the batch again (more than half
    of the time of building 7.1M Aarhus events, 10.3 -> 4.5 CPU s). Restored as it was (off stays off)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _rows1(k: tuple[str, ...], c: list[list[Any]]) -> list[dict[str, Any]]:
    (k0,) = k
    return [{k0: a} for a in c[0]]


def _rows2(k: tuple[str, ...], c: list[list[Any]]) -> list[dict[str, Any]]:
    k0, k1 = k
    return [{k0: a, k1: b} for a, b in zip(*c)]


def _rows3(k: tuple[str, ...], c: list[list[Any]]) -> list[dict[str, Any]]:
    k0, k1, k2 = k
    return [{k0: a, k1: b, k2: d} for a, b, d in zip(*c)]


def _rows4(k: tuple[str, ...], c: list[list[Any]]) -> list[dict[str, Any]]:
    k0, k1, k2, k3 = k
    return [{k0: a, k1: b, k2: d, k3: e} for a, b, d, e in zip(*c)]


def _rows5(k: tuple[str, ...], c: list[list[Any]]) -> list[dict[str, Any]]:
    k0, k1, k2, k3, k4 = k
    return [{k0: a, k1: b, k2: d, k3: e, k4: f} for a, b, d, e, f in zip(*c)]


def _rows6(k: tuple[str, ...], c: list[list[Any]]) -> list[dict[str, Any]]:
    k0, k1, k2, k3, k4, k5 = k
    return [{k0: a, k1: b, k2: d, k3: e, k4: f, k5: g} for a, b, d, e, f, g in zip(*c)]


# attribute dicts as dict displays (4x faster than dict(zip(names, row)) per row), by column count
_ATTR_ROWS = {1: _rows1, 2: _rows2, 3: _rows3, 4: _rows4, 5: _rows5, 6: _rows6}


_NUMPY_TYPES: dict[pa.DataType, np.dtype[Any]] = {
    pa.int8(): np.dtype(np.int8), pa.int16(): np.dtype(np.int16), pa.int32(): np.dtype(np.int32),
    pa.int64(): np.dtype(np.int64), pa.uint8(): np.dtype(np.uint8), pa.uint16(): np.dtype(np.uint16),
    pa.uint32(): np.dtype(np.uint32), pa.uint64(): np.dtype(np.uint64), pa.float32(): np.dtype(np.float32),
    pa.float64(): np.dtype(np.float64),
}
"""Arrow number types whose values buffer numpy reads as is (little-endian, as Arrow's)."""


def _numpy_view(part: pa.Array) -> np.ndarray[Any, Any] | None:
    """A numpy view of a number array without nulls (None for other arrays): pyarrow's ``to_numpy`` would
    import pandas, 0.2 s of every run."""
    dtype = _NUMPY_TYPES.get(part.type)
    if dtype is None or part.null_count:
        return None
    return np.frombuffer(part.buffers()[1], dtype, len(part), part.offset * dtype.itemsize)


def _py_values(part: pa.Array) -> list[Any]:
    """Python values of an array: numbers without nulls through numpy's ``tolist()`` (a C loop), the rest through
    pyarrow (which keeps ints ints where there are nulls)."""
    view = _numpy_view(part)
    return list(part.to_pylist() if view is None else view.tolist())


class _Plain:
    """A column's Python values, a slice at a time (numbers without a null in the slice through numpy, a C loop:
    ``tolist()`` gives Python ints and floats; the rest through pyarrow)."""

    def __init__(self, values: pa.Array) -> None:
        self.array = values

    def values(self, lo: int, n: int) -> list[Any]:
        part = self.array.slice(lo, n)
        return _py_values(part)


def _is_text(t: pa.DataType) -> bool:
    """A string column, plain or dictionary-encoded (as a Parquet reader with ``read_dictionary`` gives)."""
    return pa.types.is_string(t) or (pa.types.is_dictionary(t) and pa.types.is_string(t.value_type))


class _Interned(_Plain):
    """A string column dictionary-encoded once (or as given, already encoded): one str object per distinct
    value (hashed once, so the matcher's dict lookups by type and partition key are cheap)."""

    def __init__(self, values: pa.Array) -> None:
        enc = values if pa.types.is_dictionary(values.type) else pc.dictionary_encode(values)
        words = np.empty(len(enc.dictionary) + 1, dtype=object)
        words[:-1] = enc.dictionary.to_pylist()  # the last: None, for the nulls
        self.words = words
        super().__init__(enc.indices.fill_null(len(words) - 1) if enc.null_count else enc.indices)

    def values(self, lo: int, n: int) -> list[Any]:
        part = self.array.slice(lo, n)
        view = _numpy_view(part)
        return list(self.words[part.to_pylist() if view is None else view].tolist())
