"""`lace demo` on the bundled real data: every query alerts, and the counts are stable."""
from __future__ import annotations

import io

from rich.console import Console

from service.demo import load_queries, load_stream, run_demo


def test_bundled_streams_merge_in_time_order_with_unique_ids():
    events = load_stream()
    assert len(events) == 7_798 + 134_770
    assert all(a.ts <= b.ts for a, b in zip(events, events[1:]))
    assert len({e.id for e in events}) == len(events)


def test_every_demo_query_compiles_and_has_a_name():
    names = [q.name for q in load_queries()]
    assert names == ["congestion_episode", "drop_then_rebound", "jam_not_cleared"]


def test_demo_prints_alerts_and_a_summary():
    buf = io.StringIO()
    result = run_demo(console=Console(file=buf, width=120), show=2)
    out = buf.getvalue()
    # the numbers lace match gives for each query over its own file
    assert result["alerts"] == {"congestion_episode": 577, "drop_then_rebound": 110, "jam_not_cleared": 471}
    assert "congestion_episode segment=" in out and "summary" in out
    assert out.count("drop_then_rebound symbol=") == 2  # show=2 per query
