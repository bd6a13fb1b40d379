"""Statement updates during ingest (issue 14): a `PUT /queries/{id}` does not wait for the ingest request in flight,
and each change is atomic with respect to ingest requests, over real HTTP against a real ``lace serve``.

A request that ends before an update starts is matched by the old version; one that starts after the update
returned, by the new one; one that overlaps it, wholly by one of the two (service.live.applying_lock).
"""
from __future__ import annotations

import random
import threading
import time
from typing import Any

from cli.service_process import ServiceProcess, unique


def _text(name: str, thr: float) -> str:
    return f"NAME {name}\nPATTERN SEQ({{t}} t) WHERE t.x > {thr}\nRETURN t.x AS x"


def test_updates_during_ingest_split_requests_whole_between_versions(service: ServiceProcess, t0: int) -> None:
    rng = random.Random(3)
    with service.client() as c:
        t = unique("Upd")
        assert c.post("/event-types", json={"name": t, "attributes": {"k": "string", "x": "float"}}).status_code == 201
        name = unique("band")
        started = time.perf_counter()
        r = c.post("/queries", json={"text": _text(name, 0.5).replace("{t}", t)})
        assert r.status_code == 201, r.text
        qid = r.json()["id"]
        # version -> (its request's start, end, threshold), client-side perf_counter seconds
        versions: dict[int, tuple[float, float, float]] = {1: (started, time.perf_counter(), 0.5)}
        requests: list[tuple[float, float, list[int]]] = []
        x_of: dict[int, float] = {}
        stop = threading.Event()
        errors: list[str] = []

        def ingest() -> None:
            with service.client() as ci:
                nid = 1
                for _ in range(40):
                    events: list[dict[str, Any]] = []
                    for _k in range(300):
                        x = rng.random()
                        x_of[nid] = x
                        events.append({"id": nid, "type": t, "ts": t0 + nid, "attrs": {"k": "a", "x": x}})
                        nid += 1
                    s = time.perf_counter()
                    resp = ci.post("/events", json=events)
                    e = time.perf_counter()
                    if resp.status_code != 200 or resp.json()["accepted"] != len(events):
                        errors.append(resp.text[:300])
                    requests.append((s, e, [ev["id"] for ev in events]))
            stop.set()

        def update() -> None:
            with service.client() as cu:
                k = 0
                while not stop.is_set():
                    thr = (0.2, 0.8, 0.4, 0.6)[k % 4]
                    k += 1
                    s = time.perf_counter()
                    resp = cu.put(f"/queries/{qid}", json={"text": _text(name, thr).replace("{t}", t)})
                    e = time.perf_counter()
                    if resp.status_code != 200:
                        errors.append(resp.text[:300])
                        return
                    versions[resp.json()["version"]] = (s, e, thr)
                    time.sleep(0.01)

        threads = [threading.Thread(target=ingest), threading.Thread(target=update)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(300)
        assert not errors, errors
        alerts: list[dict[str, Any]] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"query_id": qid, "limit": 1000}
            if cursor:
                params["cursor"] = cursor
            page = c.get("/alerts", params=params).json()
            alerts += page["items"]
            cursor = page["next_cursor"]
            if cursor is None:
                break

    assert len(versions) >= 5, "too few updates to test anything"
    by_event: dict[int, list[int]] = {}
    for a in alerts:
        by_event.setdefault(a["events"]["t"][0], []).append(a["query_version"])
    assert all(len(v) == 1 for v in by_event.values()), "an event alerted twice"
    request_of = {eid: (s, e) for s, e, ids in requests for eid in ids}
    overlapped = 0
    for s, e, ids in requests:
        assert len({by_event[i][0] for i in ids if i in by_event}) <= 1, "a request was matched by two versions"
        # the versions that may have matched this request: active at some instant within it
        possible = [v for v, (vs, ve, _) in versions.items()
                    if vs < e and (v + 1 not in versions or versions[v + 1][1] > s)]
        overlapped += len(possible) > 1
        if len(possible) == 1:
            thr = versions[possible[0]][2]
            want = {i for i in ids if x_of[i] > thr}
            assert {i for i in ids if i in by_event} == want
            assert all(by_event[i] == [possible[0]] for i in want)
    for eid, (v,) in by_event.items():
        s, e = request_of[eid]
        vs, ve, thr = versions[v]
        assert x_of[eid] > thr
        assert e > vs, f"version {v} matched a request that ended before its PUT started"
        if v + 1 in versions:
            assert s < versions[v + 1][1], f"version {v} matched a request sent after version {v + 1} was returned"
    assert overlapped > 0, "no update overlapped an ingest request: the test did not race them"
