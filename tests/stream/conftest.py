"""Fixtures of the ``lace stream`` tests: one Spark session (local[2], RocksDB state store) for the in-process runs,
and the demo's live-only statements over slices of the demo data."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "cli" / "demo_data"


@pytest.fixture(scope="session")
def stream_spark():
    """The SparkSession ``lace stream`` runs on in this process (:func:`stream.job.spark_session`, local[2])."""
    if shutil.which("java") is None:
        pytest.skip("Spark tests need Java 17 on PATH (apt-get install openjdk-17-jre-headless)")
    from archive.spark import native_delta_available, stop_spark
    from stream.job import spark_session

    session = spark_session("local[2]")
    if not native_delta_available(session):
        pytest.skip("lace stream needs the Delta Spark connector (LACE_DELTA_JAR, make delta-jars)")
    yield session
    stop_spark()


@pytest.fixture(scope="session")
def traffic_slice(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 12,000 readings of the demo's traffic slice (a few hours of ~450 road segments)."""
    path = tmp_path_factory.mktemp("demo") / "traffic_12k.csv"
    with open(DEMO / "traffic_slice.csv", encoding="utf-8") as src, open(path, "w", encoding="utf-8") as dst:
        for i, line in enumerate(src):
            if i > 12_000:
                break
            dst.write(line)
    return path
