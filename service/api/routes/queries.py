"""Queries: ``/queries`` (create from LQL, list, get, update, pause, resume, delete), all live.

Creating or resuming a query starts its matcher at once: it sees every event ingested
after the answer (and none before). Updating restarts it with the new text; pausing drops
its partial matches. Bad LQL is a 422 with the line and column.
"""
from __future__ import annotations

from fastapi import APIRouter, Response
from sqlalchemy import delete, select

from engine.compiler import CompiledQuery, compile_query
from engine.lql.errors import QueryError
from service.api.deps import AdminKey, ReadKey, RuntimeDep, SessionDep
from service.core.errors import ApiError, get_or_404
from service.db.models import QueryRow
from service.db.session import now_us
from service.live.runtime import LiveRuntime
from service.schemas.common import ERRORS, Id, iso
from service.schemas.resources import QueryCreate, QueryPublic, QueryStats, QueryUpdate

router = APIRouter(prefix="/queries", tags=["queries"], responses=ERRORS)  # type: ignore[arg-type]


def public(row: QueryRow, runtime: LiveRuntime) -> QueryPublic:
    lq = runtime.queries.get(row.id)
    stats = None
    if lq is not None:
        s = lq.matcher.stats()
        stats = QueryStats(
            events=s["events"],
            late=s["late"],
            matches=s["emitted"],
            partial_matches=s["live_partial_matches"],
            keys=s["keys"],
        )
    return QueryPublic(
        id=row.id,
        name=row.name,
        text=row.text,
        state=row.state,  # type: ignore[arg-type]
        types=list(row.types),
        window_ms=None if row.window_us is None else row.window_us / 1_000,
        version=row.version,
        active_since=iso(row.active_since_us),
        created_at=iso(row.created_at_us),
        updated_at=iso(row.updated_at_us),
        stats=stats,
    )


def compile_text(text: str, runtime: LiveRuntime) -> CompiledQuery:
    """Compile against the registered types; a QueryError becomes a 422 with line and column."""
    try:
        return compile_query(text, runtime.schemas())
    except QueryError as e:
        raise ApiError(422, e.reason, "body.text", line=e.line, column=e.column) from None
    except RecursionError:
        raise ApiError(422, "the query is nested too deeply", "body.text", line=0, column=0) from None


def _get(session: SessionDep, query_id: int) -> QueryRow:
    return get_or_404(session, QueryRow, query_id, "query")


@router.post("", status_code=201, summary="Register a query (LQL text)")
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
            types=sorted(compiled.types),
            window_us=compiled.window_us,
            version=1,
            active_since_us=t,
            created_at_us=t,
            updated_at_us=t,
        )
        session.add(row)
        session.commit()
        if row.state == "active":
            runtime.start_query(query_id=row.id, name=name, compiled=compiled, active_since_us=t)
    return public(row, runtime)


@router.get("", summary="List queries")
def list_queries(session: SessionDep, runtime: RuntimeDep, _: ReadKey) -> list[QueryPublic]:
    return [public(r, runtime) for r in session.scalars(select(QueryRow).order_by(QueryRow.id))]


@router.get("/{id}", summary="Get a query with its live counters")
def get_query(id: Id, session: SessionDep, runtime: RuntimeDep, _: ReadKey) -> QueryPublic:
    return public(_get(session, id), runtime)


@router.put("/{id}", summary="Replace a query's text (restarts its matcher)")
def update_query(id: Id, body: QueryUpdate, session: SessionDep, runtime: RuntimeDep, _: AdminKey) -> QueryPublic:
    compiled = compile_text(body.text, runtime)
    with runtime.lock:
        row = _get(session, id)
        t = runtime.activation_us()
        row.text = body.text
        row.types = sorted(compiled.types)
        row.window_us = compiled.window_us
        row.version += 1
        row.active_since_us = t
        row.updated_at_us = t
        session.commit()
        if row.state == "active":
            runtime.start_query(query_id=row.id, name=row.name, compiled=compiled, active_since_us=t)
    return public(row, runtime)


@router.post("/{id}/pause", summary="Pause a query (drops its partial matches)")
def pause_query(id: Id, session: SessionDep, runtime: RuntimeDep, _: AdminKey) -> QueryPublic:
    with runtime.lock:
        row = _get(session, id)
        if row.state != "paused":
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
        session.commit()
        runtime.start_query(query_id=row.id, name=row.name, compiled=compiled, active_since_us=t)
    return public(row, runtime)


@router.delete("/{id}", status_code=204, summary="Delete a query with its webhooks, alerts and deliveries")
def delete_query(id: Id, session: SessionDep, runtime: RuntimeDep, _: AdminKey) -> Response:
    with runtime.lock:
        _get(session, id)
        session.execute(delete(QueryRow).where(QueryRow.id == id))
        session.commit()
        runtime.stop_query(id)
    return Response(status_code=204)
