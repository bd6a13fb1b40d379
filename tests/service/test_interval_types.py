"""Issue 15 over real HTTP: interval event types (``"interval": true``), ts_end checked at ingest, Allen's
relations in a registered query, and the watermark of an interval type on ts_end."""

from __future__ import annotations

from cli.service_process import ServiceProcess, unique


def make_interval_type(c, **extra) -> str:
    name = unique("episode")
    body = {"name": name, "attributes": {"key": "string"}, "interval": True, **extra}
    r = c.post("/event-types", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["interval"] is True
    return name


def test_an_interval_type_needs_ts_end_after_ts(service: ServiceProcess, t0: int) -> None:
    with service.client() as c:
        t = make_interval_type(c, max_duration_ms=3_600_000)
        bad = [
            {"type": t, "ts": t0, "attrs": {"key": "a"}},
            {"type": t, "ts": t0, "ts_end": t0, "attrs": {"key": "a"}},
            {"type": t, "ts": t0, "ts_end": t0 + 7_200_000, "attrs": {"key": "a"}},
        ]
        for i, raw in enumerate(bad):
            r = c.post("/events", json=[raw])
            assert r.status_code == 422, (i, r.text)
            [rej] = r.json()["rejections"]
            assert rej["field"] == "events[0].ts_end", rej
        assert "ts_end > ts" in c.post("/events", json=[bad[1]]).json()["rejections"][0]["reason"]
        ok = c.post("/events", json=[{"type": t, "ts": t0, "ts_end": t0 + 60_000, "attrs": {"key": "a"}}])
        assert ok.status_code == 200 and ok.json()["accepted"] == 1, ok.text


def test_a_point_type_refuses_ts_end_and_max_duration_needs_interval(service: ServiceProcess, t0: int) -> None:
    with service.client() as c:
        name = unique("point")
        r = c.post("/event-types", json={"name": name, "attributes": {"key": "string"}, "max_duration_ms": 5})
        assert r.status_code == 422 and "interval" in r.text, r.text
        assert c.post("/event-types", json={"name": name, "attributes": {"key": "string"}}).status_code == 201
        r = c.post("/events", json=[{"type": name, "ts": t0, "ts_end": t0 + 5, "attrs": {"key": "a"}}])
        assert r.status_code == 422 and r.json()["rejections"][0]["field"] == "events[0].ts_end", r.text


def test_a_relation_query_alerts_on_interval_events(service: ServiceProcess, t0: int) -> None:
    with service.client() as c:
        a, b = make_interval_type(c), make_interval_type(c)
        text = f"NAME {unique('q')} PATTERN SEQ({a} x, {b} y) WHERE x OVERLAPS y WITHIN 1 hour"
        q = c.post("/queries", json={"text": text})
        assert q.status_code == 201, q.text
        minute = 60_000
        body = [
            {"type": a, "ts": t0, "ts_end": t0 + 10 * minute, "attrs": {"key": "k"}},
            {"type": b, "ts": t0 + 5 * minute, "ts_end": t0 + 20 * minute, "attrs": {"key": "k"}},
            {"type": b, "ts": t0 + 10 * minute, "ts_end": t0 + 21 * minute, "attrs": {"key": "k"}},  # meets
        ]
        r = c.post("/events", json=body)
        assert r.status_code == 200 and r.json()["accepted"] == 3 and r.json()["alerts"] == 1, r.text
        alerts = c.get("/alerts", params={"query_id": q.json()["id"]}).json()["items"]
        assert len(alerts) == 1 and alerts[0]["events"] == {"x": [r.json()["ids"][0]], "y": [r.json()["ids"][1]]}


def test_an_interval_statement_derives_episodes_that_a_relation_query_reads(service: ServiceProcess, t0: int) -> None:
    """INTERVAL ... EMIT INTO over REST: the derived type is an interval type; a BY OVERLAPS query alerts."""
    from cli.service_process import wait_until

    with service.client() as c:
        traffic, episode, p = unique("traffic"), unique("episode"), unique("rule")
        r = c.post("/event-types", json={"name": traffic, "attributes": {"key": "int", "speed": "float"}})
        assert r.status_code == 201, r.text
        derive = (
            f"NAME {p}_ep INTERVAL {traffic} t WHEN t.speed < 50 PARTITION BY key COVER 5 min MAX GAP 10 min "
            f"RETURN t[1].key AS key, count(t) AS readings EMIT INTO {episode}"
        )
        relate = (
            f"NAME {p}_spread PATTERN SEQ({episode} u, {episode} d) BY OVERLAPS(0 s, 30 min) "
            "WHERE u.key = 1 AND d.key = 2 WITHIN 3 hours RETURN u.readings AS un, d.readings AS dn"
        )
        ids = {}
        for text in (derive, relate):
            q = c.post("/queries", json={"text": text})
            assert q.status_code == 201, q.text
            ids[q.json()["name"]] = q.json()["id"]
        assert c.get(f"/queries/{ids[f'{p}_ep']}").json()["kind"] == "interval"
        et = c.get(f"/event-types/{episode}").json()
        assert et["interval"] is True and et["attributes"] == {"key": "int", "readings": "int"}, et
        minute = 60_000
        body = []
        for m in range(0, 90, 5):  # key 1 slow on [0, 30) min, key 2 on [10, 50) min
            for key, slow in ((1, m < 30), (2, 10 <= m < 50)):
                attrs = {"key": key, "speed": 30.0 if slow else 80.0}
                body.append({"type": traffic, "ts": t0 + m * minute, "attrs": attrs})
        r = c.post("/events", json=body)
        assert r.status_code == 200 and r.json()["accepted"] == len(body), r.text

        def alerts():
            got = c.get("/alerts", params={"query_id": ids[f"{p}_spread"]}).json()["items"]
            return got or None

        [alert] = wait_until(alerts)
        assert alert["fields"] == {"un": 6, "dn": 8}
