"""Queries: ``/queries`` (create from LQL, list, get, update, pause, resume, delete, explain, import results).

Live-only and live-and-archived queries (``LIVE ... ARCHIVED ... LOOKBACK ... JOIN``) alike.
Creating or resuming a query starts it at once: it sees every event ingested after the answer
(and none before; a live-and-archived query's archived side reads everything archived before
each live instance). Updating restarts it with the new text; pausing records the results already due (a
live-and-archived query's completed live instances), then drops its partial matches.
Bad LQL is a 422 with the line and column; options that do not fit the query a 422 naming them.
The statement's model and API shape are :mod:`service.statement`, its life in the runtime
:mod:`service.statement_lifecycle`, its plan :mod:`service.plan`.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Query, Request, Response

from service import alert, plan, statement, statement_lifecycle
from service.api.deps import AdminKey, ReadKey, RuntimeDep, SessionDep
from service.schemas.alerts import MatchIn, ResultsImported
from service.schemas.common import ERRORS, ErrorBody, Id
from service.schemas.plans import ExplainRequest, ExplainResult
from service.schemas.resources import PlanSwitch, QueryCreate, QueryPublic, QueryUpdate, RuleGraphPublic

SETTLE_ERROR: dict[int | str, dict[str, Any]] = {
    503: {
        "model": ErrorBody,
        "description": "A live-and-archived query's results due did not come in time (it still runs; ask again)",
    }
}
"""The answer of a pause or an update when the running query's results due are not recorded in time
(:func:`service.statement_lifecycle.settle`)."""
router = APIRouter(prefix="/queries", tags=["queries"], responses=ERRORS)  # type: ignore[arg-type]

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
Kind = Literal["live", "live_archived", "filter", "aggregate", "interval"]


@router.post("", status_code=201, summary="Register a query (LQL text: any statement kind)")
def create_query(
    body: QueryCreate,
    session: SessionDep,
    runtime: RuntimeDep,
    _: AdminKey,
    state: StateParam = "reset",
    emit_history: HistoryParam = False,
) -> QueryPublic:
    compiled, choice = plan.trial_for(body, statement.compile_text(body.text, runtime), runtime)
    return statement_lifecycle.create(session, runtime, body, compiled, choice, state, emit_history)


@router.post("/explain", summary="Explain a live query's plan: conjunct order, estimated and measured costs")
def explain_query(body: ExplainRequest, runtime: RuntimeDep, _: ReadKey) -> ExplainResult:
    """The NFA plan with, per node, its conjuncts in evaluation order and 004's cost model (formula 10); with
    ``events`` the query also runs over them (nothing is ingested or stored) and the measured counts are added."""
    return plan.explain(runtime, body)


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
    return [statement.public(r, runtime) for r in statement.search(session, kind, reads, emits, q)]


@router.get("/graph", summary="The rule graph: which statement reads and emits which event type")
def query_graph(session: SessionDep, _: ReadKey) -> RuleGraphPublic:
    return statement.graph(session)


@router.get("/{id:int}", summary="Get a query with its live counters")
def get_query(id: Id, session: SessionDep, runtime: RuntimeDep, _: ReadKey) -> QueryPublic:
    return statement.public(statement.get(session, id), runtime)


@router.put(
    "/{id:int}",
    summary="Replace a query's text and options (a new version; ?state=warm keeps no blind spot)",
    responses=SETTLE_ERROR,
)
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
    compiled, choice = plan.trial_for(body, statement.compile_text(body.text, runtime), runtime)
    return statement_lifecycle.update(session, runtime, id, body, compiled, choice, state, emit_history)


@router.post(
    "/{id:int}/pause",
    summary="Pause a query (records the results already due, then drops its partial matches)",
    responses=SETTLE_ERROR,
)
def pause_query(id: Id, session: SessionDep, runtime: RuntimeDep, _: AdminKey) -> QueryPublic:
    return statement_lifecycle.pause(session, runtime, id)


@router.post(
    "/{id:int}/resume",
    summary="Resume a paused query, or restart a failed one (sees the events after this call)",
)
def resume_query(id: Id, session: SessionDep, runtime: RuntimeDep, _: AdminKey) -> QueryPublic:
    return statement_lifecycle.resume(session, runtime, id)


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
    return plan.switch(session, runtime, id, body)


_MATCH_SCHEMA = MatchIn.model_json_schema(ref_template="#/components/schemas/{model}")
_RESULTS_BODY: dict[str, Any] = {
    "requestBody": {
        "required": False,  # an empty body records nothing: a check of the URL, the key and the query
        "content": {
            "application/x-ndjson": {
                "schema": {"type": "string", "description": "one match object (MatchIn) per line, as lace match writes"}
            },
            "application/json": {"schema": {"type": "array", "items": _MATCH_SCHEMA}},
        },
    }
}


@router.post(
    "/{id:int}/results",
    summary="Import matches found elsewhere (lace stream's OUT) as the query's alerts, each delivered once",
    openapi_extra=_RESULTS_BODY,
)
async def import_results(id: Id, request: Request, runtime: RuntimeDep, _: AdminKey) -> ResultsImported:
    """Record the body's matches (NDJSON, one per line, as ``lace match`` / ``lace stream`` write them) as alerts
    of the query, active or paused, in one transaction: each new one delivered to its webhooks; a match the query
    already alerted (the same event ids: the service found it, or an earlier import) is counted in ``duplicates``
    and not delivered again. A line that is not a match object, or one of another statement, is a 422 with its
    ``line``, and nothing is recorded. An empty body records nothing (a check of the key and the query).
    docs/stream.md: the service registers, ingests and delivers, Spark detects."""
    body = await request.body()
    content_type = request.headers.get("content-type", "application/json")
    return await anyio.to_thread.run_sync(lambda: alert.import_results(runtime, id, body, content_type))


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
    statement_lifecycle.delete(session, runtime, id, cascade)
    return Response(status_code=204)
