"""Backfills over real HTTP (issue 7): ``POST /backfills`` runs a registered query over the archive on
Spark (inside the real ``lace serve``), its results equal live detection's alerts, ``deliver`` turns
them into alerts that reach a real webhook receiver, and cancel / bad input behave.

Runs against the ``service`` fixture on SQLite and on PostgreSQL.
"""
from __future__ import annotations

from typing import Any

import httpx
import pytest

from cli.service_process import ServiceProcess, unique, wait_until
from cli.webhook_receiver import Receiver
from tests.service.test_api_e2e import drop_query, ev, make_type, post

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration]


def prices(t: str, t0: int) -> list[dict[str, Any]]:
    """Two symbols over 10 minutes with a few 10%+ drops within a minute (and plenty that are not)."""
    out = []
    for i in range(120):
        for sym, base in (("IBM", 100.0), ("AIG", 50.0)):
            p = base * (0.85 if i % 17 == 5 else 1.0 + 0.01 * (i % 3))
            out.append(ev(t, t0 + i * 5_000, sym, p))
    return out


def finished(c: httpx.Client, backfill_id: int, timeout_s: float = 240.0) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        body = c.get(f"/backfills/{backfill_id}").json()
        return body if body["state"] in ("succeeded", "failed", "cancelled") else None

    body = wait_until(done, timeout_s=timeout_s, every_s=0.2)
    assert body, f"backfill {backfill_id} did not finish: {c.get(f'/backfills/{backfill_id}').json()}"
    return body


def identity(events: dict[str, list[int]], fields: dict[str, Any]) -> tuple:
    return tuple(sorted((k, tuple(v)) for k, v in events.items())), tuple(sorted(fields.items()))


def test_backfill_equals_live_alerts_and_delivers_to_webhooks(
    service: ServiceProcess, receiver: Receiver, t0: int
) -> None:
    with service.client() as c:
        t = make_type(c)
        live_q = c.post("/queries", json={"text": drop_query(t)}).json()
        r = post(c, prices(t, t0))
        assert r.status_code == 200 and r.json()["rejected"] == 0, r.text
        live = c.get("/alerts", params={"query_id": live_q["id"], "limit": 1000}).json()["items"]
        assert len(live) >= 5, "the stream must give live alerts"

        # the same query over the archive: the same matches
        b = c.post("/backfills", json={"query_id": live_q["id"], "from": t0, "to": t0 + 3_600_000})
        assert b.status_code == 202, b.text
        assert b.json()["state"] in ("queued", "running") and b.json()["from"].endswith("+00:00")
        done = finished(c, b.json()["id"])
        assert done["state"] == "succeeded", done
        assert done["percent"] == 100.0 and done["events_scanned"] >= 240 and done["matches"] == len(live)
        assert done["alerts"] is None and set(done["versions"]) == {t}
        res = c.get(f"/backfills/{done['id']}/results", params={"limit": 3}).json()
        assert res["total"] == len(live) and len(res["items"]) == 3 and res["next_offset"] == 3
        items = c.get(f"/backfills/{done['id']}/results", params={"limit": 10_000}).json()["items"]
        assert sorted(identity(m["events"], m["fields"]) for m in items) == sorted(
            identity(a["events"], a["fields"]) for a in live
        )
        assert all(m["start"] < m["end"] for m in items)

        # a query registered after the events saw none of them live; deliver=true alerts them now
        late_q = c.post("/queries", json={"text": drop_query(t, unique("late"))}).json()
        wh = c.post("/webhooks", json={"query_id": late_q["id"], "url": receiver.url})
        assert wh.status_code == 201
        assert c.get("/alerts", params={"query_id": late_q["id"]}).json()["items"] == []
        b2 = c.post("/backfills", json={"query_id": late_q["id"], "from": t0, "to": t0 + 3_600_000, "deliver": True})
        done2 = finished(c, b2.json()["id"])
        assert done2["state"] == "succeeded" and done2["alerts"] == len(live), done2
        alerts = c.get("/alerts", params={"query_id": late_q["id"], "limit": 1000}).json()["items"]
        assert len(alerts) == len(live)
        assert len(receiver.wait_for(len(live), timeout_s=30)) == len(live)

        # again: nothing is alerted twice
        b3 = c.post("/backfills", json={"query_id": late_q["id"], "from": t0, "to": t0 + 3_600_000, "deliver": True})
        assert finished(c, b3.json()["id"])["alerts"] == 0

        listed = c.get("/backfills", params={"query_id": late_q["id"]}).json()["items"]
        assert [x["id"] for x in listed] == [b2.json()["id"], b3.json()["id"]]

        text = c.get("/metrics").text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line and line[0] != "#"}
    assert values['lace_backfills_total{state="succeeded"}'] >= 3 and values["lace_spark_jobs_total"] >= 3
    assert values["lace_backfill_matches_total"] >= 3 * len(live)


def test_cancel_a_queued_backfill_and_bad_input(service: ServiceProcess, t0: int) -> None:
    with service.client() as c:
        t = make_type(c)
        q = c.post("/queries", json={"text": drop_query(t)}).json()
        assert post(c, prices(t, t0)).status_code == 200
        span = {"query_id": q["id"], "from": t0, "to": t0 + 3_600_000}
        first = c.post("/backfills", json=span).json()
        second = c.post("/backfills", json=span).json()
        cancelled = c.post(f"/backfills/{second['id']}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        assert finished(c, second["id"])["state"] == "cancelled"
        assert finished(c, first["id"])["state"] == "succeeded"
        again = c.post(f"/backfills/{second['id']}/cancel")
        assert again.status_code == 409 and "ended (cancelled)" in again.text
        no_results = c.get(f"/backfills/{second['id']}/results")
        assert no_results.status_code == 409 and "cancelled" in no_results.text

        def problem(r: httpx.Response) -> tuple[int, str | None]:
            return r.status_code, r.json()["detail"][0]["field"]

        assert problem(c.post("/backfills", json={**span, "to": t0})) == (422, "body.to")
        assert problem(c.post("/backfills", json={**span, "from": "yesterday"})) == (422, "body.from")
        assert problem(c.post("/backfills", json={**span, "query_id": 10**12})) == (404, "body.query_id")
        assert c.post("/backfills", json={**span, "extra": 1}).status_code == 422
        assert problem(c.get("/backfills/999999999")) == (404, "path.id")
        with service.client("lace_not_a_key") as bad:
            assert bad.post("/backfills", json=span).status_code == 401
