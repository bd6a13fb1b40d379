"""A statement moved from the service to Spark mid-run loses and repeats nothing (issue 26): the service registers,
ingests and delivers; ``lace stream --archive ... --deliver URL --query-id N`` detects over the service's archive and
sends its matches to the service, which alerts only those it had not alerted itself. Real ``lace serve`` (SQLite),
real webhook receiver, real Spark (local[2])."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app
from cli.service_process import Database, ServiceProcess, make_service, wait_until
from cli.webhook_receiver import Receiver
from engine.events import Event

DEMO = Path(__file__).resolve().parents[2] / "cli" / "demo_data"
QUERY = DEMO / "queries" / "jam_not_cleared.lql"
runner = CliRunner()


def head(src: Path, dst: Path, n: int) -> Path:
    """The header and the first ``n`` events of a CSV event file."""
    lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
    dst.write_text(lines[0] + "".join(lines[1:n + 1]), encoding="utf-8")
    return dst


def post_events(c: httpx.Client, events: list[Event]) -> int:
    """POST the events with their ids (ts as epoch ms), 500 a request; return the alerts the service recorded."""
    alerts = 0
    for i in range(0, len(events), 500):
        body = [{"id": e.id, "type": e.type, "ts": e.ts // 1_000, "attrs": e.attrs} for e in events[i:i + 500]]
        r = c.post("/events", json=body)
        assert r.status_code == 200 and r.json()["rejected"] == 0, r.text
        alerts += r.json()["alerts"]
    return alerts


def open_event_file_events(path: Path) -> list[Event]:
    """The events of an event file, as ``lace match`` reads them."""
    from engine.io import open_event_file

    return list(open_event_file(path).events())


def register_types(c: httpx.Client, events: list[Event]) -> None:
    """Register the event types of ``events`` as ``lace replay`` infers them (partition key ``key``)."""
    from cli.replay import infer_event_types

    for t in infer_event_types(events, "key"):
        body = {"name": t.name, "attributes": dict(t.attributes), "partition_key": t.partition_key}
        assert c.post("/event-types", json=body).status_code == 201


def archive_buffered(c: httpx.Client) -> float:
    """``lace_archive_buffered_events``: events accepted but not yet committed to the archive's Delta tables."""
    found = re.search(r"^lace_archive_buffered_events (\S+)$", c.get("/metrics").text, re.M)
    assert found is not None
    return float(found[1])


def canonical(doc: dict[str, Any]) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """A match's identity and content: its events (variable -> ids) and its RETURN fields."""
    return json.dumps(doc["events"], sort_keys=True), tuple(sorted(doc["fields"].items()))


@pytest.fixture
def service(tmp_path: Path):
    svc = make_service(Database("sqlite", f"sqlite:///{tmp_path / 'lace.db'}"), tmp_path / "data")
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


@pytest.fixture
def receiver():
    r = Receiver()
    r.start()
    yield r
    r.stop()


