"""Events and matches cross processes by pickle (query processes, Spark's Python workers, ``lace stream``'s
tables): their compact pickles round-trip, and pickles made before them (the slot-state form) still load."""
from __future__ import annotations

import pickle

from engine.events import Event
from engine.match import Match

# made by the default pickling of slotted objects (before Event.__reduce__ and Match.__reduce__): a point event,
# an interval event, and a match of the two (lazy binding, a Kleene slot, RETURN fields)
OLD = (
    b"\x80\x05\x95\x1e\x01\x00\x00\x00\x00\x00\x00\x8c\rengine.events\x94\x8c\x05Event\x94\x93\x94)\x81\x94N}\x94("
    b"\x8c\x02id\x94K\x01\x8c\x04type\x94\x8c\x01A\x94\x8c\x02ts\x94K\n\x8c\x05attrs\x94}\x94\x8c\x01k\x94K\x01s"
    b"\x8c\x06ts_end\x94K\nu\x86\x94bh\x02)\x81\x94N}\x94(h\x05K\x02h\x06\x8c\x01B\x94h\x08K\x14h\t}\x94h\x0bK"
    b"\x01sh\x0cK\x1eu\x86\x94b\x8c\x0cengine.match\x94\x8c\x05Match\x94\x93\x94)\x81\x94N}\x94(\x8c\x05query\x94"
    b"\x8c\x01q\x94\x8c\x05start\x94K\n\x8c\x03end\x94K\x1e\x8c\x07_fields\x94}\x94\x8c\x01f\x94K\x01s\x8c\x07"
    b"_events\x94N\x8c\x07_layout\x94\x8c\x01a\x94\x8c\x01b\x94\x86\x94h#\x89\x88\x86\x94\x87\x94\x8c\x04_env\x94"
    b"h\x03h\x0e\x85\x94\x86\x94\x8c\nwindow_key\x94Nu\x86\x94b\x87\x94."
)


def _sample() -> tuple[Event, Event, Match]:
    a = Event(1, "A", 10, {"k": 1})
    b = Event(2, "B", 20, {"k": 1}, ts_end=30)
    m = Match("q", None, 10, 30, {"f": 1}, (("a", "b"), ("a", "b"), (False, True)), (a, (b,)), None)
    return a, b, m


def _same_event(x: Event, y: Event) -> None:
    assert (x.id, x.type, x.ts, x.attrs, x.ts_end) == (y.id, y.type, y.ts, y.attrs, y.ts_end)


def test_events_and_matches_round_trip() -> None:
    a, b, m = _sample()
    w = Match("w", {}, 5, 9, None, window_key=((1,), (5, 1), (9, 2)))
    a2, b2, m2, w2 = pickle.loads(pickle.dumps((a, b, m, w), pickle.HIGHEST_PROTOCOL))
    _same_event(a2, a)
    _same_event(b2, b)
    assert not a2.is_interval and b2.is_interval
    assert m2._layout == m._layout and m2._events is None  # the binding stays lazy
    assert m2 == m and m2.ids() == {"a": [1], "b": [2]} and m2.fields == {"f": 1}
    assert m2.events["a"][0] is m2._env[0]  # one event object per event in a pickle
    assert w2 == w and w2.window_key == ((1,), (5, 1), (9, 2))


def test_pickles_made_before_the_compact_form_still_load() -> None:
    a, b, m = pickle.loads(OLD)
    want = _sample()
    _same_event(a, want[0])
    _same_event(b, want[1])
    assert m == want[2] and m.ids() == {"a": [1], "b": [2]}


def test_the_compact_form_is_smaller() -> None:
    a, b, m = _sample()
    assert len(pickle.dumps(m, pickle.HIGHEST_PROTOCOL)) < len(OLD) * 0.8
