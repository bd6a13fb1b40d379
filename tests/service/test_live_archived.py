"""Live-and-archived queries in the service (DESIGN.md sections 7 and 10): registered over REST, run with
SLLAA / OLLAA / LLAA on the service's own Delta archive through its Spark session, alerts by webhook.

Real ``lace serve`` (uvicorn subprocess, its own local Spark), real receiver, SQLite and PostgreSQL. The
expected results come from the engine's runners over an in-memory archive holding the same events
(what ``lace replay --backend memory`` does), compared by event ids.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.demo import load_stream, split_stream
from cli.replay import infer_event_types
from engine.detector import compile as compile_statement
from engine.detector import make_detector
from engine.events import Event
from engine.live_archived.source import MemoryArchive
from tests.service.conftest import Database, Receiver, Service, make_database, make_service

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.integration]

QUERIES = Path(__file__).resolve().parents[2] / "cli" / "demo_data" / "queries"
ALGORITHMS = ("sllaa", "ollaa", "llaa")
DAY_US = 86_400_000_000


def _traffic_keys(live: list[Event], n: int) -> set[Any]:
    """The ``n`` segments with the most congested live readings (so the slice has results)."""
    counts: dict[Any, int] = {}
    for e in live:
        a = e.attrs
        if e.type == "traffic" and a["vehicle_count"] > 0 and a["avg_speed"] < 0.5 * a["ndt_kmh"]:
            counts[a["key"]] = counts.get(a["key"], 0) + 1
    return set(sorted(counts, key=lambda k: (-counts[k], k))[:n])


@pytest.fixture(scope="module")
def slices() -> tuple[list[Event], list[Event]]:
    """(archived part, live part) of the demo streams: every bar, 6 traffic segments, 3 days of live traffic."""
    archived, live = split_stream(load_stream())
    keys = _traffic_keys(live, 6)
    last = min(e.ts for e in live if e.type == "traffic") + 1 * DAY_US
    archived = [e for e in archived if e.type == "bar" or (e.attrs["key"] in keys and e.ts >= last - 9 * DAY_US)]
    live = [e for e in live if e.type == "bar" or (e.attrs["key"] in keys and e.ts < last)]
    return archived, live


def expected(text: str, algorithm: str, archived: list[Event], live: list[Event]) -> set[str]:
    """Results of ``text`` with the archive holding ``archived`` and ``live`` played as the live stream."""
    memory = MemoryArchive()
    memory.extend(archived)
    det = make_detector(compile_statement(text), source=memory, algorithm=algorithm, tolerance_us=600_000_000)
    out = []
    for e in live:
        memory.append(e)
        out += det.push(e)
    out += det.flush()
    return {json.dumps(m.ids(), sort_keys=True) for m in out}


def wire(e: Event) -> dict[str, Any]:
    return {"id": e.id, "type": e.type, "ts": e.ts // 1_000, "attrs": e.attrs}


def post_all(c: httpx.Client, events: list[Event], batch: int = 5_000) -> None:
    for i in range(0, len(events), batch):
        r = c.post("/events", json=[wire(e) for e in events[i : i + batch]])
        assert r.status_code == 200, r.text
        assert r.json()["rejected"] == 0, r.json()["rejections"][:3]


def register_types(c: httpx.Client, events: list[Event]) -> None:
    for t in infer_event_types(events, "key"):
        r = c.post(
            "/event-types",
            json={"name": t.name, "attributes": dict(t.attributes), "partition_key": t.key},
        )
        assert r.status_code == 201, r.text


def by_query(receiver: Receiver) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for d in receiver.ok():
        body = json.loads(d["body"])
        out.setdefault(body["query"]["name"], []).append(body)
    return out


def count_alerts(c: httpx.Client, query_id: int) -> int:
    n, cursor = 0, None
    while True:
        params: dict[str, Any] = {"query_id": query_id, "limit": 1000}
        if cursor:
            params["cursor"] = cursor
        page = c.get("/alerts", params=params).json()
        n += len(page["items"])
        cursor = page["next_cursor"]
        if not cursor:
            return n


def wait_idle(c: httpx.Client, ids: list[int], receiver: Receiver, timeout_s: float = 300.0) -> None:
    """Until every query matched what it got, answered every archive request and its alerts all arrived."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = True
        for qid in ids:
            la = c.get(f"/queries/{qid}").json()["stats"]["live_archived"]
            if la["backlog_events"] or la["requests_in_flight"] or la["pending_live_instances"]:
                done = False
        if done:
            if len(receiver.ok()) >= sum(count_alerts(c, q) for q in ids):
                return
        time.sleep(0.5)
    raise AssertionError("the live-and-archived queries did not finish in time")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def la_service(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A service of its own (its event time is the demo data's, 2013-2014, behind the shared services')."""
    tmp = tmp_path_factory.mktemp(f"la-{request.param}")
    db: Database
    for db in make_database(request.param, tmp):
        svc = make_service(db, tmp / "data", archive_flush_rows=2_000, pm_capacity=50)
        svc.start()
        try:
            yield svc
        finally:
            svc.stop()


def test_demo_live_and_archived_queries_over_rest_equal_replay(
    la_service: Service, receiver: Receiver, slices: tuple[list[Event], list[Event]]
) -> None:
    archived, live = slices
    texts = {p.stem: p.read_text() for p in QUERIES.glob("*.lql") if "ARCHIVED" in p.read_text()}
    assert set(texts) == {"congested_same_hour", "drop_after_rebound"}
    streams = {"drop_after_rebound": "bar", "congested_same_hour": "traffic"}
    ids: dict[str, int] = {}
    with la_service.client() as c:
        register_types(c, archived + live)
        # one stream after the other: the service's event time is one clock for every type (for now), and
        # the bars (2013) are older than the traffic readings (2014)
        for stem, etype in streams.items():
            post_all(c, [e for e in archived if e.type == etype])
            for alg in ALGORITHMS:
                name = f"{stem}_{alg}"
                r = c.post(
                    "/queries", json={"text": texts[stem], "name": name, "algorithm": alg, "tolerance": "10 min"}
                )
                assert r.status_code == 201, r.text
                body = r.json()
                assert (body["kind"], body["algorithm"], body["tolerance_ms"]) == ("live_archived", alg, 600_000)
                ids[name] = body["id"]
                assert c.post("/webhooks", json={"query_id": body["id"], "url": receiver.url}).status_code == 201
            mine = [e for e in live if e.type == etype]
            started = time.monotonic()
            post_all(c, mine)
            print(f"{stem}: ingest of {len(mine)} live events took {time.monotonic() - started:.2f} s")
        # a later event of each type closes every window and subwindow (keys that match nothing)
        end = max(e.ts for e in live) + 2 * DAY_US
        bar = next(e for e in live if e.type == "bar")
        sentinels = [
            {"type": "bar", "ts": end // 1000, "attrs": {**bar.attrs, "key": "NONE"}},
            {
                "type": "traffic",
                "ts": end // 1000,
                "attrs": {"key": -1, "avg_speed": 0, "vehicle_count": 0, "ndt_kmh": 0, "hour": 0},
            },
        ]
        assert c.post("/events", json=sentinels).status_code == 200
        wait_idle(c, list(ids.values()), receiver)
        got = by_query(receiver)
        for name, qid in ids.items():
            stem, alg = name.rsplit("_", 1)
            etype = streams[stem]
            want = expected(
                texts[stem], alg, [e for e in archived if e.type == etype], [e for e in live if e.type == etype]
            )
            have = {json.dumps(b["events"], sort_keys=True) for b in got.get(name, [])}
            assert want, f"{name}: the slice gives no result; the comparison would be empty"
            assert have == want, f"{name}: {len(have - want)} unexpected, {len(want - have)} missing"
            assert len(got[name]) == len(have)  # one delivery per alert
            stats = c.get(f"/queries/{qid}").json()["stats"]
            la = stats["live_archived"]
            assert la["algorithm"] == alg and la["live_instances"] > 0
            if alg == "sllaa":
                assert la["archive_requests"] <= la["live_instances"]
            assert stats["pm_capacity"] == 50
