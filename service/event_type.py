"""The event type of the service, converted in one place (issue 24: one model per concept).

An event type is one model, :class:`engine.event_type.EventType`, that ingest, the statements, the
event-time module and the archive all use. The service stores it as an
:class:`~service.db.models.EventTypeRow` and shows it as REST shapes; both conversions are here, and
nowhere else:

* :func:`event_type` — the row as the model (the runtime, the archive and the restart replay get it);
* :func:`public` — the REST shape :class:`~service.schemas.resources.EventTypePublic`;

and the operations of ``/event-types`` (:func:`create`, :func:`update`, :func:`delete`) with their checks
(:func:`checked_event_type`, :func:`check_defaults`, :func:`used_attributes`). Their errors are
:class:`~service.core.errors.ApiError` with their HTTP status, naming the request field.

A new field of a type (such as ``interval``, issue 15) is added to the model, the row and these two
functions; a place that builds the model from a row by itself forgets it (issue 24 item 1: the archive
was opened with interval types as point types and the service did not start).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import select
from sqlalchemy.orm import Session

from engine.event_type import AttrType, EventType, SchemaError
from service.core.errors import ApiError
from service.db.models import EventTypeRow, QueryRow
from service.db.session import now_us
from service.live.events import CHECKERS
from service.schemas.common import iso
from service.schemas.resources import EventTypeCreate, EventTypeEnd, EventTypePublic, EventTypeUpdate

if TYPE_CHECKING:
    from service.live.runtime import LiveRuntime


def event_type(row: EventTypeRow) -> EventType:
    """The :class:`~engine.event_type.EventType` of ``row`` (lateness and maximum duration in microseconds).

    Raises
    ------
    engine.event_type.SchemaError
        When the row is not a valid type (a reserved or malformed name).
    """
    return EventType(
        row.name,
        cast("dict[str, AttrType]", dict(row.attributes)),
        row.partition_key,
        interval=bool(row.interval),
        defaults=dict(row.defaults or {}),
        lateness_us=row.allowed_lateness_us or 0,
        max_duration_us=row.max_duration_us,
        derived=bool(row.derived),
        ended=row.ended_at_us is not None,
        end_ts_us=row.end_ts_us,
    )


def public(row: EventTypeRow) -> EventTypePublic:
    """The REST shape of ``row`` (lateness and maximum duration in milliseconds, times ISO-8601)."""
    return EventTypePublic(
        name=row.name,
        attributes=dict(row.attributes),
        partition_key=row.partition_key,
        defaults=dict(row.defaults or {}),
        allowed_lateness_ms=row.allowed_lateness_us // 1_000,  # given in whole ms
        interval=bool(row.interval),
        max_duration_ms=None if row.max_duration_us is None else row.max_duration_us // 1_000,
        derived=bool(row.derived),
        ended_at=None if row.ended_at_us is None else iso(row.ended_at_us),
        end_ts=None if row.end_ts_us is None else iso(row.end_ts_us),
        created_at=iso(row.created_at_us),
        updated_at=iso(row.updated_at_us),
    )


def checked_event_type(row: EventTypeRow) -> EventType:
    """:func:`event_type` of a row made from a request.

    Raises
    ------
    ApiError
        422 on ``body.partition_key`` when the key is not one of the attributes; 422 on ``body.name`` or
        ``body.attributes`` when the archive refuses the name or an attribute.
    """
    if row.partition_key is not None and row.partition_key not in row.attributes:
        raise ApiError(422, f"partition key {row.partition_key!r} is not one of the attributes", "body.partition_key")
    try:
        return event_type(row)
    except SchemaError as e:
        raise ApiError(422, str(e), "body.name" if "type name" in str(e) else "body.attributes") from None


def check_defaults(defaults: dict[str, Any], attributes: dict[str, str], where: str) -> dict[str, Any]:
    """``defaults`` (attribute -> default value, None: optional without a default) checked against
    ``attributes``: each names an attribute and fits its type (timestamps become int us UTC).

    Raises
    ------
    ApiError
        422 on ``<where>.<attribute>`` otherwise.
    """
    out: dict[str, Any] = {}
    for attr, value in defaults.items():
        if attr not in attributes:
            raise ApiError(422, f"{attr!r} is not an attribute of the type", f"{where}.{attr}")
        if value is None:
            out[attr] = None
            continue
        try:
            out[attr] = CHECKERS[attributes[attr]](value)
        except ValueError as e:
            raise ApiError(422, f"{e} (the attribute is {attributes[attr]})", f"{where}.{attr}") from None
    return out


def used_attributes(session: Session, name: str) -> dict[str, list[str]]:
    """Attribute -> the queries (any state) reading type ``name`` whose text names it (a conservative test)."""
    out: dict[str, list[str]] = {}
    for qname, text, types in session.execute(select(QueryRow.name, QueryRow.text, QueryRow.types)).all():
        if name in types:
            for word in set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)):
                out.setdefault(word, []).append(qname)
    return out


def listing(session: Session) -> list[EventTypeRow]:
    """Every registered event type (derived ones too), by name."""
    return list(session.scalars(select(EventTypeRow).order_by(EventTypeRow.name)))


def get(session: Session, name: str) -> EventTypeRow:
    """The row of event type ``name``; 404 on ``path.name`` when there is none."""
    row = session.get(EventTypeRow, name)
    if row is None:
        raise ApiError(404, f"no event type named {name!r}", "path.name")
    return row


def users(session: Session, name: str, *, active_only: bool = False) -> list[str]:
    """The names of the queries (the active ones with ``active_only``) reading event type ``name``."""
    rows = session.execute(select(QueryRow.name, QueryRow.types, QueryRow.state)).all()
    return [q for q, types, state in rows if name in types and (state == "active" or not active_only)]


def create(session: Session, runtime: LiveRuntime, body: EventTypeCreate) -> EventTypeRow:
    """Register the type of ``body`` (lateness and maximum duration from ms to us) in the archive, the
    database and the runtime.

    Raises
    ------
    ApiError
        422 (:func:`checked_event_type`, :func:`check_defaults`; 422 on ``body.defaults.<key>`` for a default
        of the partition key); 409 on ``body.name`` when the type exists, on ``body.attributes`` when the archive
        holds an incompatible type of that name.
    """
    t = now_us()
    row = EventTypeRow(
        name=body.name,
        attributes=dict(body.attributes),
        partition_key=body.partition_key,
        defaults={},
        allowed_lateness_us=body.allowed_lateness_ms * 1_000,
        interval=body.interval,
        max_duration_us=None if body.max_duration_ms is None else body.max_duration_ms * 1_000,
        created_at_us=t,
        updated_at_us=t,
    )
    etype = checked_event_type(row)
    with runtime.control, runtime.lock:
        if session.get(EventTypeRow, body.name) is not None:
            raise ApiError(409, f"event type {body.name!r} exists (PATCH it to add attributes)", "body.name")
        if runtime.archive is not None:
            try:
                runtime.archive.register(etype)
            except SchemaError as e:
                raise ApiError(
                    409, f"the archive holds an incompatible type {body.name!r}: {e}", "body.attributes"
                ) from None
        defaults = check_defaults(dict(body.defaults), dict(body.attributes), "body.defaults")
        if body.partition_key is not None and body.partition_key in defaults:
            raise ApiError(422, "the partition key cannot be optional", f"body.defaults.{body.partition_key}")
        row.defaults = defaults
        session.add(row)
        session.commit()
        runtime.set_type(event_type(row))
    return row


def update(session: Session, runtime: LiveRuntime, name: str, body: EventTypeUpdate) -> EventTypeRow:
    """Evolve type ``name``: add attributes (optional ones: producers that do not send them keep working), make
    them optional (defaults), remove ones no query names, change the lateness (ms in ``body``, us on the row).

    Raises
    ------
    ApiError
        404 on ``path.name``; 409 on ``body.attributes`` for a changed attribute type or an archive that
        refuses the evolution, on ``body.remove`` for the partition key or an attribute queries use, on
        ``body.allowed_lateness_ms`` for a larger lateness while active queries read the type; 422 on
        ``body.remove`` for an unknown attribute, on ``body.defaults...`` (:func:`check_defaults`, the
        partition key), and those of :func:`checked_event_type`.
    """
    with runtime.control, runtime.lock:
        row = get(session, name)
        merged = dict(row.attributes)
        defaults = dict(row.defaults or {})
        for attr, kind in (body.attributes or {}).items():
            if attr in merged and merged[attr] != kind:
                raise ApiError(
                    409, f"attribute {attr!r} is {merged[attr]}; it cannot become {kind}", f"body.attributes.{attr}"
                )
            if attr not in merged:
                defaults[attr] = None  # added attributes are optional: producers that do not send it keep working
            merged[attr] = kind
        used = used_attributes(session, name) if body.remove else {}
        for attr in body.remove or []:
            if attr not in merged:
                raise ApiError(422, f"{attr!r} is not an attribute of {name}", "body.remove")
            if attr == row.partition_key:
                raise ApiError(409, f"{attr!r} is the partition key; it cannot be removed", "body.remove")
            readers = used.get(attr)
            if readers:
                raise ApiError(409, f"queries use {name}.{attr}: {', '.join(sorted(readers))}", "body.remove")
            del merged[attr]
            defaults.pop(attr, None)
        defaults.update(check_defaults(dict(body.defaults or {}), merged, "body.defaults"))
        if row.partition_key is not None and row.partition_key in defaults:
            raise ApiError(422, "the partition key cannot be optional", f"body.defaults.{row.partition_key}")
        etype = checked_event_type(
            EventTypeRow(name=name, attributes=merged, partition_key=row.partition_key, interval=row.interval)
        )
        lateness_us = row.allowed_lateness_us if body.allowed_lateness_ms is None else body.allowed_lateness_ms * 1_000
        if lateness_us > row.allowed_lateness_us:  # a smaller lateness is always safe: queries get fewer events
            active = users(session, name, active_only=True)
            if active:
                raise ApiError(
                    409,
                    f"a larger lateness needs the queries using {name} paused first ({', '.join(active)})",
                    "body.allowed_lateness_ms",
                )
        if runtime.archive is not None and set(merged) - set(row.attributes):
            try:
                runtime.archive.register(etype)  # the archive keeps removed attributes' columns (past values)
            except SchemaError as e:
                raise ApiError(409, str(e), "body.attributes") from None
        row.attributes = merged
        row.defaults = defaults
        row.allowed_lateness_us = lateness_us
        row.updated_at_us = now_us()
        session.commit()
        runtime.set_type(event_type(row))
    return row


def end(session: Session, runtime: LiveRuntime, name: str) -> EventTypeEnd:
    """End the stream of type ``name`` (Flink's end of input; docs/operations.md, *Ending a stream*): its
    watermark becomes the end of time, so every window, SLLAA subwindow and pending live instance of the statements
    whose every type has ended is closed now (their results are recorded: the rule graph's at once, the
    live-and-archived queries' when their archive requests answer), and ``POST /events`` refuses its events from now
    on. Durable: the row records when it ended (``ended_at_us``) and its newest event time (``end_ts_us``, int us
    UTC); a restart keeps it ended. Ending an ended type again changes nothing (``already_ended``).

    Raises
    ------
    ApiError
        404 on ``path.name``; 409 on ``path.name`` for a derived type (its statements make its events: end their
        input types).
    """
    with runtime.control, runtime.lock:
        row = get(session, name)
        if row.derived:
            reason = f"{name!r} is a derived type (EMIT INTO); end the types its statements read"
            raise ApiError(409, reason, "path.name")
        if row.ended_at_us is not None:
            return EventTypeEnd(
                name=name, end_ts=None if row.end_ts_us is None else iso(row.end_ts_us), ended_at=iso(row.ended_at_us),
                already_ended=True, queries=[], results=0, live_archived_pending={},
            )
        row.ended_at_us = now_us()
        row.end_ts_us = runtime.event_time.newest.get(name)
        row.updated_at_us = row.ended_at_us
        session.commit()
        closed = runtime.end_type(event_type(row))
    return EventTypeEnd(
        name=name, end_ts=None if row.end_ts_us is None else iso(row.end_ts_us), ended_at=iso(row.ended_at_us),
        already_ended=False, queries=closed.queries, results=closed.results, live_archived_pending=closed.pending,
    )


def delete(session: Session, runtime: LiveRuntime, name: str) -> None:
    """Delete event type ``name`` from the database and the runtime (its archive stays).

    Raises
    ------
    ApiError
        404 on ``path.name``; 409 on ``path.name`` while queries (any state) read it.
    """
    with runtime.control, runtime.lock:
        row = get(session, name)
        readers = users(session, name)
        if readers:
            raise ApiError(409, f"queries use {name}: {', '.join(readers)}", "path.name")
        session.delete(row)
        session.commit()
        runtime.drop_type(name)
