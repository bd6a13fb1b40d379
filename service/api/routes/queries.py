"""Queries: ``/queries`` (create from LQL, list, get, update, pause, resume, delete, explain).

Live-only and live-and-archived queries (``LIVE ... ARCHIVED ... LOOKBACK ... JOIN``) alike.
Creating or resuming a query starts it at once: it sees every event ingested after the answer
(and none before; a live-and-archived query's archived side reads everything archived before
each live instance). Updating restarts it with the new text; pausing drops its partial matches.
Bad LQL is a 422 with the line and column; options that do not fit the query a 422 naming them.
"""
from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response
from sqlalchemy import delete, select

from archive.schema import SchemaError
from engine.compiler import CompiledQuery
from engine.detector import RuleStatement, Statement, compile_statement, is_live_archived
from engine.durations import parse_duration_us
from engine.intervals.derive import IntervalStatement
from engine.limits import check_limits
from engine.live_archived.plan import LiveArchivedPlan
from engine.lql.errors import QueryError
from engine.rules.derived import derived_schema
from engine.rules.filters import CompiledFilter
from engine.rules.graph import statement_ast
from engine.rules.statements import AggregateStatement
from service.api.deps import AdminKey, ReadKey, RuntimeDep, SessionDep
from service.core.errors import ApiError, get_or_404
from service.db.models import EventTypeRow, QueryRow
from service.db.session import now_us, session_write_gate
from service.event_type import checked_archive_type, type_spec
from service.live.events import EventInvalid, validate_event
from service.live.runtime import LiveQuery, LiveRuntime, RunOptions
from service.schemas.common import ERRORS, Id, iso, parse_wire_ts
from service.schemas.plans import MAX_TRIAL_EVENTS, ExplainRequest, ExplainResult
from service.schemas.resources import (
    ArchiveSlice,
    Delays,
    LiveArchivedStats,
    PlanSwitch,
    QueryCreate,
    QueryOptions,
    QueryPublic,
    QueryStats,
    QueryUpdate,
    RuleGraphNode,
    RuleGraphPublic,
)

AnyStatement = Statement | RuleStatement

log = logging.getLogger(__name__)
router = APIRouter(prefix="/queries", tags=["queries"], responses=ERRORS)  # type: ignore[arg-type]


def _stats(lq: LiveQuery) -> QueryStats:
    s = lq.stats()
    m = s.get("live_matcher", s)  # a live-and-archived runner nests its live matcher's counters
    la = None
    if lq.live_archived:
        ollaa = s.get("ollaa") or {}
        decided = [d for d in ollaa.get("decisions", []) if "sel_live" in d]
        delay = s["delay_ms"]
        la = LiveArchivedStats(
            algorithm=s["algorithm"],
            tolerance_ms=(lq.options.tolerance_us or 0) / 1_000,
            live_instances=s["live_instances"],
            results=s["results"],
            archive_requests=s["archive_requests"],
            archived_events_scanned=s["archived_events_scanned"],
            archived_instances=s["archived_instances"],
            pending_live_instances=s["pending_instances"],
            open_subwindows=(1 if s["pending_instances"] else 0) + s["requests_in_flight"],
            requests_in_flight=s["requests_in_flight"],
            backlog_events=s["backlog_events"],
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
        live_archived=la,
        failed=s.get("failed"),
    )


def public(row: QueryRow, runtime: LiveRuntime) -> QueryPublic:
    lq = runtime.queries.get(row.id)
    if lq is not None and lq.version != row.version:
        lq = None  # a new version whose start is deferred to the ingest request in flight: it counts from zero
    live_archived = row.kind == "live_archived"
    opts = runtime.resolve(RunOptions.from_row(row))
    return QueryPublic(
        id=row.id,
        name=row.name,
        text=row.text,
        state=row.state,  # type: ignore[arg-type]
        kind=row.kind,  # type: ignore[arg-type]
        types=list(row.types),
        emits=row.emits,
        window_ms=None if row.window_us is None else row.window_us / 1_000,
        algorithm=opts.algorithm if live_archived else None,
        tolerance_ms=(opts.tolerance_us or 0) / 1_000 if live_archived else None,
        pm_capacity=opts.pm_capacity,
        pm_policy=opts.pm_policy,
        version=row.version,
        active_since=iso(row.active_since_us),
        created_at=iso(row.created_at_us),
        updated_at=iso(row.updated_at_us),
        stats=None if lq is None else _stats(lq),
        plan_choice=row.plan_choice,
        warm=None if lq is None else lq.warm,
        totals=lq.totals() if lq is not None else dict(row.counters or {}),
    )


