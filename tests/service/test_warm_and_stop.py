"""``?state=warm`` and a clean stop (issue 24, item 8), over a real ``lace serve``, SQLite and PostgreSQL.

- a LIVE ... ARCHIVED query cannot be warm-started: the 422 names the field and says why (docs/rest.md);
- ``GET /queries/{id}`` shows what a warm start fed (it showed ``warm: null`` right after one);
- a SIGTERM stops the live-and-archived worker processes on purpose: the log says nothing about a process
  that "exited" (it said so once per live-and-archived query).
"""
from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli.service_process import ServiceProcess, unique, wait_until
from service.live.la_process import default_workers
from tests.service.conftest import run_service

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.integration]

MINUTE = 60_000


@pytest.fixture
def own_service(database_kind: str, tmp_path: Path) -> Iterator[ServiceProcess]:
    """A service of the test's own: the test stops it."""
    yield from run_service(database_kind, tmp_path)


def _type(c: httpx.Client) -> str:
    name = unique("pass")
    r = c.post("/event-types", json={"name": name, "attributes": {"car": "int", "at": "string"}})
    assert r.status_code == 201, r.text
    return name


def test_warm_is_refused_for_live_archived_and_shown_after_a_warm_start(own_service: ServiceProcess, t0: int) -> None:
    with own_service.client() as c:
        t = _type(c)
        body = [{"type": t, "ts": t0 + i * MINUTE, "attrs": {"car": i % 3, "at": "AB"[i % 2]}} for i in range(12)]
        assert c.post("/events", json=body).json()["accepted"] == 12
        la = (
            f"LIVE PATTERN SEQ({t} p) WHERE p.at = 'B' ARCHIVED PATTERN SEQ({t} q) WHERE q.at = 'A' "
            "LOOKBACK 1 hour JOIN p.car = q.car"
        )
        refused = c.post("/queries", params={"state": "warm"}, json={"name": unique("la"), "text": la})
        assert refused.status_code == 422, refused.text
        [err] = refused.json()["detail"]
        assert err["field"] == "query.state", err
        assert "LIVE ... ARCHIVED" in err["reason"] and "reads the archive" in err["reason"], err
        # the same text without state=warm is accepted
        ok = c.post("/queries", json={"name": unique("la"), "text": la})
        assert ok.status_code == 201, ok.text
        assert ok.json()["warm"] is None

        text = f"PATTERN SEQ({t} a, {t} b) WHERE a.car = b.car WITHIN 10 min"
        warm = c.post("/queries", params={"state": "warm"}, json={"name": unique("w"), "text": text})
        assert warm.status_code == 201, warm.text
        fed = warm.json()["warm"]
        assert fed is not None and fed["events"] == 11 and fed["results"] > 0, fed
        got = c.get(f"/queries/{warm.json()['id']}").json()
        assert got["warm"] == fed  # was None: GET forgot the warm start
        listed = {q["id"]: q for q in c.get("/queries").json()}
        assert listed[warm.json()["id"]]["warm"] == fed
        # a new version started without warming shows none
        put = c.put(f"/queries/{warm.json()['id']}", json={"text": text + " "})
        assert put.status_code == 200, put.text
        assert put.json()["warm"] is None and c.get(f"/queries/{warm.json()['id']}").json()["warm"] is None


