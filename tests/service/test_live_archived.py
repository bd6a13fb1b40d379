"""Live-and-archived queries in the service (docs/architecture.md sections 7.7 and 7.10): registered over REST, run with
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
from cli.service_process import Database, ServiceProcess, make_service, wait_until
from cli.webhook_receiver import Receiver
from engine.detector import compile as compile_statement
from engine.detector import make_detector
from engine.events import Event
from engine.live_archived.source import MemoryArchive
from engine.lql.pattern_checks import single_event_var
from tests.service.conftest import make_database
from tests.service.test_backfills import finished
from tests.service.test_demo import _traffic_keys

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.integration]

QUERIES = Path(__file__).resolve().parents[2] / "cli" / "demo_data" / "queries"
ALGORITHMS = ("sllaa", "ollaa", "llaa")
DAY_US = 86_400_000_000


@pytest.fixture(scope="module")
def slices() -> tuple[list[Event], list[Event]]:
    """(archived part, live part) of the demo streams: the bars of Monday and Tuesday archived, Wednesday's live;
    3 traffic segments, 9 days archived and 12 hours live (LLAA makes one Spark job per live instance)."""
    archived, live = split_stream(load_stream())
    keys = _traffic_keys(live, 3)
    last = min(e.ts for e in live if e.type == "traffic") + DAY_US // 2
    archived = [e for e in archived if e.type == "bar" or (e.attrs["key"] in keys and e.ts >= last - 9 * DAY_US)]
    first_bar = min(e.ts for e in live if e.type == "bar")
    live = [
        e
        for e in live
        if (e.type == "bar" and e.ts < first_bar + DAY_US)
        or (e.type == "traffic" and e.attrs["key"] in keys and e.ts < last)
    ]
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
            json={"name": t.name, "attributes": dict(t.attributes), "partition_key": t.partition_key},
        )
        assert r.status_code == 201, r.text


def by_query(receiver: Receiver, raw: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Deliveries received, by query name: the JSON bodies, or (``raw``) the received requests."""
    out: dict[str, list[dict[str, Any]]] = {}
    for d in receiver.ok():
        body = json.loads(d["body"])
        out.setdefault(body["query_name"], []).append(d if raw else body)
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
            stats = c.get(f"/queries/{qid}").json()["stats"]
            assert not stats["failed"], f"query {qid} stopped: {stats['failed']}"
            la = stats["live_archived"]
            if la is not None and (la["backlog_events"] or la["requests_in_flight"] or la["pending_live_instances"]):
                done = False
        if done:
            # distinct idempotency keys: a redelivery (the receiver answered after the service's timeout) is
            # received twice, and counting requests would stop the wait before the last alerts arrived
            keys = {d["headers"]["idempotency-key"] for d in receiver.ok()}
            if len(keys) >= sum(count_alerts(c, q) for q in ids):
                return
        time.sleep(0.5)
    states = {q: c.get(f"/queries/{q}").json()["stats"] for q in ids}
    raise AssertionError(f"the live-and-archived queries did not finish in time: {states}")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def la_service(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
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
    la_service: ServiceProcess, receiver: Receiver, slices: tuple[list[Event], list[Event]]
) -> None:
    archived, live = slices
    texts = {p.stem: p.read_text() for p in QUERIES.glob("*.lql") if "ARCHIVED" in p.read_text()}
    assert set(texts) == {"congested_same_hour", "drop_after_rebound"}
    streams = {"drop_after_rebound": "bar", "congested_same_hour": "traffic"}
    live_only = {"bar": ["drop_then_rebound"], "traffic": ["congestion_episode", "jam_not_cleared"]}
    ids: dict[str, int] = {}
    budget_pairs: list[tuple[str, str]] = []  # (pm_capacity 10, unlimited): identical alerts

    def register(name: str, text: str, receiver_url: str, **options: Any) -> dict[str, Any]:
        r = c.post("/queries", json={"text": text, "name": name, **options})
        assert r.status_code == 201, r.text
        assert c.post("/webhooks", json={"query_id": r.json()["id"], "url": receiver_url}).status_code == 201
        ids[name] = r.json()["id"]
        return dict(r.json())

    with la_service.client() as c:
        register_types(c, archived + live)
        # one stream after the other: the service's event time is one clock for every type (for now), and
        # the bars (2013) are older than the traffic readings (2014)
        for stem, etype in streams.items():
            post_all(c, [e for e in archived if e.type == etype])
            for alg in ALGORITHMS:
                body = register(f"{stem}_{alg}", texts[stem], receiver.url, algorithm=alg, tolerance="10 min")
                assert (body["kind"], body["algorithm"], body["tolerance_ms"]) == ("live_archived", alg, 600_000)
            register(f"{stem}_pm10", texts[stem], receiver.url, tolerance="10 min", pm_capacity=10)
            budget_pairs.append((f"{stem}_pm10", f"{stem}_sllaa"))
            for other in live_only[etype]:
                text = (QUERIES / f"{other}.lql").read_text()
                assert register(f"{other}_pm10", text, receiver.url, pm_capacity=10)["kind"] == "live"
                register(f"{other}_unlimited", text, receiver.url, pm_capacity=1 << 40)
                budget_pairs.append((f"{other}_pm10", f"{other}_unlimited"))
            mine = [e for e in live if e.type == etype]
            started = time.monotonic()
            post_all(c, mine, batch=250)  # small requests: the pm_capacity=10 copies spill on every event
            print(f"{stem}: ingest of {len(mine)} live events took {time.monotonic() - started:.2f} s")
        # a later event of each type closes every window and subwindow (keys that match nothing)
        end = max(e.ts for e in live) + 2 * DAY_US
        bar = next(e for e in live if e.type == "bar")
        sentinels = [
            {"type": "bar", "ts": end // 1000, "attrs": {**bar.attrs, "key": "NONE"}},
            {
                "type": "traffic",
                "ts": end // 1000,
                "attrs": {"key": -1, "avg_speed": 0, "vehicle_count": 0, "ndt_kmh": 0},
            },
        ]
        r = c.post("/events", json=sentinels)
        assert r.status_code == 200 and r.json()["accepted"] == 2, r.text  # a rejected sentinel closes nothing
        wait_idle(c, list(ids.values()), receiver)
        got = by_query(receiver)
        got_raw = by_query(receiver, raw=True)
        for small, large in budget_pairs:
            a = {json.dumps(b["events"], sort_keys=True) for b in got.get(small, [])}
            b = {json.dumps(b["events"], sort_keys=True) for b in got.get(large, [])}
            assert a and a == b, f"{small} vs {large}: {len(a)} vs {len(b)} alerts"
            pm = c.get(f"/queries/{ids[small]}").json()["stats"]
            assert pm["pm_capacity"] == 10
        spills = sum(c.get(f"/queries/{ids[s]}").json()["stats"]["spills"] for s, _ in budget_pairs)
        assert spills > 0, "a budget of 10 partial matches must spill on these streams"
        for name, qid in ids.items():
            stem, alg = name.rsplit("_", 1)
            if alg not in ALGORITHMS:
                continue
            etype = streams[stem]
            want = expected(
                texts[stem], alg, [e for e in archived if e.type == etype], [e for e in live if e.type == etype]
            )
            have = {json.dumps(b["events"], sort_keys=True) for b in got.get(name, [])}
            assert want, f"{name}: the slice gives no result; the comparison would be empty"
            assert have == want, f"{name}: {len(have - want)} unexpected, {len(want - have)} missing"
            keys = {b["headers"]["idempotency-key"] for b in got_raw.get(name, [])}
            assert len(keys) == len(have)  # one alert (one idempotency key) per result; retries reuse the key
            stats = c.get(f"/queries/{qid}").json()["stats"]
            la = stats["live_archived"]
            assert la["algorithm"] == alg and la["live_instances"] > 0
            # known ranges (issue 43): on for a one-event P_A over the live pattern's one (ingested) type, not ALAA
            plan = compile_statement(texts[stem])
            on = alg != "alaa" and single_event_var(plan.archived.ast) is not None and set(
                plan.archived_types) == set(plan.live_types)
            assert (la["requests_from_memory"] is not None) == on, (name, la["requests_from_memory"])
            if alg == "sllaa":
                assert la["archive_requests"] <= la["live_instances"]
            assert stats["pm_capacity"] == 50

        # issue 25: the queries' archive requests went through the shared scheduler (one read answers the
        # requests of every query waiting at once; each got its own rows: the comparisons above)
        metrics = {
            line.split()[0]: float(line.split()[1])
            for line in c.get("/metrics").text.splitlines()
            if line.startswith(("lace_archive_read", "lace_archive_decoded"))
        }
        assert 0 < metrics["lace_archive_reads"] <= metrics["lace_archive_read_requests"], metrics
        # issue 43: the reads kept the files they decoded, and later reads found them so
        assert metrics["lace_archive_decoded_bytes"] > 0, metrics
        assert metrics['lace_archive_decoded_files{outcome="hit"}'] > 0, metrics
        assert metrics['lace_archive_decoded_files{outcome="miss"}'] > 0, metrics

        # a backfill of a live-and-archived query over REST: the live side over [from, to), the archived
        # side before it, the join in Spark; equal to what the live run found for live instances in range
        stem = "drop_after_rebound"
        bars = [e for e in live if e.type == "bar"]
        lo, hi = bars[0].ts // 1000, bars[-1].ts // 1000 + 1
        b = c.post("/backfills", json={"query_id": ids[f"{stem}_sllaa"], "from": lo, "to": hi})
        assert b.status_code == 202, b.text
        done = finished(c, b.json()["id"])
        assert done["state"] == "succeeded", done
        items = c.get(f"/backfills/{done['id']}/results", params={"limit": 10_000}).json()["items"]
        want = expected(texts[stem], "sllaa", [e for e in archived if e.type == "bar"], bars)
        assert {json.dumps(m["events"], sort_keys=True) for m in items} == want


def test_sigkill_with_open_subwindows_loses_and_repeats_no_alert(
    la_service: ServiceProcess, receiver: Receiver
) -> None:
    """Cars pass A (archived), then B (live, 5 min later); SLLAA with T_L = 1 hour keeps subwindows open.
    SIGKILL with results delivered, instances in open subwindows and requests maybe in flight; after the
    restart every expected alert arrives, each idempotency key once."""
    base_ms = 1_500_000_000_000  # 2017: after the demo data's event time
    text = (
        "NAME speeding\nLIVE PATTERN SEQ(pass p) WHERE p.at = 'B'\n"
        "ARCHIVED PATTERN SEQ(pass q) WHERE q.at = 'A' PARTITION BY car\nLOOKBACK 30 min\n"
        "JOIN p.car = q.car AND p.ts - q.ts < 20 min\nRETURN p.car AS car, q.ts AS entered"
    )
    cars = 240
    # producer ids of their own: the demo test before posted ids 1..n into this service (idempotent ingest)
    archived = [
        Event(50_000_000 + i, "pass", (base_ms + i * 60_000) * 1000, {"car": i, "at": "A"}) for i in range(cars)
    ]
    half = cars // 2
    live = [
        Event(60_000_000 + i, "pass", (base_ms + i * 60_000 + 300_000) * 1000, {"car": i, "at": "B"})
        for i in range(half, cars)
        if i % 3 != 0  # a third of the cars never reach B
    ]
    live = sorted(archived[half:] + live, key=Event.order_key)  # the A passes of the second half are live too
    archived = archived[:half]
    with la_service.client() as c:
        r = c.post("/event-types", json={"name": "pass", "attributes": {"car": "int", "at": "string"}})
        assert r.status_code == 201, r.text
        post_all(c, archived)
        q = c.post("/queries", json={"text": text, "algorithm": "sllaa", "tolerance": "1 hour"}).json()
        assert c.post("/webhooks", json={"query_id": q["id"], "url": receiver.url}).status_code == 201
        post_all(c, live, batch=40)
        def pending() -> int:
            la = c.get(f"/queries/{q['id']}").json()["stats"]["live_archived"]
            return int(la["pending_live_instances"]) if la["backlog_events"] == 0 else 0

        assert wait_until(pending, timeout_s=60), "no live instance waits in an open subwindow"
        wait_until(lambda: len(receiver.ok()) > 0, timeout_s=120)
        time.sleep(2.5)  # a restart checkpoint was recorded after the last batch
    before = len(receiver.ok())
    la_service.kill()
    la_service.start()
    with la_service.client() as c:
        end = (max(e.ts for e in live) // 1000) + 86_400_000
        assert c.post("/events", json=[{"type": "pass", "ts": end, "attrs": {"car": -1, "at": "C"}}]).status_code == 200
        want = expected(text, "sllaa", archived, live)
        wait_idle(c, [q["id"]], receiver)
        got = [d for d in receiver.ok()]
    keys = [d["headers"]["idempotency-key"] for d in got]
    assert len(keys) == len(set(keys)), "an alert was delivered twice"
    have = {json.dumps(json.loads(d["body"])["events"], sort_keys=True) for d in got}
    assert have == want, f"{len(want - have)} alerts lost, {len(have - want)} unexpected"
    assert 0 < before < len(want), f"the kill came with {before} of {len(want)} alerts delivered"
