"""Schemathesis against the live OpenAPI schema: no generated input gets a 5xx.

A few examples per operation (the machine has 2 cores); authenticated with an all-scopes key,
on a service with a registered type and query so that generated events can reach the matcher.
Operations are driven through hypothesis directly (schemathesis' pytest plugin does not
support pytest 9 yet).
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from tests.service.conftest import Service, make_database, make_service

pytestmark = [pytest.mark.slow, pytest.mark.integration]
EXAMPLES = 12


@pytest.fixture
def fuzz_service(database_kind: str, tmp_path: Path) -> Iterator[Service]:
    for db in make_database(database_kind, tmp_path):
        svc = make_service(db, tmp_path / "data")
        svc.start()
        try:
            with svc.client() as c:
                c.post("/event-types", json={"name": "Stock", "attributes": {"symbol": "string", "price": "float"}})
                c.post("/queries", json={"text": "NAME q\nPATTERN SEQ(Stock a, Stock b)\nWITHIN 1 min"})
            yield svc
        finally:
            svc.stop()


def test_no_generated_request_gets_a_server_error(fuzz_service: Service) -> None:
    schema = schemathesis.openapi.from_url(fuzz_service.base + "/openapi.json")
    headers = {"Authorization": f"Bearer {fuzz_service.admin}"}
    failures: list[str] = []
    calls = 0
    operations = [cast(Any, result).ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20
    for op in operations:

        @given(case=op.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def run(case: schemathesis.Case) -> None:
            nonlocal calls
            calls += 1
            case.call_and_validate(headers=headers, checks=[not_a_server_error], timeout=30)

        try:
            run()
        except Exception as e:  # collect every operation's failure, then fail once
            failures.append(f"{op.method.upper()} {op.path}: {str(e)[:800]}")
    assert not failures, "\n\n".join(failures)
    assert calls >= 5 * len(operations)
