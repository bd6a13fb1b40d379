"""Restarts of a service with derived streams (issue 24, items 2 and 7): after SIGTERM or SIGKILL and a start on
the same data directory, the webhook alerts equal those of a run without faults, each idempotency key once.

Item 2: a reader of an ``EMIT INTO`` stream. The restart replay derives the derived events again; they must get the
ids they had (derived ids are a hash of the emitting statement, its version and the match's inputs), or the reader's
matches are new matches to the alert de-duplication and are alerted again under new idempotency keys.

Item 7: ``SEQ(dedup(alarm, 5 min) d, alarm b)``: the replay must reach back as far as the ``dedup`` operator
remembers, or an alarm it had absorbed comes out of it again after the restart.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cli.service_process import CLOCK, ServiceProcess
from cli.webhook_receiver import Receiver
from tests.service.conftest import run_service

PAIR = "NAME pair PATTERN SEQ(hi a, hi b) PARTITION BY key WITHIN 2 min RETURN a.v AS av, b.v AS bv"
EMITTERS = {
    "pattern": "NAME hi PATTERN s x WHERE x.v > 80 RETURN x.key AS key, x.v AS v EMIT INTO hi",
    "aggregate": (
        "NAME hi AGGREGATE s x WHERE x.v > 80 GROUP BY key WINDOW TUMBLING 10 s "
        "RETURN x.key AS key, max(x.v) AS v EMIT INTO hi"
    ),
}
S_TYPE = {"name": "s", "attributes": {"key": "string", "v": "int"}}


def phases(t0: int) -> list[list[dict[str, Any]]]:
    """8 events of ``s`` in two requests (ts epoch ms; ``t0`` on a minute): key k1 is above 80 four times within
    2 minutes, k2 once, and low events move the watermark past every derived event (6 pairs, all of k1); each
    high event is alone in its 10 s window. The first pair of k1 is complete after the first request, the
    other five need a derived event of the first request."""
    def ev(i: int, s: float, key: str, v: int) -> dict[str, Any]:
        return {"id": i, "type": "s", "ts": t0 + int(s * 1000), "attrs": {"key": key, "v": v}}

    return [
        [ev(1, 1, "k1", 90), ev(2, 6, "k2", 95), ev(3, 11, "k1", 91), ev(4, 16, "k2", 10)],
        [ev(5, 21, "k1", 92), ev(6, 31, "k1", 93), ev(7, 41, "k2", 20), ev(8, 51, "k1", 30)],
    ]


@contextmanager
def running(kind: str, tmp: Path, **settings: Any) -> Iterator[ServiceProcess]:
    yield from run_service(kind, tmp, **settings)


def restart(svc: ServiceProcess, fault: str | None) -> None:
    if fault is None:
        return
    if fault == "sigkill":
        svc.kill()
    else:
        svc.stop()
    svc.start()


def by_key(rx: Receiver) -> dict[str, set[bytes]]:
    out: dict[str, set[bytes]] = {}
    for rec in rx.ok():
        out.setdefault(rec["headers"]["idempotency-key"], set()).add(rec["body"])
    return out


def alerts_of(keys: dict[str, set[bytes]]) -> list[tuple[str, str, str, str]]:
    """What an alert says, without what differs between two runs (alert id, detection time): sorted."""
    out = []
    for bodies in keys.values():
        for body in bodies:
            doc = json.loads(body)
            out.append((json.dumps(doc["events"], sort_keys=True), doc["start"], doc["end"],
                        json.dumps(doc["fields"], sort_keys=True)))
    return sorted(out)


def settle(rx: Receiver, n: int) -> dict[str, set[bytes]]:
    """Wait for ``n`` deliveries, then a little longer for any extra one."""
    rx.wait_for(n, timeout_s=30)
    time.sleep(1.5)
    return by_key(rx)


def run(kind: str, tmp: Path, setup: list[tuple[str, Any]], reader: str, batches: list[list[dict[str, Any]]],
        first: int, total: int, fault: str | None) -> dict[str, set[bytes]]:
    """Register ``setup`` (("type", body) / ("query", text)), a webhook on the query named ``reader``, post
    ``batches[0]`` (``first`` alerts), restart with ``fault``, post the rest (``total`` alerts), restart again;
    return the deliveries by idempotency key."""
    rx = Receiver()
    rx.start()
    try:
        with running(kind, tmp) as svc:
            with svc.client() as c:
                for what, body in setup:
                    if what == "type":
                        assert c.post("/event-types", json=body).status_code == 201
                    else:
                        r = c.post("/queries", json={"text": body})
                        assert r.status_code == 201, r.text
                        if r.json()["name"] == reader:
                            hook = {"query_id": r.json()["id"], "url": rx.url}
                            assert c.post("/webhooks", json=hook).status_code == 201
                assert c.post("/events", json=batches[0]).json()["accepted"] == len(batches[0])
            rx.wait_for(first, timeout_s=30)
            restart(svc, fault)
            with svc.client() as c:
                for b in batches[1:]:
                    assert c.post("/events", json=b).json()["accepted"] == len(b)
            rx.wait_for(total, timeout_s=30)
            restart(svc, fault)
            return settle(rx, total)
    finally:
        rx.stop()


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("emitter", sorted(EMITTERS))
def test_readers_of_a_derived_stream_alert_once_across_restarts(
    database_kind: str, tmp_path: Path, emitter: str
) -> None:
    t0 = CLOCK.take() // 60_000 * 60_000 + 60_000
    setup = [("type", S_TYPE), ("query", EMITTERS[emitter]), ("query", PAIR)]
    first = 1 if emitter == "pattern" else 0  # the aggregate's second window fires in the second request
    clean = run(database_kind, tmp_path / "clean", setup, "pair", phases(t0), first, 6, None)
    want = alerts_of(clean)
    assert len(want) == 6, want
    for fault in ("sigterm", "sigkill"):
        got = run(database_kind, tmp_path / fault, setup, "pair", phases(t0), first, 6, fault)
        assert all(len(b) == 1 for b in got.values()), f"{fault}: a key with two payloads"
        assert alerts_of(got) == want, f"{fault}: {len(got)} alerts, the fault-free run had {len(want)}"


TWICE = "NAME twice PATTERN SEQ(dedup(alarm, 5 min) d, alarm b) PARTITION BY key WITHIN 1 min"
ALARM_TYPE = {"name": "alarm", "attributes": {"key": "string"}}


def alarms(t0: int) -> list[list[dict[str, Any]]]:
    """Alarms of one key (ts epoch ms): dedup alerts at 0 min and absorbs 0.5 and 3 (the restart comes here)
    and 3.5, then alerts again at 5.2; a second alarm within WITHIN 1 min of an alert is a match: (0, 0.5) and
    (5.2, 5.5). A replay from 3 - 1 min would start dedup's binding at 3: (3, 3.5) would be alerted and 5.2
    absorbed."""
    def ev(i: int, minutes: float) -> dict[str, Any]:
        return {"id": i, "type": "alarm", "ts": t0 + int(minutes * 60_000), "attrs": {"key": "k1"}}

    return [[ev(1, 0), ev(2, 0.5), ev(3, 3)], [ev(4, 3.5), ev(5, 5.2), ev(6, 5.5)]]


@pytest.mark.slow
@pytest.mark.integration
def test_dedup_operator_state_survives_restarts(database_kind: str, tmp_path: Path) -> None:
    t0 = CLOCK.take() // 60_000 * 60_000 + 60_000
    setup = [("type", ALARM_TYPE), ("query", TWICE)]
    clean = run(database_kind, tmp_path / "clean", setup, "twice", alarms(t0), 1, 2, None)
    want = alerts_of(clean)
    assert [json.loads(e) for e, *_ in want] == [{"d": [1], "b": [2]}, {"d": [5], "b": [6]}]
    for fault in ("sigterm", "sigkill"):
        got = run(database_kind, tmp_path / fault, setup, "twice", alarms(t0), 1, 2, fault)
        assert all(len(b) == 1 for b in got.values()), f"{fault}: a key with two payloads"
        assert alerts_of(got) == want, f"{fault}: {alerts_of(got)}"