def kind_of(statement: AnyStatement) -> str:
    """The ``kind`` of a compiled statement: live, live_archived, filter, aggregate or interval."""
    if is_live_archived(statement):
        return "live_archived"
    if isinstance(statement, CompiledFilter):
        return "filter"
    if isinstance(statement, AggregateStatement):
        return "aggregate"
    if isinstance(statement, CompiledQuery):
        return "live"
    return str(getattr(statement, "kind", "live"))


def compile_text(text: str, runtime: LiveRuntime) -> AnyStatement:
    """Compile against the registered types; a QueryError becomes a 422 with line and column."""
    try:
        statement = compile_statement(text, runtime.schemas())
        if isinstance(statement, (CompiledQuery, type(None))) or is_live_archived(statement):
            check_limits(statement, runtime.limits)  # type: ignore[arg-type]
        return statement
    except QueryError as e:
        raise ApiError(422, e.reason, "body.text", line=e.line, column=e.column) from None
    except RecursionError:
        raise ApiError(422, "the query is nested too deeply", "body.text", line=0, column=0) from None


def compile_row(row: QueryRow, runtime: LiveRuntime) -> AnyStatement:
    """A registered query's statement, compiled as its plan trial chose (``plan_choice``) when it has one."""
    compiled = compile_text(row.text, runtime)
    if row.plan_choice and isinstance(compiled, CompiledQuery):
        from engine.nfa.plan_trial import compile_chosen

        return compile_chosen(compiled.ast, runtime.schemas(), row.plan_choice)
    return compiled


def _trial_for(
    body: QueryCreate | QueryUpdate, compiled: AnyStatement, runtime: LiveRuntime
) -> tuple[AnyStatement, dict[str, Any] | None]:
    """``plan_trial`` of POST/PUT /queries: (the statement compiled as the trial's winner, the choice to keep);
    ``(compiled, None)`` without one. Runs before the ingest lock is taken (Spark may take a while)."""
    if body.plan_trial is None:
        return compiled, None
    if not isinstance(compiled, CompiledQuery):
        raise ApiError(422, "plan_trial applies to live pattern queries (PATTERN ...) only", "body.plan_trial")
    trial, chosen = run_plan_trial(body.plan_trial, runtime, compiled, "body.plan_trial")
    return chosen, trial["choice"]


def _apply_options(row: QueryRow, body: QueryOptions, statement: AnyStatement, runtime: LiveRuntime) -> None:
    """Store ``body``'s options on ``row`` (unset ones keep their values); 422 when one does not fit."""
    live_archived = is_live_archived(statement)
    if not isinstance(statement, CompiledQuery) and not live_archived:
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


def _start(runtime: LiveRuntime, row: QueryRow, compiled: AnyStatement, t: int) -> None:
    try:
        runtime.start_query(
            query_id=row.id,
            name=row.name,
            compiled=compiled,
            active_since_us=t,
            options=RunOptions.from_row(row),
            totals=row.counters,
            version=row.version,
        )
    except ValueError as e:
        raise ApiError(422, str(e), "body.text") from None


def _check_flow(session: SessionDep, runtime: LiveRuntime, compiled: AnyStatement, query_id: int | None) -> None:
    """EMIT INTO: the derived type must not be an ingested type (one registered with POST /event-types, whether
    or not events came), must keep one schema, and must not close a cycle (409 / 422 naming the field);
    registers the derived event type (``derived``: producers cannot post it). Call under the lock."""
    emit = compiled.emit_into
    if emit is None:
        return
    tree = statement_ast(compiled)
    interval = isinstance(compiled, IntervalStatement)  # issue 15: its derived events are interval events
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
            runtime.archive.register(checked_archive_type(derived))
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
    runtime.set_type(type_spec(existing))


def _get(session: SessionDep, query_id: int) -> QueryRow:
    return get_or_404(session, QueryRow, query_id, "query")


