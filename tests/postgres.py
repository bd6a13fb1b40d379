"""The PostgreSQL the tests use: 127.0.0.1:5432, trust authentication, database ``test`` (``make postgres`` or
``.ci/postgres.sh`` installs and starts one), each test in a schema of its own.

Without a server the PostgreSQL tests skip with :data:`SKIP_REASON`, and the run's summary says in one line how many
skipped and why; under CI (``CI`` set) they fail instead, since CI starts the server and a silent skip would hide half
of the service suite.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cli.service_process import PG_URL as PG_BASE
from cli.service_process import scratch_database

PLAIN = PG_BASE.replace("postgresql+psycopg", "postgresql")
SKIP_REASON = f"PostgreSQL not reachable at {PLAIN}"

_available: bool | None = None


def pg_available() -> bool:
    """Whether the server answers (asked once per run)."""
    global _available
    if _available is None:
        try:
            import psycopg

            with psycopg.connect(PLAIN, connect_timeout=3):
                _available = True
        except Exception:
            _available = False
    return _available


def require_pg() -> None:
    """Skip the calling test without a server; fail it under CI."""
    if pg_available():
        return
    if os.environ.get("CI"):
        pytest.fail(f"{SKIP_REASON}: CI starts PostgreSQL (.ci/postgres.sh), so its tests must not skip")
    pytest.skip(SKIP_REASON)


@contextmanager
def fresh_schema(prefix: str = "lace_test_") -> Iterator[str]:
    """A SQLAlchemy URL whose ``search_path`` is a new schema, dropped afterwards (calls :func:`require_pg`)."""
    require_pg()
    with scratch_database("postgresql", Path("."), PG_BASE, prefix=prefix) as db:
        yield db.url
