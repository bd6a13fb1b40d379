"""Archive requests: keys and unions of time ranges, merged into disjoint intervals.

A range is half-open ``[lo, hi)`` in int microseconds UTC. A request maps a key (or
None: any key) to its disjoint, sorted intervals; each event matches at most one
interval of its key, so a range join over a request never duplicates an event.
"""
from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

    from engine.event_type import EventType

Range = tuple[int, int]
Ranges = Sequence[Range] | Mapping[Hashable, Sequence[Range]]
Request = dict[Hashable, list[Range]]


def merge_ranges(ranges: Iterable[Range]) -> list[Range]:
    """Sorted disjoint intervals covering the union of ``ranges`` (empty ones dropped).

    Overlapping and touching intervals merge:

    >>> merge_ranges([(5, 9), (0, 3), (3, 4), (8, 12), (20, 20)])
    [(0, 4), (5, 12)]
    """
    out: list[list[int]] = []
    for lo, hi in sorted((int(lo), int(hi)) for lo, hi in ranges):
        if hi <= lo:
            continue
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def make_request(keys: Iterable[Hashable] | None, ranges: Ranges) -> Request:
    """Normalize ``(keys, ranges)`` to ``{key: merged intervals}``; key None means any key.

    ``ranges`` is either one union of ranges for every key, or a mapping key -> ranges
    (then ``keys``, when given, restricts it).

    >>> make_request(["a", "b"], [(0, 10), (5, 20)])
    {'a': [(0, 20)], 'b': [(0, 20)]}
    >>> make_request(None, {"a": [(0, 1)], "b": [(3, 3)]})
    {'a': [(0, 1)]}
    >>> make_request(None, [(0, 5)])
    {None: [(0, 5)]}
    """
    if isinstance(ranges, Mapping):
        wanted = None if keys is None else set(keys)
        req = {k: merge_ranges(v) for k, v in ranges.items() if wanted is None or k in wanted}
    elif keys is None:
        req = {None: merge_ranges(ranges)}
    else:
        merged = merge_ranges(ranges)
        req = {k: list(merged) for k in dict.fromkeys(keys)}
    return {k: v for k, v in req.items() if v}


def hull(request: Request) -> Range | None:
    """The smallest range covering every interval of ``request`` (None when empty)."""
    los = [r[0][0] for r in request.values() if r]
    his = [r[-1][1] for r in request.values() if r]
    return (min(los), max(his)) if los else None


def time_union(request: Request) -> list[Range]:
    """Every interval of ``request`` whatever its key, merged."""
    return merge_ranges(r for rs in request.values() for r in rs)


def in_ranges(ts: np.ndarray, ranges: Sequence[Range]) -> np.ndarray:
    """Boolean mask: ``ts[i]`` lies in one of the sorted disjoint ``ranges``.

    >>> in_ranges(np.array([0, 4, 5, 11, 12]), [(0, 4), (5, 12)]).tolist()
    [True, False, True, True, False]
    """
    if not ranges:
        return np.zeros(len(ts), dtype=bool)
    los = np.fromiter((r[0] for r in ranges), dtype=np.int64, count=len(ranges))
    his = np.fromiter((r[1] for r in ranges), dtype=np.int64, count=len(ranges))
    idx = np.searchsorted(los, ts, side="right") - 1
    ok = idx >= 0
    out = np.zeros(len(ts), dtype=bool)
    out[ok] = ts[ok] < his[idx[ok]]
    return out


def request_mask(etype: EventType, table: pa.Table, request: Request) -> np.ndarray:
    """Boolean mask of the rows of a record-shaped ``table`` of ``etype`` in ``request``: by key and by end
    (``ts_end`` of an interval type, else ``ts``); see :func:`rows_in`.

    Raises
    ------
    ValueError
        When ``request`` is by key and ``etype`` has no partition key.
    """
    import pyarrow as pa

    ts = table.column("ts_end" if etype.interval else "ts").cast(pa.int64()).to_numpy()
    if None in request:
        return rows_in(ts, None, request)
    if etype.partition_key is None:
        raise ValueError(f"type {etype.name} has no key attribute: request it by time ranges only")
    return rows_in(ts, table.column(etype.partition_key), request)


