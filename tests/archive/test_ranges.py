"""KeyIndex (issue 25: a shared read cut per request by binary search) against rows_in, the one-pass mask."""
from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from archive.ranges import KeyIndex, rows_in


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("kind", ["string", "int"])
def test_key_index_answers_every_request_as_rows_in(seed: int, kind: str) -> None:
    """Random rows (repeated ends, null keys, chunked keys) and random requests (keys absent from the rows,
    overlapping and empty ranges, ranges past every end): the same rows, ascending."""
    rng = random.Random(seed)
    n = 2_000
    ends = np.array([rng.randrange(0, 500) for _ in range(n)], dtype=np.int64)
    values = [None if rng.random() < 0.05 else rng.randrange(30) for _ in range(n)]
    if kind == "string":
        values = [None if v is None else f"k{v}" for v in values]
    keys = pa.chunked_array([pa.array(values[:700]), pa.array(values[700:])])
    index = KeyIndex(ends, keys)
    for _ in range(200):
        request = {}
        for k in rng.sample(range(40), rng.randrange(1, 12)):  # 30-39: keys no row has
            ranges = []
            for _ in range(rng.randrange(0, 4)):
                lo = rng.randrange(-50, 600)
                ranges.append((lo, lo + rng.randrange(0, 200)))
            request[f"k{k}" if kind == "string" else k] = ranges
        want = np.flatnonzero(rows_in(ends, keys, {k: sorted(rs) for k, rs in request.items()}) if all(
            _disjoint(rs) for rs in request.values()) else _mask(ends, values, request))
        assert index.rows(request).tolist() == want.tolist()


def _disjoint(ranges: list[tuple[int, int]]) -> bool:
    rs = sorted(ranges)
    return all(a[1] <= b[0] for a, b in zip(rs, rs[1:]))


def _mask(ends: np.ndarray, values: list[object], request: dict) -> np.ndarray:
    """rows_in takes disjoint ranges only: the overlapping case by the definition, row by row."""
    return np.array([v in request and any(lo <= t < hi for lo, hi in request[v]) for t, v in zip(ends, values)])
