"""Archive requests: keys and unions of time ranges, merged into disjoint intervals.

A range is half-open ``[lo, hi)`` in int microseconds UTC. A request maps a key (or
None: any key) to its disjoint, sorted intervals; each event matches at most one
interval of its key, so a range join over a request never duplicates an event.
"""
from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np

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
