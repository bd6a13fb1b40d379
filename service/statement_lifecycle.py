"""The life of a registered statement in the service: registered, started in the live runtime (warmed when
asked), given new versions, paused, resumed, deleted: the operations of ``/queries`` under the runtime's locks.

What a statement is, how its text and row are converted and checked, and its API shape are
:mod:`service.statement`; this module changes rows and the runtime with them. Errors are
:class:`~service.core.errors.ApiError` with their HTTP status, naming the request field; times on rows are
int microseconds UTC.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import delete as sql_delete
from sqlalchemy import select
from sqlalchemy.orm import Session

from engine.detector import statement_class
from service.core.errors import ApiError
from service.db.models import QueryRow
from service.db.session import now_us, session_write_gate
from service.live.runtime import LiveQuery, LiveRuntime, RunOptions
from service.live.warm import warm_query
from service.schemas.resources import QueryCreate, QueryPublic, QueryUpdate
from service.statement import (
    AnyStatement,
    apply_options,
    check_flow,
    check_warm,
    compile_row,
    get,
    public,
    set_version,
    window_us,
)

# ---------------------------------------------------------------------------------------------------------------
# starting


def run(
    runtime: LiveRuntime, row: QueryRow, compiled: AnyStatement, active_since_us: int, *, restored: bool = False
) -> None:
    """Start ``row``'s statement in the runtime (its options, counters and version from the row), seeing the events
    ingested from ``active_since_us`` (int us UTC) on; ``restored``: started again on a restart, with the checkpoint in
    its row (``resume_seq``, ``checkpoint_seq``, ``warmed``) for the restart replay (docs/architecture.md section 4).

    Raises
    ------
    ValueError
        When the runtime cannot run it.
    """
    runtime.registry.start_query(
        query_id=row.id,
        name=row.name,
        compiled=compiled,
        active_since_us=active_since_us,
        options=RunOptions.from_row(row),
        totals=row.counters,
        version=row.version,
        restored=restored,
        resume_seq=row.resume_seq if restored else None,
        checkpoint_seq=row.checkpoint_seq if restored else None,
        warmed=row.warmed if restored else False,
    )


def start(runtime: LiveRuntime, row: QueryRow, compiled: AnyStatement, t: int) -> None:
    """:func:`run` for a request.

    Raises
    ------
    ApiError
        422 on ``body.text`` when the runtime cannot run it.
    """
    try:
        run(runtime, row, compiled, t)
    except ValueError as e:
        raise ApiError(422, str(e), "body.text") from None


def start_as_asked(
    session: Session, runtime: LiveRuntime, row: QueryRow, compiled: AnyStatement, t: int, state: str,
    emit_history: bool,
) -> None:
    """Start an active query (a created or new version) and, for ``?state=warm``, warm it from the archive
    (what warming fed stays on the running query: :func:`~service.statement.public` shows it as ``warm``) and
    commit the warm start on ``row`` before answering: ``warmed``, and the checkpoint warming amounts to
    (``resume_seq``: where the history it was fed starts in the ingest order; ``checkpoint_seq``: the next position,
    what the history completed counts as recorded), so a restart replays it that history again instead of only
    what came after ``t`` (the crash suite's ``update`` fault lost alerts without it). Call under the lock, after
    the commit of the row.

    Raises
    ------
    ApiError
        422 on ``body.text`` (:func:`start`) or on ``query.state`` when warming is refused.
    """
    if row.state != "active":
        return
    start(runtime, row, compiled, t)
    if state != "warm":
        return
    try:
        warm_query(runtime, row.id, emit_history=emit_history)
    except ValueError as e:
        raise ApiError(422, str(e), "query.state") from None
    lq = runtime.queries[row.id]
    if lq.warmed:  # an EMIT INTO statement is not (warm_query): its row stays as a state=reset start leaves it
        row.warmed, row.resume_seq, row.checkpoint_seq = True, lq.resume_seq, lq.checkpoint_seq
        session.commit()


def deferrable(row: QueryRow, compiled: AnyStatement, state: str, runtime: LiveRuntime) -> bool:
    """Whether an update can start without waiting for the ingest request in flight
    (:meth:`StatementRegistry.start_deferred`): an active statement that ingest does not consult while stamping
    events and that emits nothing, before and after (no filter, no live-and-archived query, no EMIT INTO, no
    derived input), updated with ``state=reset``: what the statement classes declare (``read_by_ingest``), the
    stored row's by its ``kind``. Call under ``runtime.control``."""
    if state != "reset" or row.state != "active" or statement_class(row.kind).read_by_ingest or row.emits:
        return False
    if compiled.read_by_ingest or compiled.emit_into is not None:
        return False
    derived = runtime.emitters.keys()
    return not any(t in derived for t in (*row.types, *compiled.stream_types))


# ---------------------------------------------------------------------------------------------------------------
# the operations of /queries


def create(
    session: Session,
    runtime: LiveRuntime,
    body: QueryCreate,
    compiled: AnyStatement,
    choice: dict[str, Any] | None,
    state: str,
    emit_history: bool,
) -> QueryPublic:
    """Register ``body`` (compiled as ``compiled``, the plan ``choice`` of its trial) and start it when active
    (``state``: ``warm`` or ``reset``; ``emit_history``: alert what warming completes).

    Raises
    ------
    ApiError
        422 on ``body.name`` without a name or with one over 128 characters, 409 on ``body.name`` when the name
        is taken; those of :func:`~service.statement.apply_options`, :func:`~service.statement.check_flow`,
        :func:`~service.statement.check_warm` and :func:`start_as_asked`.
    """
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
            window_us=window_us(compiled),
            version=1,
            plan_choice=choice,
            active_since_us=t,
            created_at_us=t,
            updated_at_us=t,
        )
        apply_options(row, body, compiled, runtime)
        check_flow(session, runtime, compiled, None)
        check_warm(state, compiled, runtime)
        session.add(row)
        session.commit()  # before the start: the partial-match store writes to this database too
        start_as_asked(session, runtime, row, compiled, t, state, emit_history)
    return public(row, runtime)  # its warm: what warming fed


