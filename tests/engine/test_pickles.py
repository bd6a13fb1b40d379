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


# stream.state.dump of a matcher of SEQ(A a, !N n, B+ b[], C c) after A1 B2 A3 N4 B5 B6 (key 1), made before issue 45:
# chain nodes as (event, slot, preds, max_start, start) tuples, the local negation's last event as neg_last (ts, id)
OLD_CHAIN_STATE = (
    b'\x80\x05\x95\xba\x02\x00\x00\x00\x00\x00\x00}\x94(\x8c\x06states\x94}\x94K\x01]\x94\x8c\x10engine.nfa.state'
    b'\x94\x8c\x07rebuild\x94\x93\x94\x8c\x13engine.buffer.chain\x94\x8c\nChainState\x94\x93\x94K\x00Q\x85\x94}\x94'
    b'(\x8c\x05nodes\x94]\x94(\x8c\x0bcollections\x94\x8c\x05deque\x94\x93\x94)R\x94((\x8c\rengine.events\x94\x8c'
    b'\x05Event\x94\x93\x94(K\x01\x8c\x01A\x94J@B\x0f\x00}\x94\x8c\x03key\x94K\x01st\x94R\x94K\x00]\x94J@B\x0f\x00'
    b'\x88t\x94(h\x14(K\x03h\x15J\xc0\xc6-\x00}\x94h\x17K\x01st\x94R\x94K\x00]\x94J\xc0\xc6-\x00\x88t\x94eh\x10)R'
    b'\x94((h\x14(K\x02\x8c\x01B\x94J\x80\x84\x1e\x00}\x94h\x17K\x01st\x94R\x94K\x01]\x94h\x1baJ@B\x0f\x00\x89t\x94'
    b'(h\x14(K\x05h"J\x00\t=\x00}\x94h\x17K\x01st\x94R\x94K\x01]\x94h\'aJ@B\x0f\x00\x89t\x94(h\x14(K\x06h"J@KL\x00}'
    b"\x94h\x17K\x01st\x94R\x94K\x01]\x94(h'h,eJ@B\x0f\x00\x89t\x94eh\x10)R\x94e\x8c\x08neg_last\x94]\x94J\xe0g5"
    b'\x00K\x04\x86\x94a\x8c\x07neg_buf\x94]\x94]\x94a\x8c\x07pending\x94]\x94u\x87\x94R\x94as\x8c\x08max_seen\x94J'
    b'@KL\x00\x8c\twatermark\x94\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80\x8c\rlast_released\x94J@KL\x00K\x06\x86'
    b'\x94\x8c\x06buffer\x94]\x94h9]\x94\x8c\x04_seq\x94K\x00\x8c\t_last_key\x94\x8c\x08builtins\x94\x8c\x06object'
    b'\x94\x93\x94)\x81\x94\x8c\x0b_next_sweep\x94J\xc0\xd8\xa7\x00\x8c\n_intervals\x94\x89u}\x94(\x8c\x06events'
    b'\x94K\x06\x8c\x04late\x94K\x00\x8c\x07ignored\x94K\x00\x8c\x07created\x94K\x05\x8c\x06copied\x94K\x00\x8c\x06'
    b'merged\x94K\x00\x8c\x04live\x94K\x05\x8c\tpeak_live\x94K\x05\x8c\x07emitted\x94K\x00h9K\x00u\x86\x94.'
)
NEG_QUERY = "PATTERN SEQ(A a, !N n, B+ b[], C c) PARTITION BY key WITHIN 10 s"


def _neg_events() -> list[Event]:
    return [
        Event(i, t, int(s * 1_000_000), {"key": 1})
        for i, (t, s) in enumerate([("A", 1), ("B", 2), ("A", 3), ("N", 3.5), ("B", 4), ("B", 5)], start=1)
    ]


def _ids(matches: list[Match]) -> list[dict[str, list[int]]]:
    return sorted((m.ids() for m in matches), key=repr)


def test_chain_state_round_trips_and_matches_on() -> None:
    from engine.compiler import compile_query
    from engine.matcher import Matcher
    from stream import state

    query = compile_query(NEG_QUERY)
    whole, saved = Matcher(query), Matcher(query)
    for e in _neg_events():
        assert not whole.push(e) and not saved.push(e)
    loaded = state.load(Matcher(query), state.dump(saved))
    c = Event(7, "C", 7_000_000, {"key": 1})
    want = _ids(whole.push(c))
    assert want and _ids(loaded.push(c)) == want


def test_chain_states_pickled_before_issue_45_still_load() -> None:
    from engine.buffer.chain import Node
    from engine.compiler import compile_query
    from engine.matcher import Matcher
    from stream import state

    query = compile_query(NEG_QUERY)
    whole = Matcher(query)
    for e in _neg_events():
        whole.push(e)
    loaded = state.load(Matcher(query), OLD_CHAIN_STATE)
    st = loaded.states[1][0]
    assert all(isinstance(n, Node) for d in st.nodes for n in d)
    assert (st.neg_last_ts, st.neg_last_id) == ([3_500_000], [4])
    c = Event(7, "C", 7_000_000, {"key": 1})
    want = _ids(whole.push(c))
    assert len(want) == 4 and _ids(loaded.push(c)) == want