StateParam = Annotated[
    Literal["warm", "reset"],
    Query(
        description="warm: rebuild the statement's state from the archive over its span (WITHIN or window) "
        "before it goes live, as if it had always run (the answer's warm says what it fed); reset: start empty. "
        "422 on query.state for a LIVE ... ARCHIVED query (its ARCHIVED side reads the archive itself, its live "
        "side starts with the events after it) and with the archive off."
    ),
]
HistoryParam = Annotated[
    bool, Query(description="With state=warm: record what the history completes as alerts (default: drop it).")
]


def _check_warm(state: str, compiled: AnyStatement, runtime: LiveRuntime) -> None:
    """Refuse ``state=warm`` where it cannot apply (422 on ``query.state``, documented in docs/rest.md)."""
    if state != "warm":
        return
    if is_live_archived(compiled):
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


def _start_as_asked(
    runtime: LiveRuntime, row: QueryRow, compiled: AnyStatement, t: int, state: str, emit_history: bool
) -> None:
    """Start an active query (a created or new version) and, for ``?state=warm``, warm it from the archive
    (what warming fed stays on the running query: :func:`public` shows it as ``warm``). Call under the lock,
    after the commit."""
    if row.state != "active":
        return
    _start(runtime, row, compiled, t)
    if state != "warm":
        return
    try:
        runtime.warm_query(row.id, emit_history=emit_history)
    except ValueError as e:
        raise ApiError(422, str(e), "query.state") from None


@router.post("", status_code=201, summary="Register a query (LQL text: any statement kind)")
def create_query(
    body: QueryCreate,
    session: SessionDep,
    runtime: RuntimeDep,
    _: AdminKey,
    state: StateParam = "reset",
    emit_history: HistoryParam = False,
) -> QueryPublic:
    compiled = compile_text(body.text, runtime)
    compiled, choice = _trial_for(body, compiled, runtime)
    name = body.name or compiled.name
    if not name:
        raise ApiError(422, "give the query a NAME clause or a name field", "body.name")
    if len(name) > 128:
        raise ApiError(422, "the name is longer than 128 characters", "body.name")
    with runtime.control, runtime.lock:
        if session.execute(select(QueryRow.id).where(QueryRow.name == name)).first() is not None:
            raise ApiError(409, f"a query named {name!r} exists", "body.name")
        t = runtime.activation_us()
        row = QueryRow(
            name=name,
            text=body.text,
            state=body.state,
            types=sorted(compiled.stream_types),
            window_us=_window_us(compiled),
            version=1,
            plan_choice=choice,
            active_since_us=t,
            created_at_us=t,
            updated_at_us=t,
        )
        _apply_options(row, body, compiled, runtime)
        _check_flow(session, runtime, compiled, None)
        _check_warm(state, compiled, runtime)
        session.add(row)
        session.commit()  # before the start: the partial-match store writes to this database too
        _start_as_asked(runtime, row, compiled, t, state, emit_history)
    return public(row, runtime)  # its warm: what warming fed


def _window_us(statement: AnyStatement) -> int | None:
    """WITHIN of a live-only query; the live side's WITHIN of a live-and-archived one; a window's size."""
    if isinstance(statement, LiveArchivedPlan):
        return statement.live.window_us
    return statement.window_us


@router.post("/explain", summary="Explain a live query's plan: conjunct order, estimated and measured costs")
def explain_query(body: ExplainRequest, runtime: RuntimeDep, _: ReadKey) -> ExplainResult:
    """The NFA plan with, per node, its conjuncts in evaluation order and 004's cost model (formula 10); with
    ``events`` the query also runs over them (nothing is ingested or stored) and the measured counts are added."""
    from engine.compiler import compile_query
    from engine.events import Event
    from engine.nfa.explain import explain
    from engine.nfa.plan_trial import explain_chosen

    try:
        compiled = compile_query(
            body.text, runtime.schemas(), push_down=body.push_down, estimates=body.estimates
        )
    except QueryError as e:
        raise ApiError(422, e.reason, "body.text", line=e.line, column=e.column) from None
    except RecursionError:
        raise ApiError(422, "the query is nested too deeply", "body.text", line=0, column=0) from None
    except ValueError as e:
        field = "body.estimates" if "estimate" in str(e) else "body.push_down"
        raise ApiError(422, str(e), field) from None
    sample = None
    if body.events is not None:
        with runtime.lock:
            types = dict(runtime.types)
        sample = []
        for i, raw in enumerate(body.events):
            try:
                spec, eid, ts, attrs, ts_end = validate_event(raw, types)
            except EventInvalid as e:
                raise ApiError(422, e.reason, f"body.events[{i}]" + (f".{e.field}" if e.field else "")) from None
            sample.append(Event(eid if eid is not None else i, spec.name, ts, attrs, ts_end))
    if body.using_archive is not None:  # the chosen plan, its model fed with the slice's rates
        trial, chosen = run_plan_trial(body.using_archive, runtime, compiled, "body.using_archive")
        return ExplainResult.model_validate(explain_chosen(chosen, trial))
    try:
        result = explain(compiled, events=sample, rates=body.rates, keys=body.keys)
    except ValueError as e:
        raise ApiError(422, str(e), "body.rates") from None
    return ExplainResult.model_validate(result)


