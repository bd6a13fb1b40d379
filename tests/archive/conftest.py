"""Fixtures of the archive tests: ONE Spark session for the whole run, and a fresh archive root."""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession of the test run (local[2], warmed), shared by every ``spark`` test.

    Built from the environment's settings (the Delta Spark connector of ``make delta-jars`` by default),
    so the archive, backfill and live-and-archived tests read through the ``native`` reader where the
    connector is there. Under CI (``CI`` set) its absence fails the run instead of falling back.
    """
    if shutil.which("java") is None:
        pytest.skip("Spark tests need Java 17 on PATH (apt-get install openjdk-17-jre-headless)")
    from dataclasses import replace

    from archive.spark import SparkSettings, get_spark, native_delta_available, reader_choice, stop_spark

    settings = replace(SparkSettings.from_env(), master="local[2]", app_name="lace-tests")
    session = get_spark(settings)
    if os.environ.get("CI") and not native_delta_available(session):
        pytest.fail(f"CI runs the archive tests on the native Delta reader, but: {reader_choice(settings)[1]}")
    yield session
    stop_spark()


@pytest.fixture
def archive_root(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "archive"
    root.mkdir()
    yield root


@pytest.fixture(params=["native", "filelist"])
def reader_backend(request: pytest.FixtureRequest, spark, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both archive readers, for the tests that must give the same rows on each (issue 23).

    Every request of these tests is a Spark job (``LACE_ARCHIVE_LOCAL_READ_MB=0``): small requests would
    otherwise be read without Spark (``archive.extractor``), which tests of their own compare with both.
    ``native`` skips only outside CI when the connector is missing (the ``spark`` fixture fails CI then).
    """
    from archive.spark import native_delta_available

    if request.param == "native" and not native_delta_available(spark):
        pytest.skip("the Delta Spark connector is not on the classpath (run `make delta-jars`, which needs Maven)")
    monkeypatch.setenv("LACE_ARCHIVE_LOCAL_READ_MB", "0")
    return str(request.param)
