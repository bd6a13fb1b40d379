"""Fixtures of the live-and-archived tests: the run's one Spark session is the archive tests' ``spark``."""
from __future__ import annotations

from tests.archive.conftest import reader_backend, spark  # noqa: F401 - the same fixtures (get_spark is per process)