def run_plan_trial(
    where_slice: ArchiveSlice, runtime: LiveRuntime, compiled: CompiledQuery, where: str
) -> tuple[dict[str, Any], CompiledQuery]:
    """``EXPLAIN ... USING ARCHIVE [from, to)`` (issue 16): read the slice through Spark, run the candidate plans
    over it (:mod:`engine.nfa.plan_trial`) and compile the query as the winner. Returns (trial, compiled); the
    trial's ``choice`` is what a registered query keeps. Errors name ``where`` (the body field of the slice)."""
    from engine.nfa.plan_trial import choose_by_trial

    try:
        lo = parse_wire_ts(where_slice.from_)
    except ValueError as e:
        raise ApiError(422, str(e), f"{where}.from") from None
    try:
        hi = parse_wire_ts(where_slice.to)
    except ValueError as e:
        raise ApiError(422, str(e), f"{where}.to") from None
    if hi <= lo:
        raise ApiError(422, "must be after from", f"{where}.to")
    source = runtime.source
    if source is None:
        raise ApiError(409, "a plan trial reads the archive; it is off (LACE_ARCHIVE_ENABLED=false)", where)
    types = sorted(t for t in compiled.types if t in runtime.types)
    try:
        n = source.count(types, None, (lo, hi)) if types else 0
        if n > MAX_TRIAL_EVENTS:
            reason = f"the slice holds {n:,} events of the query's types; at most {MAX_TRIAL_EVENTS:,}: narrow it"
            raise ApiError(422, reason, where)
        events = source.extract(types, None, [(lo, hi)]) if n else []
    except ApiError:
        raise
    except Exception as e:  # Spark or Delta failed: the request can be retried
        log.exception("plan trial: reading the archive failed")
        raise ApiError(503, f"the archive could not be read: {type(e).__name__}", where) from None
    trial, chosen = choose_by_trial(compiled, events, runtime.schemas())
    trial.update({"from": iso(lo), "to": iso(hi)})
    return trial, chosen


Kind = Literal["live", "live_archived", "filter", "aggregate", "interval"]


@router.get("", summary="List and search queries (by kind, read type, emitted type, text)")
def list_queries(
    session: SessionDep,
    runtime: RuntimeDep,
    _: ReadKey,
    kind: Annotated[Kind | None, Query(description="Only statements of this kind.")] = None,
    reads: Annotated[str | None, Query(max_length=64, description="Only statements reading this event type.")] = None,
    emits: Annotated[
        str | None, Query(max_length=64, description="Only statements emitting this derived type (EMIT INTO).")
    ] = None,
    q: Annotated[str | None, Query(max_length=200, description="Case-insensitive text in the name or the LQL.")] = None,
) -> list[QueryPublic]:
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
    return [public(r, runtime) for r in rows]


@router.get("/graph", summary="The rule graph: which statement reads and emits which event type")
def query_graph(session: SessionDep, _: ReadKey) -> RuleGraphPublic:
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


@router.get("/{id:int}", summary="Get a query with its live counters")
def get_query(id: Id, session: SessionDep, runtime: RuntimeDep, _: ReadKey) -> QueryPublic:
    return public(_get(session, id), runtime)


