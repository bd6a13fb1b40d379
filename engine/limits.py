"""Limits on what one query may cost: components, window, LOOKBACK (issue 13; settings of the service).

A query over the limits is refused with a :class:`~engine.lql.errors.QueryError` at the clause that
exceeds them, before it runs: a ``SEQ`` of 10,000 components built 454k partial matches from ~1,000
events, and a window of 10^8 days made every restart replay the whole archive.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.live_archived.plan import LiveArchivedPlan
from engine.lql.ast import components
from engine.lql.errors import QueryError

if TYPE_CHECKING:
    from engine.detector import RuleStatement, Statement


@dataclass(frozen=True, slots=True)
class QueryLimits:
    """Upper bounds for one query; None: no bound.

    Attributes
    ----------
    max_components : int | None
        Pattern components (over both sides of a live-and-archived query).
    max_window_us : int | None
        WITHIN, int microseconds (each side).
    max_lookback_us : int | None
        LOOKBACK, int microseconds.
    max_match_s : float | None
        CPU seconds a query may spend matching one batch of ingested events; past it the query stops
        (``RuleGraph.time_budget_s``), so one query cannot stall the ingest or the others (issue 13).
    """

    max_components: int | None = 64
    max_window_us: int | None = 31 * 86_400_000_000
    max_lookback_us: int | None = 366 * 86_400_000_000
    max_match_s: float | None = 5.0


def _days(us: int) -> str:
    return f"{us / 86_400_000_000:g} days"


def check_limits(statement: Statement | RuleStatement, limits: QueryLimits) -> None:
    """Refuse ``statement`` when it exceeds ``limits``: the limits apply to the patterns it declares
    (``statement.patterns``: none for FILTER, AGGREGATE and INTERVAL statements) and to LOOKBACK.

    Raises
    ------
    QueryError
        At the pattern (too many components), WITHIN or LOOKBACK, with the limit and the setting.
    """
    sides = statement.patterns
    if limits.max_components is not None:
        n = sum(len(components(side.ast.pattern)) for side in sides)
        if n > limits.max_components:
            raise QueryError.at(
                sides[0].ast.pattern.pos,
                f"the query has {n} pattern components; at most {limits.max_components} (LACE_MAX_QUERY_COMPONENTS)",
            )
    for side in sides:
        w = side.window_us
        if limits.max_window_us is not None and w is not None and w > limits.max_window_us:
            raise QueryError.at(
                side.ast.pos,
                f"WITHIN {_days(w)} is longer than the limit of {_days(limits.max_window_us)} (LACE_MAX_WINDOW_S)",
            )
    if isinstance(statement, LiveArchivedPlan) and limits.max_lookback_us is not None:
        lb = statement.lookback_us
        if lb > limits.max_lookback_us:
            raise QueryError.at(
                statement.ast.pos,
                f"LOOKBACK {_days(lb)} is longer than the limit of {_days(limits.max_lookback_us)} "
                "(LACE_MAX_LOOKBACK_S)",
            )
