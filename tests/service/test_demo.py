"""`lace demo` on the bundled real data: through the service (a real ``lace serve`` child, real Spark, a real
webhook receiver that verifies signatures), its alerts equal what the engine gives on the same events."""
from __future__ import annotations

import hashlib
import hmac
import io
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from cli.demo import (
    SPLITS,
    DemoError,
    load_demo_queries,
    load_queries,
    load_stream,
    plan_streams,
    run_demo,
    split_stream,
)
from cli.webhook_receiver import verify_signature
from engine.compiler import CompiledQuery
from engine.detector import make_detector
from engine.events import Event
from engine.live_archived.plan import LiveArchivedPlan
from engine.live_archived.source import MemoryArchive

DAY_US = 86_400_000_000


def test_bundled_streams_merge_in_time_order_with_unique_ids_and_the_files_attributes():
    events = load_stream()
    assert len(events) == 7_798 + 134_770
    assert all(a.ts <= b.ts for a, b in zip(events, events[1:]))
    assert len({e.id for e in events}) == len(events)
    # nothing added client-side: the queries compute the hour with hour_of_day(ts) (issue 16)
    assert {frozenset(e.attrs) for e in events} == {
        frozenset({"key", "open", "high", "low", "close", "volume"}),
        frozenset({"key", "avg_speed", "vehicle_count", "ndt_kmh"}),
    }


def test_the_first_part_of_each_stream_goes_to_the_archive():
    archived, live = split_stream(load_stream())
    assert len(archived) == 106_238 and len(live) == 36_330
    assert {e.type for e in archived} == {e.type for e in live} == {"bar", "traffic"}
    assert all(e.ts < SPLITS[e.type] for e in archived) and all(e.ts >= SPLITS[e.type] for e in live)


def test_every_demo_query_compiles_and_has_a_name():
    kinds = {str(q.name): type(q) for q in load_queries()}
    assert kinds == {
        "congested_same_hour": LiveArchivedPlan,
        "congestion_episode": CompiledQuery,
        "drop_after_rebound": LiveArchivedPlan,
        "drop_then_rebound": CompiledQuery,
        "jam_not_cleared": CompiledQuery,
    }


def test_streams_are_posted_one_after_the_other_each_with_its_queries():
    archived, live = split_stream(load_stream())
    streams = plan_streams(archived, live, load_demo_queries())
    assert [s.type for s in streams] == ["bar", "traffic"]  # 2013 before 2014: every post in time order
    assert streams[0].last_ts < streams[1].first_ts
    assert {q.name for q in streams[0].queries} == {"drop_after_rebound", "drop_then_rebound"}
    assert {q.name for q in streams[1].queries} == {"congested_same_hour", "congestion_episode", "jam_not_cleared"}
    assert all(e.ts < SPLITS[s.type] for s in streams for e in s.archived)


def test_overlapping_streams_are_refused():
    a = [Event(1, "x", 10, {"key": 1}), Event(2, "y", 20, {"key": 1}), Event(3, "x", 30, {"key": 1})]
    with pytest.raises(DemoError, match="overlap"):
        plan_streams([], a, [])


