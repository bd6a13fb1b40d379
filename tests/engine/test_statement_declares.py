"""Every statement class declares what its callers ask (docs/architecture.md section 5): nothing outside engine/
tests its class. The declared attributes a backfill, ``lace replay``, the limits and the service read."""
from __future__ import annotations

import pytest

from engine.detector import compile_statement, statement_class
from engine.limits import QueryLimits, check_limits
from engine.lql.errors import QueryError

MIN = 60_000_000

PATTERN = "NAME p PATTERN SEQ(A a, B b) PARTITION BY k WITHIN 2 min"
SINGLE = "NAME one PATTERN A a WHERE a.v > 1"
LIVE_ARCHIVED = """NAME la LIVE PATTERN SEQ(A a, B b) PARTITION BY k WITHIN 2 min
ARCHIVED PATTERN C c PARTITION BY k WITHIN 5 min LOOKBACK 1 hour JOIN a.k = c.k"""
FILTER = "NAME f FILTER A a DROP WHEN a.v < 0"
AGGREGATE = "NAME g AGGREGATE A a WINDOW TUMBLING 3 min RETURN count(a) AS n"
INTERVAL = "NAME i INTERVAL A a WHEN a.v > 1 PARTITION BY k COVER 5 min RETURN count(a) AS n EMIT INTO ep"


@pytest.mark.parametrize(
    ("text", "kind", "declared", "sides"),
    [  # reads_archive, backfills, chooses_plan, emits_intervals, read_by_ingest, runs_alone
        (PATTERN, "live", (False, True, True, False, False, True), 1),
        (LIVE_ARCHIVED, "live_archived", (True, True, False, False, True, False), 2),
        (FILTER, "filter", (False, False, False, False, True, False), 0),
        (AGGREGATE, "aggregate", (False, False, False, False, False, False), 0),
        (INTERVAL, "interval", (False, True, False, True, False, False), 0),
    ],
)
def test_each_statement_declares_what_callers_ask(
    text: str, kind: str, declared: tuple[bool, ...], sides: int
) -> None:
    s = compile_statement(text)
    names = ("reads_archive", "backfills", "chooses_plan", "emits_intervals", "read_by_ingest", "runs_alone")
    assert s.kind == kind
    assert tuple(getattr(s, n) for n in names) == declared
    assert len(s.patterns) == sides
    assert s.archive_key_attr == ("k" if declared[0] else None)
    cls = statement_class(kind)  # a stored row's kind -> what its class declares (a stopped statement)
    assert type(s) is cls
    assert tuple(getattr(cls, n) for n in names) == declared


def test_spans_a_backfill_reads() -> None:
    assert compile_statement(PATTERN).match_span_us == 2 * MIN
    assert compile_statement(SINGLE).match_span_us == 0  # one event: no span, even without WITHIN
    assert compile_statement("PATTERN SEQ(A a, B b)").match_span_us is None
    assert compile_statement(INTERVAL).match_span_us is None  # a run has no bound on its length
    la = compile_statement(LIVE_ARCHIVED)
    assert la.match_span_us == 2 * MIN and la.window_us == 2 * MIN  # its live side's


def test_limits_apply_to_the_declared_patterns() -> None:
    limits = QueryLimits(max_components=3, max_window_us=4 * MIN)
    check_limits(compile_statement(PATTERN), limits)
    for text in (FILTER, AGGREGATE, INTERVAL):  # no pattern: nothing to limit
        check_limits(compile_statement(text), QueryLimits(max_components=0, max_window_us=0))
    with pytest.raises(QueryError, match="WITHIN"):  # the archived side's 5 min
        check_limits(compile_statement(LIVE_ARCHIVED), limits)
    with pytest.raises(QueryError, match="3 pattern components"):
        check_limits(compile_statement(LIVE_ARCHIVED), QueryLimits(max_components=2))
