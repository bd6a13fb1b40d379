"""``POST /queries/{id}/results`` (``lace stream --deliver``) killed by SIGKILL before or after its transaction
commits, then posted again after the restart (what ``lace stream --deliver`` does after its error line): every
match is an alert exactly once, delivered once to the query's webhook (issue 26: the crash suite covers the import).
"""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import orjson
import pytest

from cli.service_process import HARNESS_SETTINGS, ServiceProcess
from cli.webhook_receiver import Receiver
from tests.service.conftest import make_database
from tests.service.test_api_e2e import drop_query, make_type

pytestmark = [pytest.mark.slow, pytest.mark.integration]

NDJSON = {"content-type": "application/x-ndjson"}


@pytest.mark.parametrize("point", ["results.import.before_commit", "results.import.after_commit"])
def test_an_import_killed_mid_request_and_posted_again_alerts_each_match_once(
    database_kind: str, tmp_path: Path, point: str
) -> None:
    receiver = Receiver()
    receiver.start()
    try:
        for db in make_database(database_kind, tmp_path):
            svc = ServiceProcess(tmp_path / "data", {**HARNESS_SETTINGS, "crash_at": f"{point}:1"}, db=db,
                                 own_group=True)
            svc.start()
            try:
                with svc.client() as c:
                    t = make_type(c)
                    q = c.post("/queries", json={"text": drop_query(t)}).json()
                    qid, name = q["id"], q["name"]
                    assert c.post("/webhooks", json={"query_id": qid, "url": receiver.url}).status_code == 201
                    docs = [
                        {"query": name, "events": {"a": [10 * i + 1], "b": [10 * i + 2]}, "start": 1_000 * i,
                         "end": 1_000 * i + 500, "fields": {"symbol": f"S{i}", "low": float(i)}}
                        for i in range(1, 6)
                    ]
                    body = b"".join(orjson.dumps(d) + b"\n" for d in docs)
                    with pytest.raises(httpx.TransportError):  # killed before its answer
                        c.post(f"/queries/{qid}/results", content=body, headers=NDJSON)
                assert svc.proc is not None and svc.proc.wait(timeout=30) != 0
                svc.stop()
                svc.env.pop("LACE_CRASH_AT")
                svc.start()
                with svc.client() as c:
                    again = c.post(f"/queries/{qid}/results", content=body, headers=NDJSON)
                    assert again.status_code == 200, again.text
                    committed = point.endswith("after_commit")
                    assert again.json() == {"received": 5, "alerts": 0 if committed else 5,
                                            "duplicates": 5 if committed else 0}
                    alerts = c.get("/alerts", params={"query_id": qid, "limit": 100}).json()["items"]
                    assert sorted(json.dumps(a["events"], sort_keys=True) for a in alerts) == sorted(
                        json.dumps(d["events"], sort_keys=True) for d in docs
                    )
                    receiver.wait_for(5)
                    receiver.wait_for(6, timeout_s=3)  # anything more would come now
                    by_key = receiver.bodies_by_key()  # a resend after the crash keeps its idempotency key
                    assert len(by_key) == 5 and all(len(b) == 1 for b in by_key.values()), by_key
                    sent = [json.loads(next(iter(b)))["events"] for b in by_key.values()]
                    assert sorted(json.dumps(e, sort_keys=True) for e in sent) == sorted(
                        json.dumps(d["events"], sort_keys=True) for d in docs
                    )
            finally:
                svc.stop()
    finally:
        receiver.stop()
