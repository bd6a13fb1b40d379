"""The event type of the service, converted in one place (issue 24: one model per concept).

A registered event type is stored as an :class:`~service.db.models.EventTypeRow`; every other shape
of it is made from that row here, and nowhere else:

* :func:`type_spec` — the live engine's :class:`~service.live.events.TypeSpec` (validation, lateness,
  interval, maximum duration);
* :func:`archive_type` — the archive's :class:`~archive.schema.EventType` (attributes, key, interval);
* :func:`public` — the REST shape :class:`~service.schemas.resources.EventTypePublic`.

A new field of a type (such as ``interval``, issue 15) is added to the row and to these three
functions; a place that builds one of these shapes from a row by itself forgets it (issue 24 item 1:
the archive was opened with interval types as point types and the service did not start).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, cast

from service.db.models import EventTypeRow
from service.live.events import TypeSpec
from service.schemas.common import iso
from service.schemas.resources import EventTypePublic

if TYPE_CHECKING:
    from archive.schema import AttrType, EventType


def type_spec(row: EventTypeRow) -> TypeSpec:
    """The live engine's view of ``row``: attributes, partition key, lateness (us), defaults, interval, derived."""
    return TypeSpec(
        row.name,
        dict(row.attributes),
        row.partition_key,
        row.allowed_lateness_us,
        dict(row.defaults or {}),
        bool(row.interval),
        row.max_duration_us,
        bool(row.derived),
    )


def archive_type(row: EventTypeRow) -> EventType:
    """The archive's view of ``row``: attributes, key and whether it is an interval type.

    Raises
    ------
    archive.schema.SchemaError
        When the row is not a valid archive type (a reserved or malformed name).
    """
    from archive.schema import EventType

    return EventType(row.name, cast("dict[str, AttrType]", dict(row.attributes)), row.partition_key, bool(row.interval))


def public(row: EventTypeRow) -> EventTypePublic:
    """The REST shape of ``row`` (lateness and maximum duration in milliseconds, times ISO-8601)."""
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
