"""Rebuild the demo's data slices from the shared datasets (run from the repository root).

    python cli/demo_data/make_slices.py [/path/to/shared/data]

The slices are committed; this script only documents how they were cut:
- ``traffic_slice.csv``: the Aarhus traffic slice (40 segments, 2 weeks of 5-minute readings) as
  ``id,type,ts,key,avg_speed,vehicle_count,ndt_kmh`` (ndt_kmh: the segment's normal driving speed
  from the sensor metadata), ts in epoch ms.
- ``bars_1m.csv``: 1-minute trade bars of AIG, BAC, IBM and SPY, 2013-10-07 .. 2013-10-11
  (regular session), as ``id,type,ts,key,open,high,low,close,volume``.
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent


def main(shared: Path) -> None:
    ndt = {}
    with open(shared / "aarhus" / "traffic_sensors_slice.csv", newline="") as f:
        for row in csv.DictReader(f):
            ndt[row["REPORT_ID"]] = row["NDT_IN_KMH"]
    with open(shared / "aarhus" / "aarhus_traffic_slice.csv", newline="") as f, open(
        HERE / "traffic_slice.csv", "w", newline=""
    ) as out:
        w = csv.writer(out)
        w.writerow(["id", "type", "ts", "key", "avg_speed", "vehicle_count", "ndt_kmh"])
        for i, row in enumerate(csv.DictReader(f), start=1):
            w.writerow(
                [i, "traffic", row["ts_ms"], row["key"], row["avg_speed"], row["vehicle_count"], ndt[row["key"]]]
            )
    t = pq.read_table(shared / "equity" / "lean_trade_bars_1m.parquet")
    lo, hi = 1381118400000, 1381550400000  # 2013-10-07 00:00 .. 2013-10-12 00:00 New York
    mask = pc.and_(
        pc.and_(pc.greater_equal(t["ts_ms"], lo), pc.less(t["ts_ms"], hi)),
        pc.and_(pc.is_in(t["key"], pc.cast(["AIG", "BAC", "IBM", "SPY"], t["key"].type)), t["regular_session"]),
    )
    rows = t.filter(mask).sort_by([("ts_ms", "ascending"), ("key", "ascending")]).to_pylist()
    with open(HERE / "bars_1m.csv", "w", newline="") as out:
        w = csv.writer(out)
        w.writerow(["id", "type", "ts", "key", "open", "high", "low", "close", "volume"])
        for i, r in enumerate(rows, start=1):
            w.writerow([i, "bar", r["ts_ms"], r["key"], r["open"], r["high"], r["low"], r["close"], r["volume"]])


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[3] / "shared" / "data")
