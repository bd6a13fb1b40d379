"""Schemathesis ``--checks all`` against a real service: zero failures.

Every check schemathesis has (no 5xx; documented status codes, content types, headers and
response schemas; schema-invalid input refused; schema-valid input accepted; 405 with the right
``Allow``; missing auth refused; use after delete...) over its four phases (examples, coverage,
fuzzing, stateful), run by its own CLI against ``lace serve`` with a registered type and query.
Bounded: 20 examples per operation, one worker, a fixed seed (about a minute per database).
``tests/service/schemathesis.toml`` says where a schema-valid request may still get a 422 and why;
``tests/service/schemathesis_hooks.py`` keeps the run's own key from being revoked by the run.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.service_process import PACKAGE_ROOT, ServiceProcess, make_service
from tests.service.conftest import make_database

pytestmark = [pytest.mark.slow, pytest.mark.integration]
HERE = Path(__file__).parent


@pytest.fixture
def fuzz_service(database_kind: str, tmp_path: Path) -> Iterator[ServiceProcess]:
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


def test_schemathesis_all_checks_find_nothing(fuzz_service: ServiceProcess, tmp_path: Path) -> None:
    with fuzz_service.client() as c:
        keys = c.get("/keys").json()
    key_id = next(k["id"] for k in keys if fuzz_service.admin.startswith(k["prefix"]))
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.service.schemathesis_hooks", "LACE_FUZZ_KEY_ID": str(key_id)}
    env["PYTHONPATH"] = str(PACKAGE_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [
            sys.executable, "-m", "schemathesis.cli",
            "--config-file", str(HERE / "schemathesis.toml"),
            "run", fuzz_service.base + "/openapi.json",
            "--checks", "all",
            "-H", f"Authorization: Bearer {fuzz_service.admin}",
            "--max-examples", "20",
            "--workers", "1",
            "--seed", "1",
            "--max-failures", "50",
            # plan_trial, USING ARCHIVE and state=warm run Spark jobs inside the request, and the first one waits
            # for the service's local JVM to start: 10 s (the default) timed out once in a full CI run
            "--request-timeout", "120",
            # `--checks all` also bounds response times, at 10 s by default: the same requests (a plan trial
            # waiting for the JVM, or a request queued behind one) took 13.8 s in a full run at load 8-13
            "--max-response-time", "120",
        ],
        cwd=PACKAGE_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    (tmp_path / "schemathesis.txt").write_text(out.stdout + out.stderr)
    assert out.returncode == 0, out.stdout[-12_000:] + out.stderr[-2_000:]
    summary = out.stdout.split("SUMMARY")[-1]
    assert "Failures:" not in summary and "Authentication failed" not in summary, summary
    generated = re.search(r"(\d+) generated, (\d+) passed", summary)
    assert generated is not None and int(generated[1]) == int(generated[2]) >= 1000, summary