@pytest.mark.spark
@pytest.mark.slow
def test_statement_moved_to_spark_mid_run_alerts_every_match_once(
    stream_spark, traffic_slice, tmp_path, service: ServiceProcess, receiver: Receiver
):
    """3,000 traffic readings: the service detects ``jam_not_cleared`` over the first 1,500 and delivers its
    alerts; the statement is paused (moved) and the other 1,500 are ingested (archived, not detected); then
    ``lace stream --archive <the service's archive> --checkpoint CK --deliver`` over all of them sends the final
    matches (the service's own among them, not delivered again) and holds back the tail (jams not yet cleared
    within their 30 minutes by the newest reading); the same command with ``--deliver-tail`` (no more events)
    sends those. The receiver got every match of ``lace match`` over the 3,000 (events and fields) exactly once."""
    every = head(traffic_slice, tmp_path / "all.csv", 3_000)
    events = list(open_event_file_events(every))
    with service.client() as c:
        register_types(c, events)
        q = c.post("/queries", json={"text": QUERY.read_text()}).json()
        assert c.post("/webhooks", json={"query_id": q["id"], "url": receiver.url}).status_code == 201

        first = post_events(c, events[:1_500])
        assert first >= 3  # the service found some itself
        assert len(receiver.wait_for(first)) == first
        assert c.post(f"/queries/{q['id']}/pause").json()["state"] == "paused"
        assert post_events(c, events[1_500:]) == 0  # paused: nothing detected by the service
        assert wait_until(lambda: archive_buffered(c) == 0, timeout_s=60), "the archive did not flush"

    out, ck = tmp_path / "stream.jsonl", tmp_path / "ck"
    command = ["stream", "--query", str(QUERY), "--archive", str(service.data_dir / "archive"), "--out", str(out),
               "--checkpoint", str(ck), "--master", "local[2]", "--deliver", service.base, "--query-id", str(q["id"]),
               "--api-key", service.admin]
    result = runner.invoke(app, command, catch_exceptions=False)
    assert result.exit_code == 0, result.output

    match_out = tmp_path / "match.jsonl"
    m = runner.invoke(app, ["match", "--query", str(QUERY), "--events", str(every), "--out", str(match_out)])
    assert m.exit_code == 0, m.output
    assert out.read_bytes() == match_out.read_bytes()
    expected = {canonical(json.loads(line)): json.loads(line) for line in match_out.read_text().splitlines()}
    assert len(expected) > first

    # the first run sends the final matches; those of the end of the events read (jams the readings so far have
    # not cleared within 30 minutes) wait: a newer reading could still clear them
    counts = re.search(r"delivered to \S+ query \d+: (\d+) matches, (\d+) new alerts, (\d+) already alerted",
                       result.output)
    assert counts is not None, result.output
    sent, new, dup = map(int, counts.groups())
    held = len(expected) - sent
    assert held >= 1 and f"not delivered: {held} matches of the end of the events read" in result.output
    assert (new, dup) == (sent - first, first)  # every alert of the service's is among them
    got = receiver.wait_for(sent, timeout_s=60)
    time.sleep(1.0)  # anything more would have arrived by now
    received = [canonical(json.loads(r["body"])) for r in receiver.ok()]
    assert len(received) == len(set(received)) == sent and set(received) <= set(expected)
    newest = max(e.ts for e in events)
    waiting = [expected[k] for k in set(expected) - set(received)]
    assert all(d["start"] + 30 * 60_000_000 >= newest for d in waiting)  # their 30 minutes are not over

    # no more events will come: the same command with --deliver-tail sends the rest, each once
    result = runner.invoke(app, [*command, "--deliver-tail"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"{len(expected)} matches, {held} new alerts, {sent} already alerted" in result.output
    got = receiver.wait_for(len(expected), timeout_s=60)
    time.sleep(1.0)
    got = receiver.ok()
    received = [canonical(json.loads(r["body"])) for r in got]
    assert len(received) == len(expected)  # nothing twice
    assert sorted(received) == sorted(expected)  # nothing lost: lace match's matches over all 3,000, fields too
    assert len({r["headers"]["idempotency-key"] for r in got}) == len(got)


def test_deliver_needs_query_id_and_a_reachable_service(tmp_path):
    """Both options or neither; an unreachable service or a refused key is one error line before Spark starts."""
    from cli.webhook_receiver import free_port

    (tmp_path / "archive").mkdir()
    base = ["stream", "--query", str(QUERY), "--archive", str(tmp_path / "archive"), "--out", str(tmp_path / "o")]
    r = runner.invoke(app, [*base, "--deliver", "http://127.0.0.1:1"])
    assert r.exit_code == 2 and "give both --deliver URL and --query-id N, or neither" in r.output
    r = runner.invoke(app, [*base, "--deliver", "127.0.0.1:8080", "--query-id", "1"])
    assert r.exit_code == 2 and "base URL" in r.output
    url = f"http://127.0.0.1:{free_port()}"
    r = runner.invoke(app, [*base, "--deliver", url, "--query-id", "1"])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot reach the service at {url}"), r.output
    assert "Traceback" not in r.output


def test_deliver_refused_key_and_unknown_query(tmp_path, service: ServiceProcess):
    """A wrong key (401) and an unknown query (404): one error line each, before Spark starts."""
    (tmp_path / "archive").mkdir()
    base = ["stream", "--query", str(QUERY), "--archive", str(tmp_path / "archive"), "--out", str(tmp_path / "o"),
            "--deliver", service.base]
    r = runner.invoke(app, [*base, "--query-id", "1", "--api-key", "lace_wrong"])
    assert r.exit_code == 2 and "401" in r.output and "--api-key" in r.output, r.output
    r = runner.invoke(app, [*base, "--query-id", "424242"], env={"LACE_API_KEY": service.admin})
    assert r.exit_code == 2 and "404 no query with id 424242" in r.output, r.output
    assert len([ln for ln in r.output.splitlines() if ln.strip()]) == 1


@pytest.mark.spark
@pytest.mark.slow
def test_live_and_archived_statement_moved_to_spark_mid_run_alerts_every_result_once(
    stream_spark, tmp_path, service: ServiceProcess, receiver: Receiver
):
    """``drop_after_rebound`` (a live-and-archived statement) over the demo's 7,798 bars: the service runs it over
    the first 3,000 (its live instances joined with its archive) and delivers its results; the pause records the
    results already due, then the rest are ingested (archived, not detected); ``lace stream --archive --deliver``
    over the service's archive sends ``lace replay``'s results over all of them: those the service alerted are
    counted as such and not delivered again, the others are. The receiver got each result once."""
    from tests.service.test_stream_end import no_backlog

    query = DEMO / "queries" / "drop_after_rebound.lql"
    every = DEMO / "bars_1m.csv"
    events = list(open_event_file_events(every))
    with service.client() as c:
        register_types(c, events)
        q = c.post("/queries", json={"text": query.read_text()}).json()
        assert c.post("/webhooks", json={"query_id": q["id"], "url": receiver.url}).status_code == 201
        post_events(c, events[:3_000])
        assert wait_until(lambda: no_backlog(c, q["id"]), timeout_s=120), "the query did not catch up"
        assert c.post(f"/queries/{q['id']}/pause").json()["state"] == "paused"  # the results due recorded first
        first = int(c.get(f"/queries/{q['id']}").json()["totals"]["matches"])
        assert first >= 5  # the service found some itself
        assert len(receiver.wait_for(first, timeout_s=60)) == first
        assert post_events(c, events[3_000:]) == 0
        assert wait_until(lambda: archive_buffered(c) == 0, timeout_s=60), "the archive did not flush"

    out = tmp_path / "stream.jsonl"
    result = runner.invoke(app, [
        "stream", "--query", str(query), "--archive", str(service.data_dir / "archive"), "--out", str(out),
        "--checkpoint", str(tmp_path / "ck"), "--master", "local[2]", "--deliver", service.base,
        "--query-id", str(q["id"]), "--api-key", service.admin,
    ], catch_exceptions=False)
    assert result.exit_code == 0, result.output

    replay_out = tmp_path / "replay.jsonl"
    r = runner.invoke(app, ["replay", "-q", str(query), "-e", str(every), "-a", str(tmp_path / "unused"),
                            "--backend", "memory", "-o", str(replay_out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == replay_out.read_bytes()
    expected = {canonical(json.loads(line)): json.loads(line) for line in replay_out.read_text().splitlines()}
    assert len(expected) > first
    assert (f"delivered to {service.base} query {q['id']}: {len(expected)} matches, {len(expected) - first} new "
            f"alerts, {first} already alerted") in result.output
    receiver.wait_for(len(expected), timeout_s=60)
    time.sleep(1.0)  # anything more would have arrived by now
    got = receiver.ok()
    received = [canonical(json.loads(d["body"])) for d in got]
    assert len(received) == len(expected)  # nothing twice
    assert sorted(received) == sorted(expected)  # nothing lost, fields too
    assert len({d["headers"]["idempotency-key"] for d in got}) == len(got)
