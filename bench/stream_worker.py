"""The Python side of ``lace stream``'s detection without Spark (issue 26): what a Python worker does per key.

The seed-42 stream's first N events, split by key into the pandas frames Spark hands
:class:`stream.processor.LaceProcessor` (source columns, pickled events), pushed through ``handleInputRows`` with
an in-memory stand-in for the key's ``ValueState`` (its matcher state is still pickled and unpickled, as in Spark),
and each output frame converted to Arrow as Spark's serializer does. Measures the worker's own cost, apart from
Spark's (the JVM, Arrow transfers, the state store, the Delta sink): compare with ``bench.stream``'s detect figure.

    python -m bench.stream_worker --n 100000 --case P1-any
"""
from __future__ import annotations

import argparse
import pickle
import time
from typing import Any


class _Value:
    """A ``ValueState`` kept in memory."""

    def __init__(self, value: Any = None) -> None:
        self.value = value

    def exists(self) -> bool:
        return self.value is not None

    def get(self) -> Any:
        return self.value

    def update(self, value: Any) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


class _Handle:
    def getValueState(self, name: str, schema: Any) -> _Value:  # noqa: N802 - Spark's name
        return _Value()

    def registerTimer(self, ts_ms: int) -> None:  # noqa: N802 - Spark's name
        pass


def main(argv: list[str] | None = None) -> int:
    import pandas as pd
    import pyarrow as pa

    from bench.engine import query_text
    from bench.streams import bench_csv
    from engine.io import open_event_file
    from stream.processor import OUTPUT_SCHEMA, LaceProcessor, output_table

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--case", default="P1-any")
    a = ap.parse_args(argv)
    by_key: dict[str, list[Any]] = {}
    for e in open_event_file(bench_csv(a.n)).events():
        by_key.setdefault(repr(e.attrs["key"]), []).append(e)
    frames = {
        k: pd.DataFrame({"k": k, "et": pd.to_datetime([e.ts for e in v], unit="us", utc=True),
                         "ts": [e.ts for e in v], "id": [e.id for e in v],
                         "ev": [pickle.dumps(e, pickle.HIGHEST_PROTOCOL) for e in v]})
        for k, v in by_key.items()
    }
    schema = output_table([], OUTPUT_SCHEMA).schema  # the output columns' Arrow types, as the stream's tables
    processor = LaceProcessor(query_text(a.case), None, 0)
    t0 = time.perf_counter()
    rows = size = 0
    for k, frame in frames.items():
        processor.init(_Handle())  # type: ignore[arg-type]
        for out in processor.handleInputRows((k,), iter([frame]), None):
            table = pa.Table.from_pandas(out, schema=schema, preserve_index=False)
            rows, size = rows + table.num_rows, size + table.nbytes
    secs = time.perf_counter() - t0
    print(f"{a.case}, {a.n:,} events, {len(frames)} keys: {secs:.2f} s, {a.n / secs:,.0f} events/s, "
          f"{rows:,} output rows, {size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