SETTLE_S = 120.0
"""How long a pause or an update waits for a live-and-archived query's results already due (wall seconds)."""


def settle(lq: LiveQuery | None, what: str) -> None:
    """Record the results of the running statement ``lq`` already due before it stops (``what``: ``pause`` or
    ``update``; None: not running, nothing to do): a live-and-archived query's completed live instances are
    answered (:meth:`LiveQuery.settle`); its partial matches are not completed. Called twice, under
    ``runtime.control``: first without the runtime's lock (the wait for the archive does not hold ingest up), then
    under it, just before the statement stops (only what ingest offered it meanwhile is left; no event reaches it
    after).

    Raises
    ------
    ApiError
        503 on ``path.id`` when they did not come within :data:`SETTLE_S` (the archive is slow or failing): nothing
        was changed, the statement still runs and the request can be made again.
    """
    if lq is not None and not lq.settle(SETTLE_S):
        raise ApiError(
            503, f"query {lq.name}: the archive did not answer the live-and-archived results it has due within "
            f"{SETTLE_S:.0f} s; nothing was changed and it still runs (try the {what} again)", "path.id",
        )


def update(
    session: Session,
    runtime: LiveRuntime,
    query_id: int,
    body: QueryUpdate,
    compiled: AnyStatement,
    choice: dict[str, Any] | None,
    state: str,
    emit_history: bool,
) -> QueryPublic:
    """A new version of query ``query_id`` from ``body`` (compiled as ``compiled``, the plan ``choice`` of its
    trial): started at once when :func:`deferrable` (:meth:`StatementRegistry.start_deferred`), else after the ingest
    request in flight (:func:`update_now`).

    Raises
    ------
    ApiError
        404 on ``path.id``; 422 on ``query.state`` (:func:`~service.statement.check_warm`); those of :func:`update_now`.
    """
    check_warm(state, compiled, runtime)
    with runtime.control:
        row = get(session, query_id)
        if deferrable(row, compiled, state, runtime):
            apply_options(row, body, compiled, runtime)
            set_version(row, body, compiled, choice)
            opts = RunOptions.from_row(row)

            def commit(t: int) -> None:
                row.active_since_us = row.updated_at_us = t
                with session_write_gate(session):
                    session.commit()

            runtime.registry.start_deferred(
                query_id=row.id, name=row.name, compiled=compiled, options=opts, version=row.version, commit=commit
            )
            return public(row, runtime)
        settle(runtime.queries.get(row.id), "update")  # the long wait, before the lock (update_now settles again)
        return update_now(row, body, compiled, choice, session, runtime, state, emit_history)


