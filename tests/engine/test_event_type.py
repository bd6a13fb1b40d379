"""The event type is one model (engine/event_type.py, issue 24): the archive, ingest and the service use it."""
from __future__ import annotations

import dataclasses

import pytest

from engine.event_type import EventType, SchemaError, schema

EPISODE = EventType(
    "episode", {"key": "string", "low": "float"}, "key",
    interval=True, defaults={"low": None}, lateness_us=5_000_000, max_duration_us=3_600_000_000,
)


def test_evolve_appends_attributes_and_takes_the_newer_types_service_fields() -> None:
    newer = EPISODE.evolve(EventType("episode", {"n": "int"}, interval=True, lateness_us=9, derived=True))
    assert list(newer.attributes) == ["key", "low", "n"]
    assert newer.partition_key == "key"  # kept: the newer one names none
    assert (newer.lateness_us, newer.derived, newer.interval) == (9, True, True)


@pytest.mark.parametrize(
    ("newer", "message"),
    [
        (EventType("episode", {"key": "string"}), "is an interval type, cannot make it a point type"),
        (EventType("episode", {"low": "int"}, interval=True), "attribute 'low' is float"),
        (EventType("episode", {"low": "float"}, "low", interval=True), "key is 'key', cannot change it to 'low'"),
        (EventType("other", {}), "cannot evolve type episode with type other"),
    ],
)
def test_evolve_refuses_incompatible_changes(newer: EventType, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        EPISODE.evolve(newer)


def test_the_catalog_form_keeps_what_the_archive_owns() -> None:
    doc = EPISODE.catalog_json()
    assert doc == {"attributes": {"key": "string", "low": "float"}, "key": "key", "interval": True}
    back = EventType.from_catalog("episode", doc)
    assert (back.name, back.partition_key, back.interval) == ("episode", "key", True)
    assert back.attributes == EPISODE.attributes
    assert back.lateness_us == 0 and back.defaults == {}  # the service's fields live in its database row


def test_every_field_after_the_partition_key_is_keyword_only() -> None:
    """A positional ``interval`` once meant lateness in another model of the type; now it cannot be passed so."""
    with pytest.raises(TypeError):
        EventType("t", {"a": "int"}, None, True)  # type: ignore[call-arg]
    kw = [f.name for f in dataclasses.fields(EventType) if f.kw_only]
    assert kw == ["interval", "defaults", "lateness_us", "max_duration_us", "derived", "ended", "end_ts_us"]


def test_schema_is_the_compilers_view_of_the_types() -> None:
    both = schema([EPISODE, EventType("t", {"a": "int"})])
    assert both == {"episode": {"key": "string", "low": "float"}, "t": {"a": "int"}}


def test_the_model_copies_its_mappings() -> None:
    attrs = {"a": "int"}
    t = EventType("t", attrs, defaults={"a": 1})  # type: ignore[arg-type]
    attrs["b"] = "int"
    assert t.attributes == {"a": "int"}
