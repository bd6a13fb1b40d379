"""One compile entry point and one detector interface for every kind of query (docs/architecture.md sections 7.5, 7.7).

:func:`compile` turns LQL text into a :data:`Statement`: a live-only :class:`~engine.compiler.CompiledQuery`
or a live-and-archived :class:`~engine.live_archived.plan.LiveArchivedPlan`. :func:`make_detector` builds
what runs it: a :class:`~engine.matcher.Matcher`, or a live-and-archived runner (ALAA, LLAA, OLLAA,
SLLAA, 001 section 4) over an :class:`~engine.live_archived.source.ArchiveSource`. Both satisfy
:class:`Detector` (Flink CEP's ``process`` / ``advanceTime`` split), so callers (``lace replay``, the
service, backfills, the demo) hold one type and never ask which kind they run.

Timestamps are int microseconds UTC.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from engine.compiler import CompiledQuery, compile_query
from engine.events import Event
from engine.intervals.derive import IntervalStatement
from engine.live_archived.base import ArchiveWork
from engine.live_archived.plan import LiveArchivedPlan
from engine.live_archived.runner import make_runner
from engine.live_archived.source import ArchiveSource
from engine.lql.ast import AggregateQuery, FilterRule, IntervalRule, LiveArchivedQuery, Query, Schema
from engine.lql.errors import QueryError
from engine.match import Match
from engine.matcher import Matcher
from engine.options import Algorithm, PmPolicy, Storage
from engine.pm.store import PartialMatchStore
from engine.rules.filters import CompiledFilter
from engine.rules.statements import AggregateStatement

Statement = CompiledQuery | LiveArchivedPlan | IntervalStatement
"""A compiled statement that `compile` returns: a live-only pattern query, a live-and-archived plan, or an
INTERVAL statement (issue 15)."""

RuleStatement = CompiledFilter | AggregateStatement
"""A compiled statement of another kind (layered rules, 003): a filter rule, or a windowed continuous query."""

DEFAULT_TOLERANCE_US = 60_000_000
"""SLLAA's tolerated delay ``T_L`` when none is given: 1 minute of event time."""


@runtime_checkable
class Detector(Protocol):
    """What runs a compiled statement over a stream: the engine's verbs.

    ``push`` offers one event (in (ts, id) order up to the allowed lateness) and returns the results it
    made due; ``advance(watermark_us)`` declares that no event with ``ts <= watermark_us`` will come
    (closes windows, trailing negations, SLLAA subwindows); ``flush`` ends the stream; ``stats`` gives
    the counters (JSON-ready); ``next_deadline`` is the smallest watermark at which ``advance`` would
    emit or close something (None: nothing waits on time), so a caller advances only when needed.
    """

    def push(self, event: Event) -> list[Match]: ...

    def advance(self, watermark_us: int) -> list[Match]: ...

    def flush(self) -> list[Match]: ...

    def stats(self) -> dict[str, Any]: ...

    def next_deadline(self) -> int | None: ...


def compile(  # noqa: A001 - the engine's entry point, as docs/architecture.md section 7.5 names it
    source: str | Query,
    schemas: Schema | None = None,
    *,
    strategy: str | None = None,
) -> Statement:
    """Compile LQL text (or a parsed syntax tree) of any kind of query.

    Parameters
    ----------
    source : str | PatternQuery | LiveArchivedQuery
        The query text or its syntax tree (:func:`engine.lql.parser.parse`).
    schemas : dict, optional
        Event type -> {attribute -> type}; when given, the query is type-checked against it.
    strategy : str, optional
        Overrides a live-only query's STRATEGY (``lace match --strategy``).

    Returns
    -------
    CompiledQuery | LiveArchivedPlan

    Raises
    ------
    QueryError
        With line and column, for a syntax error or a failed semantic check; also for ``strategy``
        given with a live-and-archived query.

    Examples
    --------
    >>> type(compile("PATTERN SEQ(A a, B b) WITHIN 1 min")).__name__
    'CompiledQuery'
    >>> type(compile("LIVE PATTERN A a ARCHIVED PATTERN B b LOOKBACK 1 hour")).__name__
    'LiveArchivedPlan'
    """
    ast: Query
    if isinstance(source, str):
        from engine.lql.parser import parse

        ast = parse(source, schemas)
    else:
        ast = source
    if isinstance(ast, IntervalRule):
        return IntervalStatement(ast)
    if isinstance(ast, (FilterRule, AggregateQuery)):
        kind = "a FILTER rule" if isinstance(ast, FilterRule) else "an AGGREGATE statement"
        raise QueryError.at(ast.pos, f"{kind} is not a pattern query: run it in a rule graph (compile_statement)")
    if isinstance(ast, LiveArchivedQuery):
        if strategy is not None:
            raise QueryError.at(ast.pos, "a strategy override applies to live-only queries; set STRATEGY per side")
        return LiveArchivedPlan(ast, schemas)
    return compile_query(ast, schemas, strategy=strategy)


