"""Event types: ``/event-types`` (create, list, get, add attributes or change lateness, delete)."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from sqlalchemy import select

from archive.schema import EventType, SchemaError
from service.api.deps import AdminKey, ReadKey, RuntimeDep, SessionDep
from service.core.errors import ApiError
from service.db.models import EventTypeRow, QueryRow
from service.db.session import now_us
from service.live.events import CHECKERS, TypeSpec
from service.schemas.common import ERRORS, Name, iso
from service.schemas.resources import EventTypeCreate, EventTypePublic, EventTypeUpdate

router = APIRouter(prefix="/event-types", tags=["event types"], responses=ERRORS)  # type: ignore[arg-type]


def public(row: EventTypeRow) -> EventTypePublic:
    return EventTypePublic(
        name=row.name,
        attributes=dict(row.attributes),
        partition_key=row.partition_key,
        defaults=dict(row.defaults or {}),
        allowed_lateness_ms=row.allowed_lateness_us / 1_000,
        interval=bool(row.interval),
        max_duration_ms=None if row.max_duration_us is None else row.max_duration_us / 1_000,
        derived=bool(row.derived),
        created_at=iso(row.created_at_us),
        updated_at=iso(row.updated_at_us),
    )


def spec_of(row: EventTypeRow) -> TypeSpec:
    defaults = dict(row.defaults or {})
    return TypeSpec(
        row.name,
        dict(row.attributes),
        row.partition_key,
        row.allowed_lateness_us,
        defaults,
        bool(row.interval),
        row.max_duration_us,
        bool(row.derived),
    )


def _check_defaults(defaults: dict[str, Any], attributes: dict[str, str], where: str) -> dict[str, Any]:
    """Each default names an attribute and fits its type (timestamps become int us); 422 otherwise."""
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


def _used_attributes(session: SessionDep, name: str) -> dict[str, list[str]]:
    """Attribute -> the queries (any state) reading type ``name`` whose text names it (a conservative test)."""
    import re

    out: dict[str, list[str]] = {}
    for qname, text, types in session.execute(select(QueryRow.name, QueryRow.text, QueryRow.types)).all():
        if name in types:
            for word in set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)):
                out.setdefault(word, []).append(qname)
    return out


def _archive_type(name: str, attributes: dict[str, str], key: str | None, interval: bool = False) -> EventType:
    if key is not None and key not in attributes:
        raise ApiError(422, f"partition key {key!r} is not one of the attributes", "body.partition_key")
    try:
        return EventType(name, attributes, key, interval)  # type: ignore[arg-type]
    except SchemaError as e:
        raise ApiError(422, str(e), "body.name" if "type name" in str(e) else "body.attributes") from None


def _get(session: SessionDep, name: str) -> EventTypeRow:
    row = session.get(EventTypeRow, name)
    if row is None:
        raise ApiError(404, f"no event type named {name!r}", "path.name")
    return row


def _users(session: SessionDep, name: str, *, active_only: bool = False) -> list[str]:
    rows = session.execute(select(QueryRow.name, QueryRow.types, QueryRow.state)).all()
    return [q for q, types, state in rows if name in types and (state == "active" or not active_only)]


@router.post("", status_code=201, summary="Register an event type")
def create_event_type(body: EventTypeCreate, session: SessionDep, runtime: RuntimeDep, _: AdminKey) -> EventTypePublic:
    etype = _archive_type(body.name, dict(body.attributes), body.partition_key, body.interval)
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
        defaults = _check_defaults(dict(body.defaults), dict(body.attributes), "body.defaults")
        if body.partition_key is not None and body.partition_key in defaults:
            raise ApiError(422, "the partition key cannot be optional", f"body.defaults.{body.partition_key}")
        t = now_us()
        row = EventTypeRow(
            name=body.name,
            attributes=dict(body.attributes),
            partition_key=body.partition_key,
            defaults=defaults,
            allowed_lateness_us=body.allowed_lateness_ms * 1_000,
            interval=body.interval,
            max_duration_us=None if body.max_duration_ms is None else body.max_duration_ms * 1_000,
            created_at_us=t,
            updated_at_us=t,
        )
        session.add(row)
        session.commit()
        runtime.set_type(spec_of(row))
    return public(row)


@router.get("", summary="List event types")
def list_event_types(session: SessionDep, _: ReadKey) -> list[EventTypePublic]:
    return [public(r) for r in session.scalars(select(EventTypeRow).order_by(EventTypeRow.name))]


@router.get("/{name}", summary="Get an event type")
def get_event_type(name: Name, session: SessionDep, _: ReadKey) -> EventTypePublic:
    return public(_get(session, name))


@router.patch("/{name}", summary="Evolve a type: add, make optional or remove attributes; change the lateness")
def update_event_type(
    name: Name, body: EventTypeUpdate, session: SessionDep, runtime: RuntimeDep, _: AdminKey
) -> EventTypePublic:
    with runtime.control, runtime.lock:
        row = _get(session, name)
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
        used = _used_attributes(session, name) if body.remove else {}
        for attr in body.remove or []:
            if attr not in merged:
                raise ApiError(422, f"{attr!r} is not an attribute of {name}", "body.remove")
            if attr == row.partition_key:
                raise ApiError(409, f"{attr!r} is the partition key; it cannot be removed", "body.remove")
            users = used.get(attr)
            if users:
                raise ApiError(409, f"queries use {name}.{attr}: {', '.join(sorted(users))}", "body.remove")
            del merged[attr]
            defaults.pop(attr, None)
        defaults.update(_check_defaults(dict(body.defaults or {}), merged, "body.defaults"))
        if row.partition_key is not None and row.partition_key in defaults:
            raise ApiError(422, "the partition key cannot be optional", f"body.defaults.{row.partition_key}")
        etype = _archive_type(name, merged, row.partition_key, bool(row.interval))
        lateness_us = row.allowed_lateness_us if body.allowed_lateness_ms is None else body.allowed_lateness_ms * 1_000
        if lateness_us > row.allowed_lateness_us:  # a smaller lateness is always safe: queries get fewer events
            users = _users(session, name, active_only=True)
            if users:
                raise ApiError(
                    409,
                    f"a larger lateness needs the queries using {name} paused first ({', '.join(users)})",
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
        runtime.set_type(spec_of(row))
    return public(row)


@router.delete("/{name}", status_code=204, summary="Delete an event type no query uses (its archive stays)")
def delete_event_type(name: Name, session: SessionDep, runtime: RuntimeDep, _: AdminKey) -> Response:
    with runtime.control, runtime.lock:
        row = _get(session, name)
        users = _users(session, name)
        if users:
            raise ApiError(409, f"queries use {name}: {', '.join(users)}", "path.name")
        session.delete(row)
        session.commit()
        runtime.drop_type(name)
    return Response(status_code=204)
