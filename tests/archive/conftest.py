"""Fixtures of the archive tests: ONE Spark session for the whole run, and a fresh archive root."""
from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession of the test run (local[2], warmed), shared by every ``spark`` test."""
    if shutil.which("java") is None:
        pytest.skip("Spark tests need Java 17 on PATH (apt-get install openjdk-17-jre-headless)")
    from archive.spark import SparkSettings, get_spark, stop_spark

    session = get_spark(SparkSettings(master="local[2]", app_name="lace-tests"))
    yield session
    stop_spark()


@pytest.fixture
def archive_root(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "archive"
    root.mkdir()
    yield root