@router.put("/{id:int}", summary="Replace a query's text and options (a new version; ?state=warm keeps no blind spot)")
def update_query(
    id: Id,
    body: QueryUpdate,
    session: SessionDep,
    runtime: RuntimeDep,
    _: AdminKey,
    state: StateParam = "reset",
    emit_history: HistoryParam = False,
) -> QueryPublic:
    """A new version of the statement: it counts from zero and its alerts carry the new version; the old
    version's partial matches are dropped (``state=warm`` rebuilds the new one's state from the archive).

    Atomic with respect to ingest requests: the request in flight when the update arrives is matched wholly by
    the old version, every request sent after the answer wholly by the new one. The answer does not wait for
    the request in flight when the statement is active, stays active, is no filter and no live-and-archived
    query, emits nothing and reads no derived type, and ``state=reset``: the new version starts before the
    next request is matched (issue 14: < 100 ms). Otherwise the update waits for the request in flight."""
    compiled = compile_text(body.text, runtime)
    compiled, choice = _trial_for(body, compiled, runtime)
    _check_warm(state, compiled, runtime)
    with runtime.control:
        row = _get(session, id)
        if _deferrable(row, compiled, state, runtime):
            _apply_options(row, body, compiled, runtime)
            _set_version(row, body, compiled, choice)
            opts = RunOptions.from_row(row)

            def commit(t: int) -> None:
                row.active_since_us = row.updated_at_us = t
                with session_write_gate(session):
                    session.commit()

            runtime.start_deferred(
                query_id=row.id, name=row.name, compiled=compiled, options=opts, version=row.version, commit=commit
            )
            return public(row, runtime)
        return _update_now(row, body, compiled, choice, session, runtime, state, emit_history)


def _deferrable(row: QueryRow, compiled: AnyStatement, state: str, runtime: LiveRuntime) -> bool:
    """Whether an update can start without waiting for the ingest request in flight
    (:meth:`LiveRuntime.start_deferred`): an active statement that ingest does not consult while stamping
    events and that emits nothing, before and after (no filter, no live-and-archived query, no EMIT INTO, no
    derived input), updated with ``state=reset``. Call under ``runtime.control``."""
    if state != "reset" or row.state != "active" or row.kind in ("filter", "live_archived") or row.emits:
        return False
    if kind_of(compiled) in ("filter", "live_archived") or compiled.emit_into is not None:
        return False
    derived = runtime.emitters.keys()
    return not any(t in derived for t in (*row.types, *compiled.stream_types))


def _set_version(row: QueryRow, body: QueryUpdate, compiled: AnyStatement, choice: dict[str, Any] | None) -> None:
    """Store a new version's text on ``row`` (its options are :func:`_apply_options`')."""
    row.text = body.text
    row.plan_choice = choice  # a new text is a new plan: without plan_trial, the default one
    row.types = sorted(compiled.stream_types)
    row.window_us = _window_us(compiled)
    row.version += 1
    row.resume_from_us = None
    row.counters = None  # a new version counts from zero


def _update_now(
    row: QueryRow,
    body: QueryUpdate,
    compiled: AnyStatement,
    choice: dict[str, Any] | None,
    session: SessionDep,
    runtime: LiveRuntime,
    state: str,
    emit_history: bool,
) -> QueryPublic:
    """An update under the runtime lock (after the ingest request in flight), warmed when asked. Call under
    ``runtime.control``."""
    with runtime.lock:
        t = runtime.activation_us()
        _apply_options(row, body, compiled, runtime)
        _check_flow(session, runtime, compiled, row.id)
        _set_version(row, body, compiled, choice)
        row.active_since_us = t
        row.updated_at_us = t
        session.commit()
        _start_as_asked(runtime, row, compiled, t, state, emit_history)
    return public(row, runtime)  # its warm: what warming fed


@router.post("/{id:int}/pause", summary="Pause a query (drops its partial matches)")
def pause_query(id: Id, session: SessionDep, runtime: RuntimeDep, _: AdminKey) -> QueryPublic:
    with runtime.control, runtime.lock:
        row = _get(session, id)
        if row.state != "paused":
            lq = runtime.queries.get(row.id)
            if lq is not None:
                row.counters = lq.totals()  # kept for the resume
            row.state = "paused"
            row.updated_at_us = now_us()
            session.commit()
        runtime.stop_query(row.id)
    return public(row, runtime)


