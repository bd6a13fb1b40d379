"""The statement (a registered query of any kind) of the service, converted in one place (one model per concept).

A registered statement is stored as a :class:`~service.db.models.QueryRow`; the engine's model of it is the
compiled statement (:func:`engine.detector.compile_statement`: a pattern, a live-and-archived plan, a rule).
Here, and nowhere else:

* :func:`compile_text` / :func:`compile_row` / :func:`as_chosen` — text or row -> compiled statement;
* :func:`kind_of`, :func:`window_us` — what the row records of a compiled statement;
* :func:`apply_options`, :func:`set_version`, :func:`check_flow`, :func:`check_warm` — a request's options, a new
  version and the checks of ``EMIT INTO`` and ``state=warm``, stored on the row;
* :func:`public` (with :func:`stats`) — the REST shape :class:`~service.schemas.resources.QueryPublic`;
  :func:`graph` the rule graph's, :class:`~service.schemas.resources.RuleGraphPublic`;
* :func:`get`, :func:`search` — the rows that ``GET /queries`` reads.

The life of a registered statement (create, start, new version, pause, resume, delete) is
:mod:`service.statement_lifecycle`; the plan of a pattern statement (EXPLAIN, plan trials, plan switches)
:mod:`service.plan`.

Errors are :class:`~service.core.errors.ApiError` with their HTTP status, naming the request field. Times on
rows are int microseconds UTC; the API shape gives ISO-8601 and milliseconds.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from sqlalchemy import select
from sqlalchemy.orm import Session

from engine.compiler import CompiledQuery
from engine.detector import RuleStatement, Statement, compile_statement, statement_class
from engine.durations import parse_duration_us
from engine.event_type import SchemaError
from engine.limits import check_limits
from engine.lql.ast import Schema
from engine.lql.errors import QueryError
from engine.rules.derived import derived_schema
from engine.rules.graph import statement_ast
from service.core.errors import ApiError, get_or_404
from service.db.models import EventTypeRow, QueryRow
from service.db.session import now_us
from service.event_type import checked_event_type, event_type
from service.live.live_query import counter_totals
from service.live.runtime import LiveQuery, LiveRuntime, RunOptions
from service.schemas.common import iso, ms
from service.schemas.resources import (
    Delays,
    Held,
    LiveArchivedStats,
    QueryOptions,
    QueryPublic,
    QueryStats,
    QueryUpdate,
    RuleGraphNode,
    RuleGraphPublic,
    WorkerPlace,
)

AnyStatement = Statement | RuleStatement


# ---------------------------------------------------------------------------------------------------------------
# text / row -> compiled statement


@contextmanager
def lql_errors() -> Iterator[None]:
    """Turn a :class:`~engine.lql.errors.QueryError` raised inside into a 422 on ``body.text`` with its line and
    column, and a too deep nesting (``RecursionError``) into a 422 at line 0, column 0."""
    try:
        yield
    except QueryError as e:
        raise ApiError(422, e.reason, "body.text", line=e.line, column=e.column) from None
    except RecursionError:
        raise ApiError(422, "the query is nested too deeply", "body.text", line=0, column=0) from None


def compile_text(text: str, runtime: LiveRuntime) -> AnyStatement:
    """Compile ``text`` (LQL) against the registered types and check the service's limits (``runtime.limits``).

    Raises
    ------
    ApiError
        422 on ``body.text`` with ``line`` and ``column`` for bad LQL or a limit exceeded.
    """
    with lql_errors():
        statement = compile_statement(text, runtime.schemas())
        check_limits(statement, runtime.limits)  # on the patterns it declares
        return statement


def as_chosen(row: QueryRow, compiled: AnyStatement, schemas: Schema) -> AnyStatement:
    """``compiled`` (``row``'s text) compiled again as its plan trial chose (``row.plan_choice``, issue 16) when
    it has a choice and its plan may be chosen (``chooses_plan``: a live pattern query); else ``compiled`` itself.

    Raises
    ------
    engine.lql.errors.QueryError
        When the stored choice no longer compiles.
    """
    if row.plan_choice and compiled.chooses_plan:
        from engine.nfa.plan_trial import compile_chosen

        return compile_chosen(cast(CompiledQuery, compiled).ast, schemas, row.plan_choice)
    return compiled


def compile_row(row: QueryRow, runtime: LiveRuntime) -> AnyStatement:
    """A registered query's statement, compiled as its plan trial chose (``plan_choice``) when it has one.

    Raises
    ------
    ApiError
        422 on ``body.text`` as :func:`compile_text`.
    """
    return as_chosen(row, compile_text(row.text, runtime), runtime.schemas())


def kind_of(statement: AnyStatement) -> str:
    """The ``kind`` of a compiled statement: live, live_archived, filter, aggregate or interval (what its class
    declares)."""
    return str(statement.kind)


def window_us(statement: AnyStatement) -> int | None:
    """WITHIN of a live-only query; the live side's WITHIN of a live-and-archived one; a window's size (us): what
    the statement declares (``window_us``)."""
    return statement.window_us


# ---------------------------------------------------------------------------------------------------------------
# a request -> the row


def apply_options(row: QueryRow, body: QueryOptions, statement: AnyStatement, runtime: LiveRuntime) -> None:
    """Store ``body``'s options on ``row`` (unset ones keep their values; ``tolerance`` as int us) with the
    statement's ``kind`` and ``emits``.

    Raises
    ------
    ApiError
        422 on ``body.<option>`` when an option does not fit the statement's kind or ``tolerance`` is no
        duration; 422 on ``body.text`` for a live-and-archived query with the archive off.
    """
    live_archived = statement.reads_archive  # what its class declares
    if not statement.patterns:  # no pattern, no partial matches
        for name in ("pm_capacity", "pm_policy"):
            if getattr(body, name) is not None:
                reason = f"{name} applies to pattern queries (PATTERN, LIVE ... ARCHIVED ...)"
                raise ApiError(422, reason, f"body.{name}")
    if not live_archived:
        for name in ("algorithm", "tolerance"):
            if getattr(body, name) is not None:
                raise ApiError(
                    422, f"{name} applies to live-and-archived queries (LIVE ... ARCHIVED ...) only", f"body.{name}"
                )
    if live_archived and runtime.source is None:
        raise ApiError(422, "live-and-archived queries need the archive (LACE_ARCHIVE_ENABLED=true)", "body.text")
    if body.tolerance is not None:
        try:
            row.tolerance_us = parse_duration_us(body.tolerance)
        except ValueError as e:
            raise ApiError(422, str(e), "body.tolerance") from None
    if body.algorithm is not None:
        row.algorithm = body.algorithm.value
    if body.pm_capacity is not None:
        row.pm_capacity = body.pm_capacity
    if body.pm_policy is not None:
        row.pm_policy = body.pm_policy.value
    row.kind = kind_of(statement)
    row.emits = statement.emit_into
    if not live_archived:
        row.algorithm = row.tolerance_us = None


def set_version(row: QueryRow, body: QueryUpdate, compiled: AnyStatement, choice: dict[str, Any] | None) -> None:
    """Store a new version's text on ``row`` (its options are :func:`apply_options`'): the text, the plan choice
    (``choice``; None: the default plan), the types read, the window (us); the version goes up by one, the resume
    point and the counters are cleared."""
    row.text = body.text
    row.plan_choice = choice  # a new text is a new plan: without plan_trial, the default one
    row.types = sorted(compiled.stream_types)
    row.window_us = window_us(compiled)
    row.version += 1
    row.resume_seq = row.checkpoint_seq = None
    row.warmed = False  # until its warm start, if asked, is committed
    row.counters = None  # a new version counts from zero


def check_flow(session: Session, runtime: LiveRuntime, compiled: AnyStatement, query_id: int | None) -> None:
    """EMIT INTO: the derived type must not be an ingested type (one registered with POST /event-types, whether
    or not events came), must keep one schema, and must not close a cycle; registers the derived event type
    (``derived``: producers cannot post it) in the archive, the database and the runtime. Call under the lock.

    Raises
    ------
    ApiError
        409 on ``body.text`` for an ingested type, another schema or an incompatible archived type; 422 on
        ``body.text`` (with line and column) for a cycle, 422 on ``body.name`` / ``body.attributes`` for a type
        the archive cannot hold (:func:`service.event_type.checked_event_type`).
    """
    emit = compiled.emit_into
    if emit is None:
        return
    tree = statement_ast(compiled)
    interval = compiled.emits_intervals  # issue 15: an INTERVAL statement's derived events are interval events
    others = runtime.emitters.get(emit, set()) - ({query_id} if query_id is not None else set())
    schema = derived_schema(tree, runtime.schemas())
    existing = session.get(EventTypeRow, emit)
    if existing is not None and not existing.derived:
        raise ApiError(
            409,
            f"EMIT INTO {emit}: '{emit}' is an ingested event type (registered with POST /event-types); its "
            "events come from producers, and derived ones would move its watermark: emit into another type",
            "body.text",
        )
    if existing is not None and dict(existing.attributes) != schema and others:
        raise ApiError(
            409,
            f"EMIT INTO {emit}: the derived type already has attributes {dict(existing.attributes)} "
            f"(emitted by another statement); this statement's RETURN gives {schema}",
            "body.text",
        )
    exclude = str(query_id) if query_id is not None else None
    reason = runtime.graph.cycle(compiled, exclude=exclude)
    if reason is not None:
        raise ApiError(422, reason, "body.text", line=tree.pos.line, column=tree.pos.column)
    if runtime.archive is not None:  # derived events are archived too; the statement says point or interval
        derived = EventTypeRow(
            name=emit, attributes=schema, partition_key=existing.partition_key if existing else None, interval=interval
        )
        try:
            runtime.archive.register(checked_event_type(derived))
        except SchemaError as e:
            raise ApiError(409, f"EMIT INTO {emit}: the archive holds an incompatible type: {e}", "body.text") from None
    t = now_us()
    if existing is None:
        existing = EventTypeRow(
            name=emit, attributes=schema, partition_key=None, defaults=None, allowed_lateness_us=0,
            created_at_us=t, updated_at_us=t, interval=interval, derived=True,
        )
        session.add(existing)
    elif dict(existing.attributes) != schema:
        existing.attributes = schema
        existing.updated_at_us = t
    runtime.set_type(event_type(existing))


def check_warm(state: str, compiled: AnyStatement, runtime: LiveRuntime) -> None:
    """Refuse ``state=warm`` where it cannot apply (documented in docs/rest.md).

    Raises
    ------
    ApiError
        422 on ``query.state`` for a live-and-archived query, or with the archive off.
    """
    if state != "warm":
        return
    if compiled.reads_archive:
        reason = (
            "state=warm does not apply to a LIVE ... ARCHIVED query: its ARCHIVED side reads the archive for "
            "every live instance, and its live side matches the events ingested after it starts; register it "
            "without state=warm"
        )
        raise ApiError(422, reason, "query.state")
    if runtime.archive is None:
        reason = "state=warm rebuilds the statement's state from the archive, and the archive is off " \
            "(LACE_ARCHIVE_ENABLED=false)"
        raise ApiError(422, reason, "query.state")


# ---------------------------------------------------------------------------------------------------------------
# the API shape


def stats(lq: LiveQuery, watermark_us: int | None = None) -> QueryStats:
    """The REST shape of a running statement's live counters (delays in ms; a live-and-archived query's own
    counters under ``live_archived``; what waits for its watermark ``watermark_us``, int us, under ``held``)."""
    s = lq.stats()
    m = s.get("live_matcher", s)  # a live-and-archived runner nests its live matcher's counters
    la = None
    if lq.compiled.reads_archive:  # its worker's counters
        ollaa = s.get("ollaa") or {}
        decided = [d for d in ollaa.get("decisions", []) if "sel_live" in d]
        delay = s["delay_ms"]
        oldest = s.get("oldest_pending") or {}
        la = LiveArchivedStats(
            algorithm=s["algorithm"],
            tolerance_ms=ms(lq.options.tolerance_us or 0),
            live_instances=s["live_instances"],
            results=s["results"],
            archive_requests=s["archive_requests"],
            archived_events_scanned=s["archived_events_scanned"],
            archived_instances=s["archived_instances"],
            pending_live_instances=s["pending_instances"],
            open_subwindows=(1 if s["pending_instances"] else 0) + s["requests_in_flight"],
            requests_in_flight=s["requests_in_flight"],
            backlog_events=s["backlog_events"],
            backlog_s=s.get("backlog_s", 0.0),
            requests_waiting=s.get("requests_waiting", 0),
            oldest_pending_start=None if oldest.get("start_us") is None else iso(oldest["start_us"]),
            oldest_pending_wait_s=oldest.get("wait_s", 0.0),
            caught_up=s.get("caught_up", s["backlog_events"] == 0 and s["requests_in_flight"] == 0),
            subwindows_closed_idle=(s.get("sllaa") or {}).get("closed_idle"),
            requests_from_memory=(s.get("known_ranges") or {}).get("requests_from_memory"),
            delay=Delays(
                n=delay["n"],
                event_p50_ms=delay["event"]["p50"],
                event_p99_ms=delay["event"]["p99"],
                wall_p50_ms=delay["wall"]["p50"],
                wall_p99_ms=delay["wall"]["p99"],
            ),
            ollaa_mode=ollaa.get("mode"),
            sel_live=decided[-1]["sel_live"] if decided else None,
            sel_archived=decided[-1]["sel_archived"] if decided else None,
            errors=s["errors"],
            close_to_commit_p50_ms=s["close_to_commit_ms"]["p50"],
            close_to_commit_p99_ms=s["close_to_commit_ms"]["p99"],
            worker=WorkerPlace(**s["worker"]) if s.get("worker") else None,
        )
    return QueryStats(
        events=m.get("events", 0),
        late=m.get("late", 0),
        matches=s["results"] if la is not None else m.get("emitted", s.get("results", 0)),
        partial_matches=m.get("live_partial_matches", m.get("open_windows", 0)),
        keys=m.get("keys", m.get("groups", 0)),
        pm_capacity=m.get("pm_capacity"),
        pm_policy=m.get("pm_policy"),
        partial_matches_spilled=m.get("spilled_now", 0),
        spills=m.get("spilled", 0),
        reloads=m.get("reloaded", 0),
        misses=m.get("misses", 0),
        cpu_s=s.get("cpu_s", 0.0),
        held=None if (h := lq.held(watermark_us)) is None else Held(**h),
        live_archived=la,
        failed=s.get("failed"),
    )


def public(row: QueryRow, runtime: LiveRuntime) -> QueryPublic:
    """The REST shape of ``row``: its options as the runtime resolves them (tolerance and window in ms, times
    ISO-8601), with the live counters (``stats``, ``warm``, ``totals``) of its running version; ``algorithm`` and
    ``tolerance_ms`` only for a statement that reads the archive (what the class of its ``kind`` declares)."""
    lq = runtime.queries.get(row.id)
    if lq is not None and lq.version != row.version:
        lq = None  # a new version whose start is deferred to the ingest request in flight: it counts from zero
    live_archived = statement_class(row.kind).reads_archive  # what its class declares (a stopped row has no statement)
    opts = runtime.registry.resolve(RunOptions.from_row(row))
    return QueryPublic(
        id=row.id,
        name=row.name,
        text=row.text,
        state=row.state,  # type: ignore[arg-type]
        kind=row.kind,  # type: ignore[arg-type]
        types=list(row.types),
        emits=row.emits,
        window_ms=None if row.window_us is None else ms(row.window_us),
        algorithm=opts.algorithm if live_archived else None,
        tolerance_ms=ms(opts.tolerance_us or 0) if live_archived else None,
        pm_capacity=opts.pm_capacity,
        pm_policy=opts.pm_policy,
        version=row.version,
        active_since=iso(row.active_since_us),
        created_at=iso(row.created_at_us),
        updated_at=iso(row.updated_at_us),
        stats=None if lq is None else stats(lq, runtime.query_watermark(lq)),
        plan_choice=row.plan_choice,
        warm=None if lq is None else lq.warm,
        totals=lq.totals() if lq is not None else counter_totals(row.counters or {}),
    )


# ---------------------------------------------------------------------------------------------------------------
# reading the rows


def get(session: Session, query_id: int) -> QueryRow:
    """The row of query ``query_id``; 404 on ``path.id`` when there is none."""
    return get_or_404(session, QueryRow, query_id, "query")


def search(
    session: Session, kind: str | None, reads: str | None, emits: str | None, q: str | None
) -> list[QueryRow]:
    """The queries (in id order) of this ``kind``, reading event type ``reads``, emitting ``emits`` and holding
    ``q`` (case-insensitive) in their name or text; None: any."""
    stmt = select(QueryRow).order_by(QueryRow.id)
    if kind is not None:
        stmt = stmt.where(QueryRow.kind == kind)
    if emits is not None:
        stmt = stmt.where(QueryRow.emits == emits)
    rows = list(session.scalars(stmt))
    if reads is not None:
        rows = [r for r in rows if reads in r.types]
    if q is not None:
        needle = q.lower()
        rows = [r for r in rows if needle in r.name.lower() or needle in r.text.lower()]
    return rows


def graph(session: Session) -> RuleGraphPublic:
    """The rule graph of every statement (any state): what each reads and emits, the derived types with their
    emitters, and the edges (emitter, reader) by statement name."""
    rows = list(session.scalars(select(QueryRow).order_by(QueryRow.id)))
    derived: dict[str, list[str]] = {}
    for r in rows:
        if r.emits is not None:
            derived.setdefault(r.emits, []).append(r.name)
    edges = [(src, r.name) for r in rows for t in r.types for src in derived.get(t, ())]
    return RuleGraphPublic(
        statements=[
            RuleGraphNode(id=r.id, name=r.name, kind=r.kind, state=r.state, reads=list(r.types), emits=r.emits)
            for r in rows
        ],
        derived_types=derived,
        edges=edges,
    )