def rows_in(ends: np.ndarray, keys: pa.Array | pa.ChunkedArray | None, request: Request) -> np.ndarray:
    """Boolean mask of the rows whose end (``ends``, int64 us) lies in the ranges ``request`` gives their key
    (``keys``, the rows' key values, typed like ``request``'s keys; None with a ``{None: ranges}`` request).

    Vectorized over rows: each row's key is looked up once, then compared with the n-th interval of its key
    for n up to the most intervals a key has (or, when that is more than the keys, key by key).

    Raises
    ------
    ValueError
        When ``request`` is by key and ``keys`` is None.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if None in request:
        return in_ranges(ends, request[None])
    if keys is None:
        raise ValueError("a request by key needs the rows' keys")
    slot = pc.fill_null(pc.index_in(keys, value_set=pa.array(list(request), type=keys.type)), -1).to_numpy()
    ts = ends
    out = np.zeros(len(ends), dtype=bool)
    found = slot >= 0
    per_key = list(request.values())
    most = max(len(rs) for rs in per_key)
    if most > len(per_key):
        for i, rs in enumerate(per_key):
            rows = np.flatnonzero(slot == i)
            if rows.size:
                out[rows] = in_ranges(ts[rows], rs)
        return out
    rows, row_ts, row_slot = np.flatnonzero(found), ts[found], slot[found]
    hit = np.zeros(rows.size, dtype=bool)
    for n in range(most):  # the n-th interval of every key (empty where a key has fewer)
        los = np.array([rs[n][0] if n < len(rs) else 0 for rs in per_key], dtype=np.int64)
        his = np.array([rs[n][1] if n < len(rs) else 0 for rs in per_key], dtype=np.int64)
        hit |= (row_ts >= los[row_slot]) & (row_ts < his[row_slot])
    out[rows] = hit
    return out


class KeyIndex:
    """The rows of one table grouped by key, each key's rows ordered by end: the rows of many requests over the
    same rows, each in ``O(ranges * log n + rows answered)`` instead of :func:`rows_in`'s ``O(n)`` per request
    (issue 25: a shared read answers dozens of one query's requests from one union of rows).

    Parameters
    ----------
    ends : numpy.ndarray
        The rows' ends, int64 microseconds UTC.
    keys : pyarrow.Array or pyarrow.ChunkedArray
        The rows' key values (a null key is in no request).

    >>> import pyarrow as pa
    >>> ends, keys = np.array([5, 1, 7, 3, 9]), pa.array(["a", "b", "a", None, "b"])
    >>> ix = KeyIndex(ends, keys)
    >>> ix.rows({"a": [(0, 6)], "b": [(0, 2), (8, 10)], "c": [(0, 99)]}).tolist()
    [0, 1, 4]
    >>> bool((ix.rows({"a": [(0, 99)]}) == np.flatnonzero(rows_in(ends, keys, {"a": [(0, 99)]}))).all())
    True
    """

    def __init__(self, ends: np.ndarray, keys: pa.Array | pa.ChunkedArray) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        flat = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
        enc = pc.dictionary_encode(flat)
        codes = pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
        self._code = {v: i for i, v in enumerate(enc.dictionary.to_pylist())}
        self._order = np.lexsort((ends, codes))  # by key code, then by end (stable: row order among equal ends)
        self._ends = ends[self._order]
        self._starts = np.searchsorted(codes[self._order], np.arange(len(self._code) + 1), side="left")

    def rows(self, request: Request) -> np.ndarray:
        """Ascending row numbers (int64) of the rows whose end lies in the ranges ``request`` gives their key
        (keys typed like the index's key values; ranges half-open; a key's ranges may overlap)."""
        parts: list[np.ndarray] = []
        for k, rs in request.items():
            c = self._code.get(k)
            if c is None:
                continue
            a, b = int(self._starts[c]), int(self._starts[c + 1])
            seg = self._ends[a:b]
            for lo, hi in rs:
                i, j = np.searchsorted(seg, lo, side="left"), np.searchsorted(seg, hi, side="left")
                if i < j:
                    parts.append(self._order[a + i : a + j])
        if not parts:
            return np.zeros(0, dtype=np.int64)
        return np.unique(np.concatenate(parts))
