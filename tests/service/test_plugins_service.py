"""Plug-ins in the service (issue 16): ``GET /operators``, and a misbehaving plug-in marks its query failed
without taking the service (or the ingest, or the other queries) down. Runs against a real ``lace serve``."""
from __future__ import annotations

from importlib import metadata

import pytest

from cli.service_process import ServiceProcess, unique


def test_get_operators_lists_the_installed_plugins(service: ServiceProcess) -> None:
    with service.client() as c:
        r = c.get("/operators")
    assert r.status_code == 200, r.text
    rows = {(p["kind"], p["name"]): p for p in r.json()["plugins"]}
    assert rows[("function", "hour_of_day")]["signature"] == "hour_of_day(timestamp) -> int"
    assert rows[("function", "hour_of_day")]["source"].startswith("lace")
    assert rows[("operator", "dedup")]["cost"] == 1.0 and rows[("operator", "dedup")]["pass_estimate"] == 0.5
    assert rows[("aggregate", "stddev")]["error"] is None


def test_a_misbehaving_plugin_fails_its_query_not_the_service(service: ServiceProcess, t0: int) -> None:
    try:
        metadata.distribution("lace-test-plugin")
    except metadata.PackageNotFoundError:
        pytest.skip("tests/plugin_pkg is not installed (make venv installs it)")
    with service.client() as c:
        t = unique("Reading")
        assert c.post("/event-types", json={"name": t, "attributes": {"k": "string", "x": "float"}}).status_code == 201
        bad = c.post("/queries", json={"text": f"NAME {unique('bad')}\nPATTERN {t} a RETURN explode(a.x) AS y"})
        good = c.post("/queries", json={"text": f"NAME {unique('good')}\nPATTERN {t} a RETURN abs(a.x) AS y"})
        assert bad.status_code == 201 and good.status_code == 201, bad.text + good.text
        ev = [{"type": t, "ts": t0 + i, "attrs": {"k": "s", "x": -1.5}} for i in range(3)]
        r = c.post("/events", json=ev)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["accepted"] == 3 and body["matches"] == 3  # the good query matched every event
        (err,) = body["query_errors"]
        assert err["index"] == 0 and err["query"] == bad.json()["name"]
        assert err["reason"] == "function plug-in 'explode' (from lace-test-plugin 0.1.0): raised RuntimeError: boom"
        stats = c.get(f"/queries/{bad.json()['id']}").json()
        assert "explode" in stats["stats"]["failed"]
        assert c.get(f"/queries/{good.json()['id']}").json()["stats"]["failed"] is None
        r = c.post("/events", json=[{"type": t, "ts": t0 + 10, "attrs": {"k": "s", "x": 2.0}}])
        assert r.status_code == 200 and r.json()["query_errors"] == [] and r.json()["matches"] == 1
        assert c.get("/healthz").status_code == 200
