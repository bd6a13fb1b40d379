"""``lace match`` with several statements: one rule graph over the file, every statement's output named."""
from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()

EVENTS = (
    "id,type,ts,k,x\n"
    "1,R,1000,a,60\n"
    "2,R,1000,a,60\n"  # a duplicate (k, ts): dropped by the filter
    "3,R,2000,a,-1\n"  # dropped by DROP WHEN
    "4,R,3000,a,70\n"
    "5,R,4000,b,80\n"
    "6,R,5000,a,75\n"
)
RULES = """
NAME clean FILTER R r DROP DUPLICATE k, ts WITHIN 1 min DROP WHEN r.x < 0;
NAME high PATTERN SEQ(R r) WHERE r.x > 50 RETURN r.k AS k, r.x AS x EMIT INTO H
"""
RISE = "NAME rise PATTERN SEQ(H a, H b) WHERE b.x > a.x PARTITION BY k STRATEGY skip_till_next_match"


def test_statements_from_two_files_run_as_one_graph(tmp_path: Path) -> None:
    (tmp_path / "e.csv").write_text(EVENTS)
    (tmp_path / "rules.lql").write_text(RULES)
    (tmp_path / "rise.lql").write_text(RISE)
    result = runner.invoke(
        app,
        ["match", "-q", str(tmp_path / "rules.lql"), "-q", str(tmp_path / "rise.lql"), "-e", str(tmp_path / "e.csv"),
         "--stats"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{\"query\"")]
    by_query: dict[str, list[dict]] = {}
    for row in rows:
        by_query.setdefault(row["query"], []).append(row)
    assert [r["fields"] for r in by_query["high"]] == [
        {"k": "a", "x": 60}, {"k": "a", "x": 70}, {"k": "b", "x": 80}, {"k": "a", "x": 75}
    ]
    assert [(r["start"], r["end"]) for r in by_query["rise"]] == [(1_000_000, 3_000_000), (3_000_000, 5_000_000)]
    stats = json.loads(result.stderr.strip().splitlines()[-1])
    assert stats["statements"]["clean"]["dropped_duplicate"] == 1
    assert stats["statements"]["clean"]["dropped_when"] == 1


def test_a_cycle_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "e.csv").write_text(EVENTS)
    (tmp_path / "c.lql").write_text(
        "NAME a PATTERN SEQ(R r) RETURN r.x AS x EMIT INTO S;\nNAME b PATTERN SEQ(S s) RETURN s.x AS x EMIT INTO R"
    )
    result = runner.invoke(app, ["match", "-q", str(tmp_path / "c.lql"), "-e", str(tmp_path / "e.csv")])
    assert result.exit_code == 2
    cycle = "EMIT INTO R would create a cycle R \u2192 S \u2192 R"
    assert result.stderr.strip() == f"error: {tmp_path / 'c.lql'}:2:1: {cycle}"


def test_a_file_holding_a_derived_type_is_refused(tmp_path: Path) -> None:
    """Issue 24 item 5: ``EMIT INTO H`` while the file holds events of H (an ingested type) is an error naming
    the event and the statement, not derived and ingested H events mixed."""
    (tmp_path / "e.csv").write_text(EVENTS + "7,H,6000,a,99\n")
    (tmp_path / "rules.lql").write_text(RULES)
    (tmp_path / "rise.lql").write_text(RISE)
    result = runner.invoke(
        app,
        ["match", "-q", str(tmp_path / "rules.lql"), "-q", str(tmp_path / "rise.lql"), "-e", str(tmp_path / "e.csv")],
    )
    assert result.exit_code == 2, result.output
    err = result.stderr.strip().splitlines()[-1]
    assert err.startswith(f"error: {tmp_path / 'e.csv'} line 8: "), err
    assert "'H' is derived by high (EMIT INTO H)" in err and "cannot be read from the input" in err, err