def update_now(
    row: QueryRow,
    body: QueryUpdate,
    compiled: AnyStatement,
    choice: dict[str, Any] | None,
    session: Session,
    runtime: LiveRuntime,
    state: str,
    emit_history: bool,
) -> QueryPublic:
    """An update under the runtime lock (after the ingest request in flight), warmed when asked. Call under
    ``runtime.control``.

    Raises
    ------
    ApiError
        Those of :func:`settle`, :func:`~service.statement.apply_options`, :func:`~service.statement.check_flow` and
        :func:`start_as_asked`.
    """
    with runtime.lock:
        settle(runtime.queries.get(row.id), "update")  # the old version's results already due
        t = runtime.activation_us()
        apply_options(row, body, compiled, runtime)
        check_flow(session, runtime, compiled, row.id)
        set_version(row, body, compiled, choice)
        row.active_since_us = t
        row.updated_at_us = t
        session.commit()
        start_as_asked(session, runtime, row, compiled, t, state, emit_history)
    return public(row, runtime)  # its warm: what warming fed


def pause(session: Session, runtime: LiveRuntime, query_id: int) -> QueryPublic:
    """Pause query ``query_id``: its results already due are recorded first (a live-and-archived query's completed
    live instances: the subwindow or live window that holds them is closed and their archive requests answered,
    :meth:`LiveQuery.settle`), then its partial matches are dropped; its counters are kept for the resume.

    Raises
    ------
    ApiError
        404 on ``path.id``; 503 on ``path.id`` from :func:`settle` (the query is left running).
    """
    with runtime.control:
        settle(runtime.queries.get(query_id), "pause")
        with runtime.lock:
            row = get(session, query_id)
            if row.state != "paused":
                lq = runtime.queries.get(row.id)
                if lq is not None:
                    settle(lq, "pause")
                    row.counters = lq.totals()  # kept for the resume
                row.state = "paused"
                row.updated_at_us = now_us()
                session.commit()
            runtime.registry.stop_query(row.id)
    return public(row, runtime)


def resume(session: Session, runtime: LiveRuntime, query_id: int) -> QueryPublic:
    """Resume a paused query or restart a failed one: it sees the events after this call (an active, running
    one is left as it is).

    Raises
    ------
    ApiError
        404 on ``path.id``; 422 on ``body.text`` when its text no longer compiles or cannot run.
    """
    with runtime.control, runtime.lock:
        row = get(session, query_id)
        live = runtime.queries.get(row.id)
        if row.state == "active" and (live is None or live.failed is None):
            return public(row, runtime)
        compiled = compile_row(row, runtime)
        t = runtime.activation_us()
        row.state = "active"
        row.active_since_us = t
        row.updated_at_us = t
        row.resume_seq = row.checkpoint_seq = None
        row.warmed = False  # it sees the events after this call
        session.commit()
        start(runtime, row, compiled, t)
    return public(row, runtime)


def readers_of(session: Session, row: QueryRow) -> list[QueryRow]:
    """The statements that read ``row``'s derived type, and theirs, transitively (for a cascade); none while
    another statement still emits the type."""
    if row.emits is None:
        return []
    if session.execute(select(QueryRow.id).where(QueryRow.emits == row.emits, QueryRow.id != row.id)).first():
        return []  # another statement still emits the type: its readers keep their input
    out: list[QueryRow] = []
    for r in session.scalars(select(QueryRow).order_by(QueryRow.id)):
        if r.id != row.id and row.emits in r.types:
            out.append(r)
            out.extend(x for x in readers_of(session, r) if x not in out)
    return out


def delete(session: Session, runtime: LiveRuntime, query_id: int, cascade: bool) -> None:
    """Delete query ``query_id`` with its webhooks, alerts and deliveries, and with ``cascade`` the statements
    reading its derived type (:func:`readers_of`).

    Raises
    ------
    ApiError
        404 on ``path.id``; 409 on ``query.cascade`` when others read its derived type and ``cascade`` is off.
    """
    with runtime.control, runtime.lock:
        row = get(session, query_id)
        readers = readers_of(session, row)
        if readers and not cascade:
            names = ", ".join(r.name for r in readers)
            raise ApiError(
                409, f"{names} read{'s' if len(readers) == 1 else ''} {row.emits}, emitted by {row.name}: "
                "delete them first or pass ?cascade=true", "query.cascade",
            )
        ids = [row.id, *(r.id for r in readers)]
        session.execute(sql_delete(QueryRow).where(QueryRow.id.in_(ids)))
        session.commit()
        for qid in reversed(ids):
            runtime.registry.stop_query(qid)
