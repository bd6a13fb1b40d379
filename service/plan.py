"""The plan of a pattern statement in the service (issue 16, 004): ``EXPLAIN``, the plan trial over a slice of
the archive, the plan switch of a registered query.

A plan trial's ``choice`` is stored on the query's row (``plan_choice``) and compiled again from it at every
start (:func:`service.statement.compile_row`). Errors are :class:`~service.core.errors.ApiError` with their HTTP
status, naming the request field; times in a request are ISO-8601 or epoch ms, int us UTC inside.
"""
from __future__ import annotations

import logging
from typing import Any, cast

from sqlalchemy.orm import Session

from engine.compiler import CompiledQuery
from engine.lql.errors import QueryError
from service.core.errors import ApiError
from service.core.faults import crash_point
from service.db.session import now_us
from service.live.events import EventInvalid, validate_event
from service.live.runtime import LiveRuntime
from service.live.warm import switch_plan
from service.schemas.common import iso, wire_ts
from service.schemas.plans import MAX_TRIAL_EVENTS, ExplainRequest, ExplainResult
from service.schemas.resources import ArchiveSlice, PlanSwitch, QueryCreate, QueryPublic, QueryUpdate
from service.statement import AnyStatement, compile_text, get, lql_errors, public

log = logging.getLogger(__name__)


def run_trial(
    where_slice: ArchiveSlice, runtime: LiveRuntime, compiled: CompiledQuery, where: str
) -> tuple[dict[str, Any], CompiledQuery]:
    """``EXPLAIN ... USING ARCHIVE [from, to)`` (issue 16): read the slice through Spark, run the candidate plans
    over it (:mod:`engine.nfa.plan_trial`) and compile the query as the winner. Returns (trial, compiled); the
    trial's ``choice`` is what a registered query keeps, its ``from`` and ``to`` are ISO-8601.

    Raises
    ------
    ApiError
        422 on ``<where>.from`` / ``<where>.to`` for a bad bound or an empty slice, 422 on ``where`` for a slice
        of more than :data:`~service.schemas.plans.MAX_TRIAL_EVENTS` events; 409 on ``where`` with the archive
        off; 503 on ``where`` when the archive could not be read (the request can be retried).
    """
    from engine.nfa.plan_trial import choose_by_trial

    lo = wire_ts(where_slice.from_, f"{where}.from")
    hi = wire_ts(where_slice.to, f"{where}.to")
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


def trial_for(
    body: QueryCreate | QueryUpdate, compiled: AnyStatement, runtime: LiveRuntime
) -> tuple[AnyStatement, dict[str, Any] | None]:
    """``plan_trial`` of POST/PUT /queries: (the statement compiled as the trial's winner, the choice to keep);
    ``(compiled, None)`` without one. Runs before the ingest lock is taken (Spark may take a while).

    Raises
    ------
    ApiError
        422 on ``body.plan_trial`` for a statement that is no pattern query; those of :func:`run_trial`.
    """
    if body.plan_trial is None:
        return compiled, None
    if not compiled.chooses_plan:  # what its class declares: only a live pattern query's plan is chosen
        raise ApiError(422, "plan_trial applies to live pattern queries (PATTERN ...) only", "body.plan_trial")
    trial, chosen = run_trial(body.plan_trial, runtime, cast(CompiledQuery, compiled), "body.plan_trial")
    return chosen, trial["choice"]


def switch(session: Session, runtime: LiveRuntime, query_id: int, body: PlanSwitch) -> QueryPublic:
    """Compile query ``query_id``'s text as ``body.plan`` says (or as the winner of ``body.plan_trial``) and
    switch to it: a running query's new plan is rebuilt from the current window's events and takes over without
    losing or repeating a result; the choice is kept on the row (``plan_choice``). Text, version and counters
    stay.

    Raises
    ------
    ApiError
        404 on ``path.id``; 422 on ``body`` for a statement that is no pattern query, on ``body.plan`` when the
        plan does not compile; 409 on ``id`` when the text changed meanwhile or the running query refuses the
        switch; those of :func:`compile_text` and :func:`run_trial`.
    """
    from engine.nfa.plan_trial import compile_chosen

    text = get(session, query_id).text
    statement = compile_text(text, runtime)
    if not statement.chooses_plan:
        raise ApiError(422, "a plan switch applies to live pattern queries (PATTERN ...) only", "body")
    compiled = cast(CompiledQuery, statement)
    choice: dict[str, Any] | None
    if body.plan_trial is not None:
        trial, chosen = run_trial(body.plan_trial, runtime, compiled, "body.plan_trial")
        choice = trial["choice"]
    else:  # compiled as a restart will compile it from the stored choice (compile_row)
        choice = {"chosen": f"plan {body.plan}", "plan_kind": body.plan, "order": "cost", "estimates": {}, "rates": {}}
        try:
            chosen = compile_chosen(compiled.ast, runtime.schemas(), choice)
        except QueryError as e:
            raise ApiError(422, e.reason, "body.plan") from None
    with runtime.control, runtime.lock:
        row = get(session, query_id)
        if row.text != text:
            raise ApiError(409, "the query's text changed while its plan was chosen; try again", "id")
        if row.state == "active":
            try:
                switch_plan(runtime, row.id, chosen)
            except ValueError as e:
                raise ApiError(409, str(e), "id") from None
            crash_point("plan.switch.before_commit")  # the crash suite: the new plan running, its choice not kept
        row.plan_choice = choice
        row.updated_at_us = now_us()
        session.commit()
    return public(row, runtime)  # its warm: what the switch fed


def explain(runtime: LiveRuntime, body: ExplainRequest) -> ExplainResult:
    """The NFA plan of ``body.text`` with, per node, its conjuncts in evaluation order and 004's cost model
    (formula 10); with ``body.events`` the query also runs over them (nothing is ingested or stored) and the
    measured counts are added; with ``body.using_archive`` the plan a trial over that slice chooses.

    Raises
    ------
    ApiError
        422 on ``body.text`` (with line and column) for bad LQL, on ``body.estimates`` / ``body.push_down`` /
        ``body.rates`` for values that do not fit, on ``body.events[i]...`` for an invalid event; those of
        :func:`run_trial`.
    """
    from engine.compiler import compile_query
    from engine.events import Event
    from engine.nfa.explain import explain as explain_plan
    from engine.nfa.plan_trial import explain_chosen

    try:
        with lql_errors():
            compiled = compile_query(
                body.text, runtime.schemas(), push_down=body.push_down, estimates=body.estimates
            )
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
        trial, chosen = run_trial(body.using_archive, runtime, compiled, "body.using_archive")
        return ExplainResult.model_validate(explain_chosen(chosen, trial))
    try:
        result = explain_plan(compiled, events=sample, rates=body.rates, keys=body.keys)
    except ValueError as e:
        raise ApiError(422, str(e), "body.rates") from None
    return ExplainResult.model_validate(result)