@router.post(
    "/{id:int}/resume",
    summary="Resume a paused query, or restart a failed one (sees the events after this call)",
)
def resume_query(id: Id, session: SessionDep, runtime: RuntimeDep, _: AdminKey) -> QueryPublic:
    with runtime.control, runtime.lock:
        row = _get(session, id)
        live = runtime.queries.get(row.id)
        if row.state == "active" and (live is None or live.failed is None):
            return public(row, runtime)
        compiled = compile_row(row, runtime)
        t = runtime.activation_us()
        row.state = "active"
        row.active_since_us = t
        row.updated_at_us = t
        row.resume_from_us = None
        session.commit()
        _start(runtime, row, compiled, t)
    return public(row, runtime)


@router.post(
    "/{id:int}/plan",
    summary="Switch a pattern query to another plan (a running one loses and repeats no result)",
)
def switch_query_plan(
    id: Id, body: PlanSwitch, session: SessionDep, runtime: RuntimeDep, _: AdminKey
) -> QueryPublic:
    """Compile the query's text as ``plan`` says (or as the winner of ``plan_trial``) and switch to it (004):
    a running query's new plan is rebuilt from the current window's events (archive and recent buffer) and
    takes over without losing or repeating a result; the choice is kept (``plan_choice``) for restarts and
    for a paused query's resume. The text, version and counters stay."""
    from engine.nfa.plan_trial import compile_chosen

    text = _get(session, id).text
    compiled = compile_text(text, runtime)
    if not isinstance(compiled, CompiledQuery):
        raise ApiError(422, "a plan switch applies to live pattern queries (PATTERN ...) only", "body")
    choice: dict[str, Any] | None
    if body.plan_trial is not None:
        trial, chosen = run_plan_trial(body.plan_trial, runtime, compiled, "body.plan_trial")
        choice = trial["choice"]
    else:  # compiled as a restart will compile it from the stored choice (compile_row)
        choice = {"chosen": f"plan {body.plan}", "plan_kind": body.plan, "order": "cost", "estimates": {}, "rates": {}}
        try:
            chosen = compile_chosen(compiled.ast, runtime.schemas(), choice)
        except QueryError as e:
            raise ApiError(422, e.reason, "body.plan") from None
    with runtime.control, runtime.lock:
        row = _get(session, id)
        if row.text != text:
            raise ApiError(409, "the query's text changed while its plan was chosen; try again", "id")
        if row.state == "active":
            try:
                runtime.switch_plan(row.id, chosen)
            except ValueError as e:
                raise ApiError(409, str(e), "id") from None
        row.plan_choice = choice
        row.updated_at_us = now_us()
        session.commit()
    return public(row, runtime)  # its warm: what the switch fed


def _readers_of(session: Any, row: QueryRow) -> list[QueryRow]:
    """The statements that read ``row``'s derived type, and theirs, transitively (for a cascade)."""
    if row.emits is None:
        return []
    if session.execute(select(QueryRow.id).where(QueryRow.emits == row.emits, QueryRow.id != row.id)).first():
        return []  # another statement still emits the type: its readers keep their input
    out: list[QueryRow] = []
    for r in session.scalars(select(QueryRow).order_by(QueryRow.id)):
        if r.id != row.id and row.emits in r.types:
            out.append(r)
            out.extend(x for x in _readers_of(session, r) if x not in out)
    return out


@router.delete(
    "/{id:int}",
    status_code=204,
    summary="Delete a query with its webhooks, alerts and deliveries (409 when another reads its EMIT INTO)",
)
def delete_query(
    id: Id,
    session: SessionDep,
    runtime: RuntimeDep,
    _: AdminKey,
    cascade: Annotated[bool, Query(description="Also delete the statements that read its derived type.")] = False,
) -> Response:
    with runtime.control, runtime.lock:
        row = _get(session, id)
        readers = _readers_of(session, row)
        if readers and not cascade:
            names = ", ".join(r.name for r in readers)
            raise ApiError(
                409, f"{names} read{'s' if len(readers) == 1 else ''} {row.emits}, emitted by {row.name}: "
                "delete them first or pass ?cascade=true", "query.cascade",
            )
        ids = [row.id, *(r.id for r in readers)]
        session.execute(delete(QueryRow).where(QueryRow.id.in_(ids)))
        session.commit()
        for qid in reversed(ids):
            runtime.stop_query(qid)
    return Response(status_code=204)
