"""The archive files kept decoded (archive.decoded_files, issue 43), without Spark: rows selected as a filtered scan
selects them, null keys never wanted, a column a file lacks read as nulls, and the byte budget kept."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from archive.decoded_files import DecodedFiles, cache_bytes_from_env

SCHEMA = pa.schema([("id", pa.int64()), ("ts", pa.int64()), ("key", pa.string()), ("v", pa.float64())])


def _write(path, n: int, first_ts: int, *, with_v: bool = True) -> str:
    keys = [None if i % 7 == 0 else f"k{i % 5}" for i in range(n)]
    cols = {"id": list(range(first_ts, first_ts + n)), "ts": [first_ts + 10 * i for i in range(n)], "key": keys}
    if with_v:
        cols["v"] = [float(i) for i in range(n)]
    pq.write_table(pa.table(cols), path)
    return str(path)


def _scan(paths, span, keys):
    where = (ds.field("ts") >= span[0]) & (ds.field("ts") < span[1])
    if keys is not None:
        where &= ds.field("key").isin(pa.array(keys, type=pa.string()))
    return ds.dataset(paths, schema=SCHEMA, format="parquet").to_table(filter=where)


def test_selected_rows_are_a_filtered_scans_and_files_are_decoded_once(tmp_path):
    paths = [_write(tmp_path / "a.parquet", 300, 0), _write(tmp_path / "b.parquet", 200, 5_000, with_v=False)]
    files = DecodedFiles(1 << 30)
    for span, keys in [((0, 10_000), ["k1", "k3"]), ((2_000, 6_000), None), ((0, 1), ["k0"]), ((0, 10_000), [])]:
        got = files.select(paths, SCHEMA, "ts", "key", span, keys)
        assert got.to_pylist() == _scan(paths, span, keys).to_pylist(), (span, keys)
    assert (files.misses, files.hits) == (2, 6)
    assert None not in files.select(paths, SCHEMA, "ts", "key", (0, 10_000), ["k1"]).column("key").to_pylist()
    assert set(files.select(paths, SCHEMA, "ts", None, (5_000, 10_000), None).column("v").to_pylist()) == {None}


def test_the_budget_drops_the_least_recently_used_and_keeps_no_file_larger_than_itself(tmp_path):
    paths = [_write(tmp_path / f"{i}.parquet", 500, 10_000 * i) for i in range(3)]
    one = DecodedFiles(1 << 30).get(paths[0], SCHEMA, "ts", "key").nbytes
    files = DecodedFiles(2 * one + one // 2)  # room for two
    for p in paths:
        files.get(p, SCHEMA, "ts", "key")
    assert files.nbytes == 2 * one and files.misses == 3
    files.get(paths[2], SCHEMA, "ts", "key")
    assert files.hits == 1
    files.get(paths[0], SCHEMA, "ts", "key")  # the oldest was dropped: decoded again
    assert files.misses == 4
    tiny = DecodedFiles(one - 1)
    assert tiny.get(paths[0], SCHEMA, "ts", "key").table.num_rows == 500 and tiny.nbytes == 0


def test_a_bad_budget_names_the_setting():
    assert cache_bytes_from_env({}) == 256 << 20 and cache_bytes_from_env({"LACE_ARCHIVE_CACHE_MB": "0"}) == 0
    with pytest.raises(ValueError, match="LACE_ARCHIVE_CACHE_MB must be a number of MiB, not 'x'"):
        cache_bytes_from_env({"LACE_ARCHIVE_CACHE_MB": "x"})
