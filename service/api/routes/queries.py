"""Queries: ``/queries`` (create from LQL, list, get, update, pause, resume, delete).

Live-only and live-and-archived queries (``LIVE ... ARCHIVED ... LOOKBACK ... JOIN``) alike.
Creating or resuming a query starts it at once: it sees every event ingested after the answer
(and none before; a live-and-archived query's archived side reads everything archived before
each live instance). Updating restarts it with the new text; pausing drops its partial matches.
Bad LQL is a 422 with the line and column; options that do not fit the query a 422 naming them.
"""
from __future__ import annotations

from fastapi import APIRouter, Response
from sqlalchemy import delete, select

from engine.detector import Statement, is_live_archived
from engine.detector import compile as compile_statement
from engine.durations import parse_duration_us
from engine.limits import check_limits
from engine.lql.errors import QueryError
from service.api.deps import AdminKey, ReadKey, RuntimeDep, SessionDep
from service.core.errors import ApiError, get_or_404
from service.db.models import QueryRow
from service.db.session import now_us
from service.live.runtime import LiveQuery, LiveRuntime, RunOptions
from service.schemas.common import ERRORS, Id, iso
from service.schemas.resources import (
    Delays,
    LiveArchivedStats,
    QueryCreate,
    QueryOptions,
    QueryPublic,
    QueryStats,
    QueryUpdate,
)

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
        events=m["events"],
        late=m["late"],
        matches=s["results"] if la is not None else m["emitted"],
        partial_matches=m["live_partial_matches"],
        keys=m["keys"],
        pm_capacity=m.get("pm_capacity"),
        pm_policy=m.get("pm_policy"),
        partial_matches_spilled=m.get("spilled_now", 0),
        spills=m.get("spilled", 0),
        reloads=m.get("reloaded", 0),
        misses=m.get("misses", 0),
        cpu_s=s.get("cpu_s", 0.0),
        live_archived=la,
    )


def public(row: QueryRow, runtime: LiveRuntime) -> QueryPublic:
    lq = runtime.queries.get(row.id)
    live_archived = row.kind == "live_archived"
    opts = runtime.resolve(RunOptions.from_row(row))
    return QueryPublic(
        id=row.id,
        name=row.name,
        text=row.text,
        state=row.state,  # type: ignore[arg-type]
        kind="live_archived" if live_archived else "live",
        types=list(row.types),
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
        totals=lq.totals() if lq is not None else dict(row.counters or {}),
    )


def compile_text(text: str, runtime: LiveRuntime) -> Statement:
    """Compile against the registered types; a QueryError becomes a 422 with line and column."""
    try:
        statement = compile_statement(text, runtime.schemas())
        check_limits(statement, runtime.limits)
        return statement
    except QueryError as e:
        raise ApiError(422, e.reason, "body.text", line=e.line, column=e.column) from None
    except RecursionError:
        raise ApiError(422, "the query is nested too deeply", "body.text", line=0, column=0) from None


def _apply_options(row: QueryRow, body: QueryOptions, statement: Statement, runtime: LiveRuntime) -> None:
    """Store ``body``'s options on ``row`` (unset ones keep their values); 422 when one does not fit."""
    live_archived = is_live_archived(statement)
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
    row.kind = "live_archived" if live_archived else "live"
    if not live_archived:
        row.algorithm = row.tolerance_us = None


def _start(runtime: LiveRuntime, row: QueryRow, compiled: Statement, t: int) -> None:
    try:
        runtime.start_query(
            query_id=row.id,
            name=row.name,
            compiled=compiled,
            active_since_us=t,
            options=RunOptions.from_row(row),
            totals=row.counters,
        )
    except ValueError as e:
        raise ApiError(422, str(e), "body.text") from None


def _get(session: SessionDep, query_id: int) -> QueryRow:
    return get_or_404(session, QueryRow, query_id, "query")


@router.post("", status_code=201, summary="Register a query (LQL text: live-only or live-and-archived)")
def create_query(body: QueryCreate, session: SessionDep, runtime: RuntimeDep, _: AdminKey) -> QueryPublic:
    compiled = compile_text(body.text, runtime)
    name = body.name or compiled.name
    if not name:
        raise ApiError(422, "give the query a NAME clause or a name field", "body.name")
    if len(name) > 128:
        raise ApiError(422, "the name is longer than 128 characters", "body.name")
    with runtime.lock:
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
            active_since_us=t,
            created_at_us=t,
            updated_at_us=t,
        )
        _apply_options(row, body, compiled, runtime)
        session.add(row)
        session.commit()  # before the start: the partial-match store writes to this database too
        if row.state == "active":
            _start(runtime, row, compiled, t)
    return public(row, runtime)


def _window_us(statement: Statement) -> int | None:
    """WITHIN of a live-only query; the live side's WITHIN of a live-and-archived one."""
    return statement.live.window_us if is_live_archived(statement) else statement.window_us  # type: ignore[union-attr]


@router.get("", summary="List queries")
def list_queries(session: SessionDep, runtime: RuntimeDep, _: ReadKey) -> list[QueryPublic]:
    return [public(r, runtime) for r in session.scalars(select(QueryRow).order_by(QueryRow.id))]


@router.get("/{id}", summary="Get a query with its live counters")
def get_query(id: Id, session: SessionDep, runtime: RuntimeDep, _: ReadKey) -> QueryPublic:
    return public(_get(session, id), runtime)


@router.put("/{id}", summary="Replace a query's text and options (restarts it empty)")
def update_query(id: Id, body: QueryUpdate, session: SessionDep, runtime: RuntimeDep, _: AdminKey) -> QueryPublic:
    compiled = compile_text(body.text, runtime)
    with runtime.lock:
        row = _get(session, id)
        t = runtime.activation_us()
        _apply_options(row, body, compiled, runtime)
        row.text = body.text
        row.types = sorted(compiled.stream_types)
        row.window_us = _window_us(compiled)
        row.version += 1
        row.active_since_us = t
        row.updated_at_us = t
        row.resume_from_us = None
        row.counters = None  # a new version counts from zero
        session.commit()
        if row.state == "active":
            _start(runtime, row, compiled, t)
    return public(row, runtime)


@router.post("/{id}/pause", summary="Pause a query (drops its partial matches)")
def pause_query(id: Id, session: SessionDep, runtime: RuntimeDep, _: AdminKey) -> QueryPublic:
    with runtime.lock:
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


@router.post("/{id}/resume", summary="Resume a paused query (sees the events after this call)")
def resume_query(id: Id, session: SessionDep, runtime: RuntimeDep, _: AdminKey) -> QueryPublic:
    with runtime.lock:
        row = _get(session, id)
        if row.state == "active":
            return public(row, runtime)
        compiled = compile_text(row.text, runtime)
        t = runtime.activation_us()
        row.state = "active"
        row.active_since_us = t
        row.updated_at_us = t
        row.resume_from_us = None
        session.commit()
        _start(runtime, row, compiled, t)
    return public(row, runtime)


@router.delete("/{id}", status_code=204, summary="Delete a query with its webhooks, alerts and deliveries")
def delete_query(id: Id, session: SessionDep, runtime: RuntimeDep, _: AdminKey) -> Response:
    with runtime.lock:
        _get(session, id)
        session.execute(delete(QueryRow).where(QueryRow.id == id))
        session.commit()
        runtime.stop_query(id)
    return Response(status_code=204)