def compile_statement(
    source: str | Query, schemas: Schema | None = None, *, strategy: str | None = None
) -> Statement | RuleStatement:
    """Compile a statement of any kind: :func:`compile`'s pattern statements, FILTER and AGGREGATE (003).

    Raises
    ------
    QueryError
        With line and column, for a syntax error or a failed semantic check.
    """
    ast: Query
    if isinstance(source, str):
        from engine.lql.parser import parse

        ast = parse(source, schemas)
    else:
        ast = source
    if isinstance(ast, FilterRule):
        return CompiledFilter(ast)
    if isinstance(ast, AggregateQuery):
        return AggregateStatement(ast)
    return compile(ast, schemas, strategy=strategy)


def make_detector(
    statement: Statement | AggregateStatement,
    *,
    source: ArchiveSource | None = None,
    algorithm: str = Algorithm.sllaa,
    tolerance_us: int = DEFAULT_TOLERANCE_US,
    max_batch: int | None = None,
    storage: str = Storage.chain,
    allowed_lateness_us: int | dict[str, int] = 0,
    pm_capacity: int | None = None,
    pm_policy: str = PmPolicy.stpm,
    pm_store: PartialMatchStore | None = None,
    pm_query_id: str | None = None,
    defer: Callable[[ArchiveWork], None] | None = None,
    **options: Any,
) -> Detector:
    """What runs ``statement``: a :class:`Matcher` (live-only) or a live-and-archived runner.

    Parameters
    ----------
    statement : CompiledQuery | LiveArchivedPlan
        From :func:`compile`.
    source : ArchiveSource, optional
        The archive a live-and-archived statement reads (required for one; ignored otherwise).
    algorithm : {"sllaa", "ollaa", "llaa", "alaa"}
        The live-and-archived algorithm (001 section 4).
    tolerance_us : int
        ``T_L``: SLLAA's tolerated delay (subwindows), OLLAA's archive refresh, int microseconds >= 0.
    max_batch : int, optional
        SLLAA: close a subwindow at this many live instances.
    storage : {"chain", "runs"}
        Partial-match storage of skip_till_any_match (live-only queries).
    allowed_lateness_us : int or dict
        Per event type or for all, int microseconds: how far out of order events may arrive.
    pm_capacity, pm_policy, pm_store, pm_query_id
        Partial-match budget, TPM/STPM, store and the name of this detector's rows in the store
        (unique per store; default the query's NAME) of the live matcher (docs/architecture.md section 7.6).
    defer : callable, optional
        Live-and-archived only: receives each archive request (an :class:`ArchiveWork`) instead of
        running it at once, so the caller answers it in the background (SLLAA, LLAA, OLLAA live-driven).
    options
        Other runner options (OLLAA's ``mode``, ``clock``, ALAA's ``window_us``).

    Raises
    ------
    ValueError
        For an unknown algorithm, a negative tolerance, or a live-and-archived statement without
        ``source``.
    """
    if isinstance(statement, IntervalStatement | AggregateStatement):  # INTERVAL (issue 15), AGGREGATE (003)
        return statement.make_detector(allowed_lateness_us)
    if isinstance(statement, CompiledQuery):
        return Matcher(
            statement,
            storage=storage,  # type: ignore[arg-type]
            allowed_lateness_us=allowed_lateness_us,
            pm_capacity=pm_capacity,
            pm_policy=pm_policy,
            pm_store=pm_store,
            pm_query_id=pm_query_id,
        )
    if source is None:
        raise ValueError("a live-and-archived query needs an archive source")
    if tolerance_us < 0:
        raise ValueError("the tolerance T_L must be >= 0 microseconds")
    return make_runner(
        algorithm,
        statement,
        source,
        tolerance_us=tolerance_us,
        max_batch=max_batch,
        pm_capacity=pm_capacity,
        pm_policy=pm_policy,
        pm_store=pm_store,
        pm_query_id=pm_query_id,
        allowed_lateness_us=allowed_lateness_us,
        defer=defer,
        **options,
    )


def detector_for(statement: Statement | RuleStatement, **options: Any) -> Detector | None:
    """What runs ``statement`` in a rule graph or a live-and-archived worker: :func:`make_detector` with
    ``options``, or None for a FILTER rule (the rule graph applies it to each event; it keeps no detector).
    Callers never ask which kind of statement they hold (docs/architecture.md section 5).

    Raises
    ------
    ValueError
        As :func:`make_detector`.
    """
    if isinstance(statement, CompiledFilter):
        return None
    return make_detector(statement, **options)


STATEMENT_CLASSES: dict[str, type[Statement] | type[RuleStatement]] = {
    c.kind: c for c in (CompiledQuery, LiveArchivedPlan, CompiledFilter, AggregateStatement, IntervalStatement)
}
"""Statement kind (``queries.kind``) -> the class that declares it (every class declares its ``kind``)."""


def statement_class(kind: str) -> type[Statement] | type[RuleStatement]:
    """The class of statements of ``kind`` (a stored ``queries.kind``), to ask what it declares
    (``reads_archive``, ``read_by_ingest``, ...) of a statement that is not compiled (a stopped one).

    Raises
    ------
    KeyError
        For a kind no statement class declares.

    Examples
    --------
    >>> statement_class("live_archived").reads_archive
    True
    """
    return STATEMENT_CLASSES[kind]


__all__ = [
    "DEFAULT_TOLERANCE_US",
    "Detector",
    "Statement",
    "RuleStatement",
    "compile",
    "compile_statement",
    "detector_for",
    "make_detector",
    "statement_class",
    "STATEMENT_CLASSES",
]
