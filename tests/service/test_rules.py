"""Layered rules over REST (issue 14): FILTER rules before the archive, EMIT INTO derived streams, search
and the rule graph, deletes that would orphan a reader refused unless cascaded, alerts carrying the version.

Over real HTTP on a real uvicorn server, SQLite and PostgreSQL (tests/service/conftest.py).
"""
from __future__ import annotations

from cli.service_process import ServiceProcess, unique, wait_until


def _setup(c) -> tuple[str, str, str]:
    traffic = unique("traffic")
    r = c.post("/event-types", json={"name": traffic, "attributes": {"key": "int", "speed": "float"}})
    assert r.status_code == 201, r.text
    return traffic, unique("slow"), unique("rule")


def _ev(t: str, ts: int, key: int, speed: float) -> dict:
    return {"type": t, "ts": ts, "attrs": {"key": key, "speed": speed}}


def test_filter_capture_and_pattern_rules_flow_through_derived_streams(service: ServiceProcess, t0: int) -> None:
    with service.client() as c:
        traffic, slow, p = _setup(c)
        filt = f"NAME {p}_clean FILTER {traffic} t DROP DUPLICATE key, ts WITHIN 1 hour DROP WHEN t.speed < 0"
        cap = (
            f"NAME {p}_slow PATTERN SEQ({traffic} t) WHERE t.speed < 20 "
            f"RETURN t.key AS key, t.speed AS speed EMIT INTO {slow}"
        )
        pat = (
            f"NAME {p}_twice PATTERN SEQ({slow} a, {slow} b) PARTITION BY key WITHIN 30 min "
            "STRATEGY skip_till_next_match RETURN a.key AS key, b.speed AS speed"
        )
        ids = {}
        for text in (filt, cap, pat):
            r = c.post("/queries", json={"text": text})
            assert r.status_code == 201, r.text
            ids[r.json()["name"]] = r.json()["id"]
        # the derived type is registered with the RETURN fields as its attributes
        et = c.get(f"/event-types/{slow}")
        assert et.status_code == 200 and et.json()["attributes"] == {"key": "int", "speed": "float"}, et.text
        minute = 60_000
        body = [
            _ev(traffic, t0, 1, 10.0),
            _ev(traffic, t0, 1, 11.0),  # duplicate (key, ts): dropped by the filter
            _ev(traffic, t0 + 5 * minute, 1, -3.0),  # DROP WHEN
            _ev(traffic, t0 + 10 * minute, 1, 15.0),
            _ev(traffic, t0 + 15 * minute, 2, 50.0),
            _ev(traffic, t0 + 20 * minute, 1, 12.0),
        ]
        r = c.post("/events", json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["accepted"] == 4, out
        reasons = {rej["index"]: rej["reason"] for rej in out["rejections"]}
        assert reasons[1].startswith(f"dropped by filter {p}_clean: duplicate of (key, ts)")
        assert reasons[2] == f"dropped by filter {p}_clean: DROP WHEN t.speed < 0"
        # a later event moves the watermark past the last slow reading: it is released to the pattern
        assert c.post("/events", json=[_ev(traffic, t0 + 25 * minute, 3, 60.0)]).status_code == 200

        def alerts():
            got = c.get("/alerts", params={"query_id": ids[f"{p}_twice"]}).json()["items"]
            return got if len(got) == 2 else None

        got = sorted(wait_until(alerts), key=lambda a: a["start"])
        assert [a["fields"] for a in got] == [{"key": 1, "speed": 15.0}, {"key": 1, "speed": 12.0}]
        assert all(a["query_version"] == 1 for a in got)
        # the capture rule ends in a derived stream, not in alerts
        assert c.get("/alerts", params={"query_id": ids[f"{p}_slow"]}).json()["items"] == []
        # producers cannot ingest a derived type
        bad = c.post("/events", json=[_ev(slow, t0 + 30 * minute, 1, 1.0)])
        assert bad.status_code == 422 and "derived event type" in bad.json()["rejections"][0]["reason"]
        stats = c.get(f"/queries/{ids[f'{p}_clean']}").json()
        assert stats["kind"] == "filter" and stats["stats"]["matches"] == 2  # events dropped


def test_search_graph_cycles_and_cascading_deletes(service: ServiceProcess) -> None:
    with service.client() as c:
        traffic, slow, p = _setup(c)
        cap = f"NAME {p}_a PATTERN SEQ({traffic} t) RETURN t.key AS key, t.speed AS speed EMIT INTO {slow}"
        read = f"NAME {p}_b PATTERN SEQ({slow} s) RETURN s.key AS key, s.speed AS speed EMIT INTO {slow}_2"
        a = c.post("/queries", json={"text": cap}).json()
        b = c.post("/queries", json={"text": read})
        assert b.status_code == 201, b.text
        b = b.json()
        cyc = c.post(
            "/queries", json={"text": f"NAME {p}_c PATTERN SEQ({slow}_2 s) RETURN s.key AS key, s.speed AS speed "
                                      f"EMIT INTO {slow}"}
        )
        assert cyc.status_code == 422, cyc.text
        assert f"EMIT INTO {slow} would create a cycle {slow} \u2192 {slow}_2 \u2192 {slow}" in cyc.text
        assert [q["name"] for q in c.get("/queries", params={"emits": slow}).json()] == [f"{p}_a"]
        assert [q["name"] for q in c.get("/queries", params={"reads": slow}).json()] == [f"{p}_b"]
        assert [q["name"] for q in c.get("/queries", params={"q": f"{p}_"}).json()] == [f"{p}_a", f"{p}_b"]
        graph = c.get("/queries/graph").json()
        assert [f"{p}_a", f"{p}_b"] in [list(e) for e in graph["edges"]]
        assert graph["derived_types"][slow] == [f"{p}_a"]
        refused = c.delete(f"/queries/{a['id']}")
        assert refused.status_code == 409 and f"{p}_b reads {slow}" in refused.text
        assert c.delete(f"/queries/{a['id']}", params={"cascade": "true"}).status_code == 204
        assert c.get(f"/queries/{b['id']}").status_code == 404


def _offline(text: str, events: list[dict], t: str) -> list[tuple]:
    from engine.compiler import compile_query
    from engine.events import Event
    from engine.matcher import Matcher

    m = Matcher(compile_query(text))
    out = []
    for i, e in enumerate(events, 1):
        out.extend(m.push(Event(i, t, e["ts"] * 1000, e["attrs"])))
    out.extend(m.flush())
    return sorted((x.start // 1000, x.end // 1000) for x in out)


def test_state_warm_behaves_as_if_the_statement_had_always_run(service: ServiceProcess, t0: int) -> None:
    with service.client() as c:
        traffic, _, p = _setup(c)
        minute = 60_000
        history = [_ev(traffic, t0 + i * minute, 1, float(10 + (i * 7) % 13)) for i in range(20)]
        live = [_ev(traffic, t0 + (20 + i) * minute, 1, float(10 + ((20 + i) * 7) % 13)) for i in range(10)]
        assert c.post("/events", json=history).json()["accepted"] == 20
        text = f"PATTERN SEQ({traffic} a, {traffic} b) WHERE b.speed > a.speed + 5 WITHIN 10 min"
        warm = c.post("/queries", params={"state": "warm"}, json={"name": f"{p}_w", "text": text})
        assert warm.status_code == 201, warm.text
        assert warm.json()["warm"]["events"] == 11 and warm.json()["warm"]["results"] > 0  # the last WITHIN only
        cold = c.post("/queries", json={"name": f"{p}_c", "text": text}).json()
        assert c.post("/events", json=live).json()["accepted"] == 10
        every = _offline(text, history + live, traffic)
        after = [m for m in every if m[1] >= t0 + 20 * minute]  # completed by a live event

        def alerts(qid: int, n: int):
            got = c.get("/alerts", params={"query_id": qid, "limit": 1000}).json()["items"]
            return got if len(got) >= n else None

        def span(a: dict) -> tuple[int, int]:
            from datetime import datetime

            return tuple(int(datetime.fromisoformat(a[k]).timestamp() * 1000) for k in ("start", "end"))  # type: ignore[return-value]

        got = sorted(span(a) for a in wait_until(lambda: alerts(warm.json()["id"], len(after))))
        assert got == after
        cold_items = c.get("/alerts", params={"query_id": cold["id"], "limit": 1000}).json()["items"]
        cold_got = sorted(span(a) for a in cold_items)
        assert set(cold_got) < set(after)  # the cold start is blind to matches that began before it
        refused = c.put(f"/queries/{cold['id']}", params={"state": "warm"}, json={"text": "LIVE PATTERN SEQ(x a) "
                        "ARCHIVED PATTERN SEQ(x b) LOOKBACK 1 h JOIN a.k = b.k"})
        assert refused.status_code == 422


def test_an_aggregate_statement_alerts_once_per_window_and_group(service: ServiceProcess, t0: int) -> None:
    with service.client() as c:
        traffic, load, p = _setup(c)
        minute = 60_000
        start = (t0 // (10 * minute) + 1) * 10 * minute  # a window boundary
        agg = (
            f"NAME {p}_load AGGREGATE {traffic} t GROUP BY key WINDOW TUMBLING 10 min HAVING count(t) >= 2 "
            "RETURN t.key AS key, avg(t.speed) AS speed, count(t) AS n"
        )
        q = c.post("/queries", json={"text": agg})
        assert q.status_code == 201 and q.json()["kind"] == "aggregate", q.text
        body = [
            _ev(traffic, start + 1 * minute, 1, 10.0),
            _ev(traffic, start + 2 * minute, 2, 30.0),
            _ev(traffic, start + 4 * minute, 1, 20.0),
            _ev(traffic, start + 12 * minute, 1, 50.0),  # the next window: only one event, HAVING drops it
            _ev(traffic, start + 25 * minute, 3, 70.0),  # moves the watermark past both windows
        ]
        assert c.post("/events", json=body).json()["accepted"] == 5

        def alerts():
            got = c.get("/alerts", params={"query_id": q.json()["id"]}).json()["items"]
            return got or None

        [alert] = wait_until(alerts)
        assert alert["fields"] == {"key": 1, "speed": 15.0, "n": 2, "window_end": (start + 10 * minute) * 1000}
        assert alert["events"] == {}


def test_emit_into_an_ingested_type_is_refused_and_a_derived_type_cannot_be_ingested(
    service: ServiceProcess, t0: int
) -> None:
    """Issue 24 item 5 (docs/lql.md: "T must not be an ingested type"). A type registered with POST /event-types is
    ingested even before its first event (EMIT INTO it was accepted then, and its derived events moved its
    watermark: its real producer was refused as late); a type made by EMIT INTO stays derived while its emitter is
    paused or deleted (its events were accepted from producers then)."""
    with service.client() as c:
        traffic, slow, p = _setup(c)
        other = unique("other")
        r = c.post("/event-types", json={"name": other, "attributes": {"key": "int", "speed": "float"}})
        assert r.status_code == 201 and r.json()["derived"] is False, r.text
        into_other = f"PATTERN SEQ({traffic} t) RETURN t.key AS key, t.speed AS speed EMIT INTO {other}"
        refused = c.post("/queries", json={"name": f"{p}_o", "text": into_other})
        assert refused.status_code == 409, refused.text
        [err] = refused.json()["detail"]
        assert err["field"] == "body.text", err
        assert err["reason"].startswith(f"EMIT INTO {other}: '{other}' is an ingested event type"), err
        # the same by PUT
        cap = f"PATTERN SEQ({traffic} t) WHERE t.speed < 20 RETURN t.key AS key, t.speed AS speed EMIT INTO {slow}"
        q = c.post("/queries", json={"name": f"{p}_slow", "text": cap})
        assert q.status_code == 201, q.text
        assert c.get(f"/event-types/{slow}").json()["derived"] is True
        put = c.put(f"/queries/{q.json()['id']}", json={"text": into_other})
        assert put.status_code == 409 and "is an ingested event type" in put.text, put.text
        # the producer of the ingested type is not refused as late by derived events: there are none
        assert c.post("/events", json=[_ev(traffic, t0 + 30 * 60_000, 1, 5.0)]).json()["accepted"] == 1
        assert c.post("/events", json=[_ev(other, t0, 1, 5.0)]).json()["accepted"] == 1

        def refused_as_derived(ts: int) -> str:
            out = c.post("/events", json=[_ev(slow, ts, 1, 1.0)])
            assert out.status_code == 422, out.text
            [rej] = out.json()["rejections"]
            assert rej["field"] == "events[0].type", rej
            return str(rej["reason"])

        # a derived event exists at t0 + 30 min: an older one is refused as derived, not as late
        assert "derived event type" in refused_as_derived(t0)
        assert c.post(f"/queries/{q.json()['id']}/pause").status_code == 200
        assert f"'{slow}' is a derived event type" in refused_as_derived(t0 + 40 * 60_000)  # paused emitter
        assert c.delete(f"/queries/{q.json()['id']}").status_code == 204
        assert f"'{slow}' is a derived event type" in refused_as_derived(t0 + 41 * 60_000)  # no emitter left
        # a new statement can emit into the derived type again
        again = c.post("/queries", json={"name": f"{p}_slow2", "text": cap})
        assert again.status_code == 201, again.text


def test_a_filter_on_a_derived_type_holds_for_the_archive_too(service: ServiceProcess, t0: int) -> None:
    """Issue 24 item 6. One rule: the archive holds what live readers see after the FILTER rules. A FILTER on a
    derived type dropped the events for live readers but they were archived anyway: a live-and-archived reader
    counted 6 archived events instead of 3, and a backfill of the live reader gave 6 results where live gave 3."""
    import time

    from tests.service.test_backfills import finished

    with service.client() as c:
        traffic, slow, p = _setup(c)
        texts = [
            f"NAME {p}_cap PATTERN SEQ({traffic} t) WHERE t.speed < 1000 RETURN t.key AS key, t.speed AS speed "
            f"EMIT INTO {slow}",
            f"NAME {p}_f FILTER {slow} s DROP WHEN s.speed < 50",
            f"NAME {p}_read PATTERN SEQ({slow} s) RETURN s.key AS key, s.speed AS speed",
        ]
        ids = [c.post("/queries", json={"text": text}).json()["id"] for text in texts]
        la = c.post("/queries", json={"algorithm": "llaa", "text": (
            f"NAME {p}_la LIVE PATTERN SEQ({traffic} p) WHERE p.speed > 1000 ARCHIVED PATTERN SEQ({slow} q) "
            "LOOKBACK 1 hour JOIN p.key = q.key RETURN q.speed AS speed"
        )})
        assert la.status_code == 201, la.text
        minute = 60_000
        speeds = [10.0, 60.0, 20.0, 70.0, 30.0, 80.0]
        body = [_ev(traffic, t0 + i * minute, 1, s) for i, s in enumerate(speeds)]
        assert c.post("/events", json=body).json()["accepted"] == 6
        # the trigger of the live side, later: every derived event is released and archived before it
        assert c.post("/events", json=[_ev(traffic, t0 + 10 * minute, 1, 5000.0)]).json()["accepted"] == 1
        kept = [60.0, 70.0, 80.0]

        def alerts(qid: int) -> list[dict]:
            return c.get("/alerts", params={"query_id": qid, "limit": 100}).json()["items"]  # type: ignore[no-any-return]

        live = wait_until(lambda: alerts(ids[2]) if len(alerts(ids[2])) >= 3 else None)
        assert sorted(a["fields"]["speed"] for a in live) == kept

        def la_idle() -> bool:
            s = c.get(f"/queries/{la.json()['id']}").json()["stats"]["live_archived"]
            done = not (s["backlog_events"] or s["requests_in_flight"] or s["pending_live_instances"])
            return done and len(alerts(la.json()["id"])) >= 3

        assert wait_until(la_idle, timeout_s=120)
        time.sleep(1.0)  # anything more would have come by now
        assert sorted(a["fields"]["speed"] for a in alerts(la.json()["id"])) == kept  # was 6 archived events

        b = c.post("/backfills", json={"query_id": ids[2], "from": t0, "to": t0 + 3_600_000})
        assert b.status_code == 202, b.text
        done = finished(c, b.json()["id"])
        assert done["state"] == "succeeded" and done["matches"] == 3, done  # was 6 (where live gave 3)
        items = c.get(f"/backfills/{done['id']}/results", params={"limit": 100}).json()["items"]
        assert sorted(m["fields"]["speed"] for m in items) == kept


def test_a_filter_remembers_kept_events_while_another_type_runs_ahead(service: ServiceProcess, t0: int) -> None:
    """A duplicate is judged against the kept events of its own type within WITHIN: another type's event time,
    far ahead, does not make the filter forget them (it forgot them at the rule graph's clock, the largest
    watermark of any type, and kept the duplicate; the crash suite found it through a restart)."""
    with service.client() as c:
        f, g, p = unique("f"), unique("g"), unique("rule")
        for name in (f, g):
            body = {"name": name, "attributes": {"key": "int", "v": "int"}, "allowed_lateness_ms": 120_000}
            assert c.post("/event-types", json=body).status_code == 201
        for text in (f"NAME {p}_clean FILTER {f} x DROP DUPLICATE key, v WITHIN 30 s",
                     f"NAME {p}_rise PATTERN SEQ({f} a, {f} b) WHERE b.v > a.v PARTITION BY key WITHIN 5 min"):
            r = c.post("/queries", json={"text": text})
            assert r.status_code == 201, r.text
        ev = [{"type": f, "ts": t0, "attrs": {"key": 1, "v": 20}},  # kept
              {"type": g, "ts": t0 + 600_000, "attrs": {"key": 1, "v": 0}},  # another type, 10 min ahead
              {"type": f, "ts": t0 + 30_000, "attrs": {"key": 1, "v": 20}},  # 30 s after the kept one: a duplicate
              {"type": f, "ts": t0 + 61_000, "attrs": {"key": 1, "v": 20}}]  # 61 s after it: kept
        got = [c.post("/events", json=[e]).json() for e in ev]
        assert [a["accepted"] for a in got] == [1, 1, 0, 1], got
        assert "duplicate of (key, v) within 30 s" in got[2]["rejections"][0]["reason"], got[2]