def _la_children(pid: int) -> list[int]:
    """The live-and-archived worker processes of the service ``pid`` (spawned: ``multiprocessing.spawn``)."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        for child in Path(f"/proc/{pid}/task/{tid}/children").read_text().split():
            cmd = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
            if b"spawn_main" in cmd:
                out.append(int(child))
    return out


@pytest.mark.parametrize("group", [False, True], ids=["sigterm", "sigterm-to-the-group"])
def test_a_clean_stop_logs_no_exited_process(own_service: ServiceProcess, t0: int, group: bool) -> None:
    """A SIGTERM to the service, or to its whole process group as a terminal's Ctrl-C, systemd or
    ``kill -TERM -PGID`` send it (then the worker processes get it too), stops every live-and-archived
    worker on purpose: nothing alarming is logged."""
    with own_service.client() as c:
        t = _type(c)
        ids = []
        for _ in range(2):
            la = (
                f"NAME {unique('la')} LIVE PATTERN SEQ({t} p) WHERE p.at = 'B' ARCHIVED PATTERN SEQ({t} q) "
                f"WHERE q.at = 'A' LOOKBACK 1 hour JOIN p.car = q.car"
            )
            r = c.post("/queries", json={"text": la})
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        body = [{"type": t, "ts": t0 + i * MINUTE, "attrs": {"car": i % 3, "at": "AB"[i % 2]}} for i in range(12)]
        assert c.post("/events", json=body).json()["accepted"] == 12

        def matched() -> bool:  # both child processes run and have taken the events
            stats = [c.get(f"/queries/{q}").json()["stats"] for q in ids]
            return all(s is not None and s["events"] == 12 for s in stats)

        assert wait_until(matched, timeout_s=90)
    assert own_service.proc is not None
    if group:  # as killpg would (the tests' services share pytest's group: signal the members one by one)
        children = _la_children(own_service.proc.pid)
        assert len(children) == min(2, default_workers())  # the pool's workers hosting the two queries
        own_service.proc.send_signal(signal.SIGTERM)
        for child in children:
            os.kill(child, signal.SIGTERM)
    own_service.stop()
    assert own_service.proc.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it handled
    log = own_service.log_path.read_text()
    assert "exited" not in log and "is gone" not in log, log[-3000:]


@pytest.mark.parametrize("how", ["create", "update"])
def test_a_warm_start_survives_a_sigkill(own_service: ServiceProcess, t0: int, how: str) -> None:
    """A statement started with ``state=warm`` (registered, or a new version) and the service SIGKILLed right after the
    answer: after the restart it still has the history warming gave it, so a match whose first event came before it
    started is alerted, as by the same statement running since before those events (the crash suite's ``update``
    fault lost them: the restart replayed the new version only what it received after it started)."""
    text = "PATTERN SEQ({t} a, {t} b) WHERE a.at = 'A' AND b.at = 'B' AND a.car = b.car WITHIN 10 min"
    with own_service.client() as c:
        t = _type(c)
        always = c.post("/queries", json={"name": unique("always"), "text": text.format(t=t)}).json()["id"]
        early = [{"type": t, "ts": t0 + i * 20_000, "attrs": {"car": i % 3, "at": "A"}} for i in range(9)]
        assert c.post("/events", json=early).json()["accepted"] == 9
        if how == "create":
            r = c.post("/queries", params={"state": "warm"}, json={"name": unique("warm"), "text": text.format(t=t)})
            assert r.status_code == 201, r.text
        else:
            r = c.post("/queries", json={"name": unique("warm"), "text": text.format(t=t)})
            assert r.status_code == 201, r.text
            r = c.put(f"/queries/{r.json()['id']}", params={"state": "warm"}, json={"text": text.format(t=t)})
            assert r.status_code == 200, r.text
        warm = r.json()["id"]
        assert r.json()["warm"]["events"] == 9, r.json()["warm"]
    own_service.kill()
    own_service.start()
    with own_service.client() as c:
        late = [{"type": t, "ts": t0 + 4 * MINUTE + i * 20_000, "attrs": {"car": i % 3, "at": "B"}} for i in range(3)]
        assert c.post("/events", json=late).json()["accepted"] == 3

        def alerts(qid: int) -> list[list[int]]:
            items = c.get("/alerts", params={"query_id": qid, "limit": 1000}).json()["items"]
            return sorted(sorted(i for ids in a["events"].values() for i in ids) for a in items)

        want = wait_until(lambda: alerts(always) if len(alerts(always)) == 9 else None, timeout_s=30)
        assert alerts(warm) == want  # 9 pairs: each B with the three earlier A's of its car
