"""Fixtures of the backfill tests: the run's one Spark session is the archive tests' ``spark``."""
from __future__ import annotations

from tests.archive.conftest import spark  # noqa: F401 - the same session-scoped fixture (get_spark is per process)
