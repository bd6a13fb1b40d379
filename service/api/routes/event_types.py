"""Event types: ``/event-types`` (create, list, get, add attributes or change lateness, end the stream, delete)."""
from __future__ import annotations

from fastapi import APIRouter, Response

from service import event_type
from service.api.deps import AdminKey, ReadKey, RuntimeDep, SessionDep
from service.schemas.common import ERRORS, Name
from service.schemas.resources import EventTypeCreate, EventTypeEnd, EventTypePublic, EventTypeUpdate

router = APIRouter(prefix="/event-types", tags=["event types"], responses=ERRORS)  # type: ignore[arg-type]


@router.post("", status_code=201, summary="Register an event type")
def create_event_type(body: EventTypeCreate, session: SessionDep, runtime: RuntimeDep, _: AdminKey) -> EventTypePublic:
    return event_type.public(event_type.create(session, runtime, body))


@router.get("", summary="List event types")
def list_event_types(session: SessionDep, _: ReadKey) -> list[EventTypePublic]:
    return [event_type.public(r) for r in event_type.listing(session)]


@router.get("/{name}", summary="Get an event type")
def get_event_type(name: Name, session: SessionDep, _: ReadKey) -> EventTypePublic:
    return event_type.public(event_type.get(session, name))


@router.patch("/{name}", summary="Evolve a type: add, make optional or remove attributes; change the lateness")
def update_event_type(
    name: Name, body: EventTypeUpdate, session: SessionDep, runtime: RuntimeDep, _: AdminKey
) -> EventTypePublic:
    return event_type.public(event_type.update(session, runtime, name, body))


@router.delete("/{name}", status_code=204, summary="Delete an event type no query uses (its archive stays)")
def delete_event_type(name: Name, session: SessionDep, runtime: RuntimeDep, _: AdminKey) -> Response:
    event_type.delete(session, runtime, name)
    return Response(status_code=204)


@router.post(
    "/{name}/end",
    summary="End a stream: its watermark moves to the end of time; its last windows and subwindows close; "
    "no more events of it are taken",
)
def end_event_type(name: Name, session: SessionDep, runtime: RuntimeDep, _: AdminKey) -> EventTypeEnd:
    return event_type.end(session, runtime, name)
