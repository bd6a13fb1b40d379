"""Issue 13, failures 1, 2 and 7, each reproduced over real HTTP (SQLite and PostgreSQL): one event must not
brick the service, unrelated streams keep their own event time, and a producer's retry is not taken twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.serve import database_label
from cli.service_process import Database, ServiceProcess, make_service, unique


def make_type(c, *, lateness_ms: int = 0) -> str:
    name = unique("bar")
    r = c.post(
        "/event-types",
        json={"name": name, "attributes": {"key": "string", "close": "float"}, "allowed_lateness_ms": lateness_ms},
    )
    assert r.status_code == 201, r.text
    return name


def ev(t: str, ts, key: str = "AIG", close: float = 1.0, **extra):
    return {"type": t, "ts": ts, "attrs": {"key": key, "close": close}, **extra}


def test_a_far_future_event_is_refused_and_changes_nothing(service: ServiceProcess, t0: int) -> None:
    """1: one event at 9999-12-31 from an ingest key made every later normal event late."""
    with service.client() as c:
        t = make_type(c)
        r = c.post("/events", json=[ev(t, "9999-12-31T23:59:59Z")])
        assert r.status_code == 422, r.text
        [rej] = r.json()["rejections"]
        assert rej["field"] == "events[0].ts" and "future skew" in rej["reason"], rej
        ok = c.post("/events", json=[ev(t, t0), ev(t, t0 + 1_000)])
        assert ok.status_code == 200 and ok.json()["accepted"] == 2, ok.text


def test_timestamps_outside_what_the_archive_stores_are_refused_at_ingest(service: ServiceProcess) -> None:
    """1: past 2^53 us or before year 1 the archive flush failed forever after a 200."""
    with service.client() as c:
        t = make_type(c)
        for ts in (-62_135_596_800_001, "0000-12-31T23:59:59Z", 253_402_300_800_000):
            r = c.post("/events", json=[ev(t, ts)])
            assert r.status_code == 422, (ts, r.text)
            assert r.json()["rejections"][0]["field"] == "events[0].ts"


def test_unrelated_streams_keep_their_own_event_time(service: ServiceProcess, t0: int) -> None:
    """2: after traffic reached 2014-10-05, every bar of 2014-10-01 was rejected as late."""
    with service.client() as c:
        traffic, bars = make_type(c), make_type(c)
        day = 86_400_000
        assert c.post("/events", json=[ev(traffic, t0 + 4 * day)]).json()["accepted"] == 1
        r = c.post("/events", json=[ev(bars, t0 + i * 60_000) for i in range(50)])
        assert r.status_code == 200 and r.json()["accepted"] == 50, r.text
        # within one stream, lateness still holds
        late = c.post("/events", json=[ev(traffic, t0)])
        assert late.status_code == 422 and "late event" in late.json()["rejections"][0]["reason"]


def test_a_producer_retry_is_acknowledged_and_not_taken_twice(service: ServiceProcess, t0: int) -> None:
    """7: producer ids [5, 5] were both archived; a retry after a lost answer duplicated archive rows."""
    with service.client() as c:
        t = make_type(c)
        base = abs(hash(t)) % 10**9 * 1000  # ids of their own in the shared service
        body = [ev(t, t0, id=base + 5), ev(t, t0, id=base + 5), ev(t, t0 + 1, id=base + 6)]
        r = c.post("/events", json=body)
        assert r.status_code == 200, r.text
        assert (r.json()["accepted"], r.json()["ids"], r.json()["duplicates"]) == (2, [base + 5, base + 6], [base + 5])
        again = c.post("/events", json=body[:1])  # the client's retry: acknowledged again
        assert again.status_code == 200 and again.json()["accepted"] == 0, again.text
        assert again.json()["duplicates"] == [base + 5]
        other = c.post("/events", json=[ev(t, t0 + 2, close=9.0, id=base + 5)])
        assert other.status_code == 409, other.text
        [rej] = other.json()["rejections"]
        assert rej["field"] == "events[0].id" and str(base + 5) in rej["reason"]


@pytest.mark.slow
def test_year_one_as_the_first_event_is_archived_and_the_service_restarts(fresh_db: Database, tmp_path: Path) -> None:
    """1: year 1 as the first event of an empty service made the flush fail and the next start fail."""
    svc = make_service(fresh_db, tmp_path / "data", max_future_skew_s=86_400)
    svc.start()
    try:
        with svc.client() as c:
            t = make_type(c)
            r = c.post("/events", json=[ev(t, "0001-01-01T00:00:00Z"), ev(t, "0001-01-01T00:00:01Z")])
            assert r.status_code == 200 and r.json()["accepted"] == 2, r.text
        svc.stop()
        svc.start()  # the WAL (or Delta) holds year-1 events: the service starts
        with svc.client() as c:
            assert c.get("/healthz").status_code == 200
            assert c.post("/events", json=[ev(t, "0001-01-01T00:00:02Z")]).json()["accepted"] == 1
    finally:
        svc.stop()
    assert not list((tmp_path / "data" / "archive").glob("_quarantine/*"))


def test_an_added_attribute_is_optional_so_producers_keep_posting(service: ServiceProcess, t0: int) -> None:
    """6: PATCH adding `vwap` made it required at once; no optional attributes, no defaults, no removal."""
    with service.client() as c:
        t = make_type(c)
        assert c.post("/events", json=[ev(t, t0)]).json()["accepted"] == 1
        r = c.patch(
            f"/event-types/{t}",
            json={"attributes": {"vwap": "float", "venue": "string"}, "defaults": {"venue": "XNYS"}},
        )
        assert r.status_code == 200, r.text
        assert r.json()["defaults"] == {"vwap": None, "venue": "XNYS"}
        # the old producer goes on without the new attributes; a new one sends them (or null)
        old = c.post("/events", json=[ev(t, t0 + 1)])
        assert old.status_code == 200 and old.json()["accepted"] == 1, old.text
        new = c.post(
            "/events", json=[{"type": t, "ts": t0 + 2, "attrs": {"key": "A", "close": 1.0, "vwap": 2.5, "venue": None}}]
        )
        assert new.status_code == 200 and new.json()["accepted"] == 1, new.text
        bad = c.post("/events", json=[{"type": t, "ts": t0 + 3, "attrs": {"key": "A", "close": 1.0, "vwap": "x"}}])
        assert bad.status_code == 422 and bad.json()["rejections"][0]["field"] == "events[0].attrs.vwap"
        # a default must fit the type
        assert c.patch(f"/event-types/{t}", json={"defaults": {"vwap": "high"}}).status_code == 422
        # a query reading vwap blocks its removal; venue is free to go
        q = c.post("/queries", json={"text": f"NAME {unique('v')} PATTERN SEQ({t} a) WHERE a.vwap > 1"})
        assert q.status_code == 201, q.text
        blocked = c.patch(f"/event-types/{t}", json={"remove": ["vwap"]})
        assert blocked.status_code == 409 and q.json()["name"] in blocked.text
        gone = c.patch(f"/event-types/{t}", json={"remove": ["venue"]})
        assert gone.status_code == 200 and "venue" not in gone.json()["attributes"], gone.text
        assert c.post("/events", json=[ev(t, t0 + 4)]).json()["accepted"] == 1
        # a smaller lateness is safe with the query active; a larger one is not
        assert c.patch(f"/event-types/{t}", json={"allowed_lateness_ms": 0}).status_code == 200
        assert c.patch(f"/event-types/{t}", json={"allowed_lateness_ms": 5_000}).status_code == 409


def test_query_cost_is_bounded_at_registration(service: ServiceProcess) -> None:
    """5: a SEQ of 10,000 components was accepted (454k partial matches, 1.8 GB); `WITHIN 1e30 days` answered
    500 (OverflowError into SQLite); `WITHIN 100000000 days` was accepted (every restart replays everything)."""
    with service.client() as c:
        t = make_type(c)
        comps = ", ".join(f"{t} v{i}" for i in range(3_500))  # as many as the 64 KiB text limit allows
        big = c.post("/queries", json={"text": f"NAME {unique('big')} PATTERN SEQ({comps})"})
        assert big.status_code == 422, big.text[:300]
        [err] = big.json()["detail"]
        assert "3500 pattern components; at most 64" in err["reason"] and err["line"] == 1, err
        for within, at_number in (("1e30 days", True), ("100000000 days", True), ("1000 days", False)):
            text = f"NAME {unique('w')} PATTERN SEQ({t} a) WITHIN {within}"
            column = text.index(within) + 1 if at_number else 1  # the number; over the limit: the query
            r = c.post("/queries", json={"text": text})
            assert r.status_code == 422, (within, r.text)
            [err] = r.json()["detail"]
            assert err["field"] == "body.text" and err["line"] == 1 and err["column"] == column, err
        ok = c.post("/queries", json={"text": f"NAME {unique('ok')} PATTERN SEQ({t} a, {t} b) WITHIN 30 days"})
        assert ok.status_code == 201, ok.text


def test_lace_keys_list_and_revoke(fresh_db: Database, tmp_path: Path) -> None:
    """CLI: `lace keys list` shows the keys; `lace keys revoke ID` revokes one (401 from then on)."""
    svc = make_service(fresh_db, tmp_path / "data")
    extra = svc.cli("keys", "create", "--scope", "read", "--name", "temp")
    assert extra.returncode == 0, extra.stderr
    token = extra.stdout.strip().splitlines()[-1]
    assert extra.stdout.strip() == token  # the token alone on stdout; the database it went to on stderr (issue 47)
    where = database_label(fresh_db.url)
    assert f"key 'temp' written to the database {where}" in extra.stderr, extra.stderr
    listed = svc.cli("keys", "list")
    assert listed.returncode == 0 and "temp" in listed.stdout
    key_id = next(
        line.split("\t")[0] for line in listed.stdout.splitlines() if line.endswith("\tactive") and "\ttemp\t" in line
    )
    svc.start()
    assert f"lace serve: database {where}" in svc.log_path.read_text(), svc.log_tail()  # the same one
    try:
        with svc.client(token) as c:
            assert c.get("/queries").status_code == 200
        out = svc.cli("keys", "revoke", key_id)
        assert out.returncode == 0 and "revoked" in out.stdout, out.stderr
        with svc.client(token) as c:
            assert c.get("/queries").status_code == 401
        missing = svc.cli("keys", "revoke", "999999")
        assert missing.returncode == 2 and "no API key" in missing.stderr and "Traceback" not in missing.stderr
    finally:
        svc.stop()


def test_query_totals_are_kept_across_pause_and_restart(fresh_db: Database, tmp_path: Path) -> None:
    """CLI/ops: per-query counters kept across restarts (the restart replay does not count its events twice)."""
    svc = make_service(fresh_db, tmp_path / "data", la_checkpoint_s=0.2)
    svc.start()
    try:
        with svc.client() as c:
            t = make_type(c)
            text = f"NAME {unique('q')} PATTERN SEQ({t} a, {t} b) WHERE b.close < a.close WITHIN 1 hour"
            q = c.post("/queries", json={"text": text}).json()
            base = 1_700_000_000_000
            r = c.post("/events", json=[ev(t, base + i * 1000, close=float(10 - i)) for i in range(10)])
            assert r.json()["accepted"] == 10
            totals = c.get(f"/queries/{q['id']}").json()["totals"]
            assert totals["events"] == 10 and totals["matches"] == 45, totals
            assert c.post(f"/queries/{q['id']}/pause").status_code == 200
            assert c.get(f"/queries/{q['id']}").json()["totals"]["events"] == 10
            assert c.post(f"/queries/{q['id']}/resume").status_code == 200
            c.post("/events", json=[ev(t, base + 20_000, close=0.5)])
            assert c.get(f"/queries/{q['id']}").json()["totals"]["events"] == 11
        svc.stop()  # a clean stop records the totals; the restart replays the archive's tail
        svc.start()
        with svc.client() as c:
            totals = c.get(f"/queries/{q['id']}").json()["totals"]
            assert totals["events"] == 11 and totals["matches"] == 45, totals  # not counted twice by the replay
            c.post("/events", json=[ev(t, base + 30_000, close=0.1)])  # matches 0.5 (replayed into the matcher)
            totals = c.get(f"/queries/{q['id']}").json()["totals"]
            assert totals["events"] == 12 and totals["matches"] == 46, totals
            up = c.put(f"/queries/{q['id']}", json={"text": text})
            assert up.status_code == 200 and up.json()["totals"].get("events", 0) == 0  # a new version from zero
    finally:
        svc.stop()


def test_one_expensive_query_cannot_stall_ingest_or_the_other_queries(fresh_db: Database, tmp_path: Path) -> None:
    """5: one 700-event request held the ingest lock for over 120 s (a `DELETE /queries/3` waited 21.6 s).

    A Kleene closure under skip_till_any_match doubles its runs with every event; the query gets at most
    ``LACE_QUERY_MAX_MATCH_S`` of matching per request, then stops (failed, with the reason), while the ingest
    and a cheap query on the same events go on.
    """
    import threading
    import time

    svc = make_service(fresh_db, tmp_path / "data", query_max_match_s=0.5)
    svc.start()
    try:
        with svc.client() as c:
            t = make_type(c)
            heavy = c.post(
                "/queries",
                json={
                    "text": f"NAME {unique('heavy')} PATTERN SEQ({t} a, {t}+ b[], {t} c) "
                    "WHERE c.close > a.close + 100 STRATEGY skip_till_any_match WITHIN 1 day",
                    "pm_capacity": 1_000_000,
                },
            )
            cheap = c.post("/queries", json={"text": f"NAME {unique('cheap')} PATTERN SEQ({t} a) WHERE a.close > 5"})
            other = c.post("/queries", json={"text": f"NAME {unique('other')} PATTERN SEQ({t} a)"})
            assert heavy.status_code == cheap.status_code == other.status_code == 201, heavy.text + cheap.text
            base = 1_700_000_000_000
            events = [ev(t, base + i * 1000, close=float(i % 10)) for i in range(700)]
            answer: dict[str, object] = {}

            def post() -> None:
                with svc.client() as c2:
                    answer["r"] = c2.post("/events", json=events, timeout=600)

            started = time.monotonic()
            poster = threading.Thread(target=post)
            poster.start()
            time.sleep(0.3)
            deleted = c.delete(f"/queries/{other.json()['id']}", timeout=600)  # waits for the ingest at most
            delete_s = time.monotonic() - started
            poster.join(600)
            post_s = time.monotonic() - started
            assert deleted.status_code == 204, deleted.text
            r = answer["r"]
            assert r.status_code == 200, r.text  # type: ignore[attr-defined]
            body = r.json()  # type: ignore[attr-defined]
            assert body["accepted"] == 700
            (err,) = body["query_errors"]
            assert err["query"] == heavy.json()["name"] and "LACE_QUERY_MAX_MATCH_S" in err["reason"], err
            assert post_s < 30 and delete_s < 30, (post_s, delete_s)  # unbounded: minutes
            assert "LACE_QUERY_MAX_MATCH_S" in c.get(f"/queries/{heavy.json()['id']}").json()["stats"]["failed"]
            assert c.get(f"/queries/{cheap.json()['id']}").json()["stats"]["failed"] is None
            # the cheap query matched every event of the request (close 6..9 of each ten), and goes on
            assert c.get(f"/queries/{cheap.json()['id']}").json()["totals"]["matches"] == 280
            more = c.post("/events", json=[ev(t, base + 800_000, close=9.0)])
            assert more.status_code == 200 and more.json()["matches"] == 1 and more.json()["query_errors"] == []
            # resume restarts the failed query (from the events after the call)
            resumed = c.post(f"/queries/{heavy.json()['id']}/resume")
            assert resumed.status_code == 200 and resumed.json()["stats"]["failed"] is None, resumed.text
    finally:
        svc.stop()
