"""The service converts an event type's row to the one model in one place (service/event_type.py, issue 24)."""
from __future__ import annotations

import dataclasses

from engine.event_type import EventType
from service.db.models import EventTypeRow
from service.event_type import event_type

# Row columns -> the model's field holding them; columns that are not a property of the type are listed as None.
COLUMNS = {
    "name": "name", "attributes": "attributes", "partition_key": "partition_key", "defaults": "defaults",
    "allowed_lateness_us": "lateness_us", "interval": "interval", "max_duration_us": "max_duration_us",
    "derived": "derived", "ended_at_us": "ended", "end_ts_us": "end_ts_us",
    "created_at_us": None, "updated_at_us": None,
}


def test_every_column_of_the_row_is_a_field_of_the_model_and_back() -> None:
    """A column added to the row without the model (or the converter) fails here: issue 24 item 1 was an
    ``interval`` the archive's copy of the type did not get."""
    assert set(COLUMNS) == set(EventTypeRow.__table__.columns.keys())
    fields = {f.name for f in dataclasses.fields(EventType)}
    assert {f for f in COLUMNS.values() if f is not None} == fields


def test_the_row_converts_with_every_field() -> None:
    row = EventTypeRow(
        name="ep", attributes={"k": "string", "low": "float"}, partition_key="k", defaults={"low": None},
        allowed_lateness_us=7_000, interval=True, max_duration_us=60_000_000, derived=True,
        ended_at_us=123, end_ts_us=456, created_at_us=1, updated_at_us=2,
    )
    t = event_type(row)
    assert t == EventType(
        "ep", {"k": "string", "low": "float"}, "k", interval=True, defaults={"low": None}, lateness_us=7_000,
        max_duration_us=60_000_000, derived=True, ended=True, end_ts_us=456,
    )
    open_row = EventTypeRow(name="p", attributes={"a": "int"}, partition_key=None, defaults=None, created_at_us=1,
                            updated_at_us=1)
    assert event_type(open_row) == EventType("p", {"a": "int"})
