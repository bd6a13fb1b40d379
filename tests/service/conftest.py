"""Fixtures for the service tests: a real ``lace serve`` (a uvicorn subprocess on 127.0.0.1, launched by
:mod:`cli.service_process`), a real webhook receiver (:class:`cli.webhook_receiver.Receiver`, on another port), and
the two databases: a SQLite file and PostgreSQL (127.0.0.1:5432, database ``test``, a fresh schema per run).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from cli.service_process import CLOCK, Database, ServiceProcess, make_service, scratch_database
from cli.webhook_receiver import Receiver
from tests.postgres import require_pg


def make_database(kind: str, tmp: Path) -> Iterator[Database]:
    """A fresh database of ``kind``: a SQLite file, or a new PostgreSQL schema dropped afterwards (skipped, or
    failed under CI, without a PostgreSQL server: :func:`tests.postgres.require_pg`)."""
    if kind == "postgresql":
        require_pg()
    with scratch_database(kind, tmp) as db:
        yield db


def run_service(database_kind: str, tmp: Path, **settings: Any) -> Iterator[ServiceProcess]:
    """A started service (``settings`` as for :func:`cli.service_process.make_service`) on a fresh database of
    ``database_kind``, data under ``tmp``; stopped afterwards."""
    for db in make_database(database_kind, tmp):
        svc = make_service(db, tmp / "data", **settings)
        svc.start()
        try:
            yield svc
        finally:
            svc.stop()


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def database_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def shared_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], ServiceProcess]]:
    """``get(kind)``: the run's one service on a database of ``kind``, started at its first use, stopped at the end.

    Both kinds stay up together: a session-scoped fixture parametrized by ``database_kind`` keeps one instance at a
    time, so files whose tests alternate between the kinds (each file runs its sqlite tests, then its postgresql ones,
    when ``make test`` hands whole files to its workers) stopped one service and started the other at every switch.
    """
    started: dict[str, ServiceProcess] = {}
    with ExitStack() as stack:

        def get(kind: str) -> ServiceProcess:
            if kind not in started:
                run = run_service(kind, tmp_path_factory.mktemp(f"svc-{kind}"))
                started[kind] = next(run)
                stack.callback(next, run, None)  # run the generator to its end: stop the service, drop the database
            return started[kind]

        yield get


@pytest.fixture
def service(database_kind: str, shared_services: Callable[[str], ServiceProcess]) -> ServiceProcess:
    """The running service on ``database_kind``, shared by the tests that create their own types and queries."""
    return shared_services(database_kind)


@pytest.fixture
def fresh_db(database_kind: str, tmp_path: Path) -> Iterator[Database]:
    yield from make_database(database_kind, tmp_path)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.start()
    yield r
    r.stop()


@pytest.fixture
def t0() -> int:
    """A base event time (epoch ms) with an hour of room after it (:data:`cli.service_process.CLOCK`)."""
    return CLOCK.take()
