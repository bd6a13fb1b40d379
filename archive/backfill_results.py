"""The results table of backfills (:mod:`archive.backfill`; docs/architecture.md section 7.11): the matches of
every backfill, appended with delta-rs to the Delta table ``<root>/_backfills/results``
(:data:`RESULTS_SCHEMA`: query, the service's query id, backfill id, match, start and end in int microseconds
UTC, created_at), partitioned by ``backfill_id``; read back with delta-rs, no Spark.
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa

RESULTS_DIR = "_backfills/results"
RESULTS_SCHEMA = pa.schema(
    [
        pa.field("query", pa.string()),
        pa.field("query_id", pa.int64()),
        pa.field("backfill_id", pa.string()),
        pa.field("match", pa.string()),
        pa.field("start", pa.int64()),
        pa.field("end", pa.int64()),
        pa.field("created_at", pa.timestamp("us", tz="UTC")),
    ]
)


def write_results_table(root: str | Path, backfill_id: str, table: pa.Table, *, query_id: int | None = None) -> str:
    """Append match rows (query, match, start, end) to ``<root>/_backfills/results`` with delta-rs.

    The table is partitioned by ``backfill_id`` (one backfill's rows are read without the others');
    ``query_id`` is the service's id of the query (None from ``lace backfill``).
    """
    from datetime import UTC, datetime

    from deltalake import DeltaTable, write_deltalake

    n = table.num_rows
    now = datetime.now(UTC)
    rows = pa.table(
        {
            "query": table.column("query").cast(pa.string()),
            "query_id": pa.array([query_id] * n, pa.int64()),
            "backfill_id": pa.array([backfill_id] * n, pa.string()),
            "match": table.column("match"),
            "start": table.column("start"),
            "end": table.column("end"),
            "created_at": pa.array([now] * n, pa.timestamp("us", tz="UTC")),
        },
        schema=RESULTS_SCHEMA,
    )
    uri = str(Path(root) / RESULTS_DIR)
    Path(uri).mkdir(parents=True, exist_ok=True)
    partitioned = not DeltaTable.is_deltatable(uri) or DeltaTable(uri).metadata().partition_columns == ["backfill_id"]
    write_deltalake(uri, rows, mode="append", partition_by=["backfill_id"] if partitioned else None)
    return uri


def read_results(root: str | Path, backfill_id: str | None = None) -> pa.Table:
    """The results table (optionally one backfill's rows), read with delta-rs."""
    from deltalake import DeltaTable

    uri = str(Path(root) / RESULTS_DIR)
    if not DeltaTable.is_deltatable(uri):
        return RESULTS_SCHEMA.empty_table()
    if backfill_id is None:
        return DeltaTable(uri).to_pyarrow_table()
    return DeltaTable(uri).to_pyarrow_table(filters=[("backfill_id", "=", backfill_id)])
