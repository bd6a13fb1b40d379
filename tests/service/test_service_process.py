"""``cli.service_process.ServiceProcess``, the harness every integration test and the crash suite start ``lace serve``
with: a port taken between choosing it and the child's bind (another program's server or outgoing connection; it
happened to a crash run beside the CI suite: five failed starts on one port) makes it start again on a new one."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cli.service_process import ServiceProcess

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_a_port_taken_before_the_child_binds_it_is_replaced(tmp_path: Path) -> None:
    svc = ServiceProcess(tmp_path / "data")
    chosen = svc.port
    with socket.socket() as other:
        other.bind(("127.0.0.1", chosen))
        other.listen()
        svc.start()
        try:
            assert svc.port != chosen
            with svc.client() as c:
                assert c.get("/healthz").status_code == 200
        finally:
            svc.stop()
    assert "address already in use" in svc.log_tail(100_000)