def test_the_receivers_check_is_the_documented_scheme():
    body, t = b'{"id": 1}', int(time.time())
    mac = hmac.new(b"whsec_x", f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    assert verify_signature("whsec_x", body, f"t={t},v1={mac}")
    assert not verify_signature("whsec_y", body, f"t={t},v1={mac}")
    assert not verify_signature("whsec_x", body + b" ", f"t={t},v1={mac}")
    assert not verify_signature("whsec_x", body, f"t={t},v1={mac}", now_s=t + 301)  # too old
    assert not verify_signature("whsec_x", body, "garbage")
    # during a rotation's grace the header carries the new secret's v1, then the old one's: either verifies
    old = hmac.new(b"whsec_old", f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    assert verify_signature("whsec_x", body, f"t={t},v1={mac},v1={old}")
    assert verify_signature("whsec_old", body, f"t={t},v1={mac},v1={old}")


# ---------------------------------------------------------------------------- the demo through the service


def _traffic_keys(live: list[Event], n: int) -> set[Any]:
    """The ``n`` segments with the most congested live readings (so the slice has results)."""
    counts: dict[Any, int] = {}
    for e in live:
        a = e.attrs
        if e.type == "traffic" and a["vehicle_count"] > 0 and a["avg_speed"] < 0.5 * a["ndt_kmh"]:
            counts[a["key"]] = counts.get(a["key"], 0) + 1
    return set(sorted(counts, key=lambda k: (-counts[k], k))[:n])


def _slice() -> list[Event]:
    """Every bar; 6 traffic segments, 9 archived days and 1 live day of them."""
    events = load_stream()
    _, live = split_stream(events)
    keys = _traffic_keys(live, 6)
    end = SPLITS["traffic"] + DAY_US
    return [
        e
        for e in events
        if e.type == "bar" or (e.attrs["key"] in keys and SPLITS["traffic"] - 9 * DAY_US <= e.ts < end)
    ]


def _expected(text: str, archived: list[Event], live: list[Event], tolerance_us: int) -> set[str]:
    """What the engine gives: the archive holding ``archived`` (then each live event as it passes), ``live`` played
    live, SLLAA for a live-and-archived query (as ``lace replay --backend memory`` does)."""
    from engine.detector import compile as compile_statement

    statement = compile_statement(text)
    memory = MemoryArchive()
    memory.extend(archived)
    det = make_detector(statement, source=memory, algorithm="sllaa", tolerance_us=tolerance_us)
    out = []
    for e in live:
        memory.append(e)
        out += det.push(e)
    out += det.flush()
    return {json.dumps(m.ids(), sort_keys=True) for m in out}


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.integration
def test_the_demo_through_the_service_alerts_what_the_engine_finds(tmp_path: Path) -> None:
    if shutil.which("java") is None:
        pytest.skip("lace demo needs Java 17 on PATH")
    events = _slice()
    tolerance_s = 600.0
    buf = io.StringIO()
    result = run_demo(
        console=Console(file=buf, width=160), show=2, tolerance_s=tolerance_s, workdir=tmp_path, events=events
    )
    out = buf.getvalue()
    archived, live = split_stream(events)
    assert (result["events"], result["archived"], result["live"]) == (len(events), len(archived), len(live))
    assert result["ended"] == ["bar", "traffic"]  # POST /event-types/{name}/end closed the last windows
    assert (tmp_path / "service" / "archive").is_dir() and (tmp_path / "service" / "lace.db").is_file()

    for q in load_demo_queries():
        mine = [e for e in live if e.type in q.types]
        want = _expected(q.text, [e for e in archived if e.type in q.types], mine, round(tolerance_s * 1e6))
        got = [json.dumps(b["events"], sort_keys=True) for b in result["received"][q.name]]
        assert want, f"{q.name}: the slice gives no result; the comparison would be empty"
        assert set(got) == want, f"{q.name}: {len(set(got) - want)} unexpected, {len(want - set(got))} missing"
        assert len(got) == len(want) == result["alerts"][q.name] == result["delivered"][q.name]

    total = sum(result["alerts"].values())
    assert result["webhooks"] == {"received": total, "verified": total, "refused": 0, "redelivered": 0}
    assert set(result["archive_requests"]) == {"congested_same_hour", "drop_after_rebound"}
    assert all(n > 0 for n in result["archive_requests"].values())
    lat = result["latency_ms"]
    assert lat["n"] == total and 0 < lat["p50"] <= lat["p99"]
    assert result["live_events_per_s"] > 0
    assert set(result["seconds"]) == {"total", "service_start", "archived", "live", "finish", "stop"}
    assert "congested_same_hour segment=" in out and "drop_after_rebound symbol=" in out
    assert out.count("drop_then_rebound symbol=") == 2  # show=2 per query
    for word in ("summary", "archive req.", "signature-verified", "latency p50", "events/s", "service start"):
        assert word in out
