"""A compact, stable encoding of spilled partial matches (JSON via orjson; never pickle).

Events are written once per payload and referenced by index, so a bucket of runs that
share events (every run of ``SEQ(A a, B b, ...)`` that extends the same ``a``) stores each
event once. Format version 1::

    {"v": 1, "events": [[id, type, ts_us, attrs], ...], "runs": [[first_ts, env], ...]}
    {"v": 1, "events": [...], "nodes": [[event, slot, [pred node indices], max_start, start], ...]}

where ``env`` holds one event index per single slot and a list of indices per Kleene slot.
"""
from __future__ import annotations

from typing import Any

import orjson

from engine.buffer.chain import Node
from engine.events import Event

VERSION = 1


class _Events:
    """Interning table: Event -> index in the payload's event list."""

    def __init__(self) -> None:
        self.index: dict[int, int] = {}
        self.rows: list[list[Any]] = []

    def ref(self, e: Event) -> int:
        i = self.index.get(id(e))
        if i is None:
            i = self.index[id(e)] = len(self.rows)
            self.rows.append([e.id, e.type, e.ts, e.attrs])
        return i


def _events(rows: list[list[Any]]) -> list[Event]:
    return [Event(i, t, ts, attrs) for i, t, ts, attrs in rows]


def encode_runs(runs: list[tuple[int, tuple[Any, ...]]], kleene: list[bool]) -> bytes:
    """Runs ``(first_ts, env)`` of one bucket -> bytes."""
    table = _Events()
    out = []
    for first_ts, env in runs:
        enc = [[table.ref(e) for e in slot] if k else table.ref(slot) for slot, k in zip(env, kleene)]
        out.append([first_ts, enc])
    return orjson.dumps({"v": VERSION, "events": table.rows, "runs": out})


def decode_runs(payload: bytes, kleene: list[bool]) -> list[tuple[int, tuple[Any, ...]]]:
    """Inverse of :func:`encode_runs` (events are new objects equal to the originals)."""
    doc = orjson.loads(payload)
    _check(doc)
    events = _events(doc["events"])
    return [
        (first_ts, tuple(tuple(events[i] for i in slot) if k else events[slot] for slot, k in zip(env, kleene)))
        for first_ts, env in doc["runs"]
    ]


def encode_chain(nodes: list[list[Node]]) -> bytes:
    """The node deques of one chain-partitioned state (slot by slot) -> bytes.

    Each :class:`~engine.buffer.chain.Node` is written as the row ``[event, slot, preds, max_start, start]``; a
    node's preds are nodes of the same state (or older nodes already expired: those are dropped, they can never
    match again because every pred is older than its successor and expiry is by event time).
    """
    table = _Events()
    index: dict[int, int] = {}
    out: list[Node] = []
    for deque_ in nodes:
        for node in deque_:
            index[id(node)] = len(out)
            out.append(node)
    rows = []
    for node in out:
        rows.append(
            [
                table.ref(node.event),
                node.slot,
                [index[id(p)] for p in node.preds if id(p) in index],
                node.max_start,
                node.start,
            ]
        )
    return orjson.dumps({"v": VERSION, "events": table.rows, "nodes": rows})


def decode_chain(payload: bytes, n_slots: int) -> list[list[Node]]:
    """Inverse of :func:`encode_chain`: per slot, the nodes in their original order."""
    doc = orjson.loads(payload)
    _check(doc)
    events = _events(doc["events"])
    built: list[Node] = []
    slots: list[list[Node]] = [[] for _ in range(n_slots)]
    for ev, slot, preds, max_start, start in doc["nodes"]:
        node = Node(events[ev], slot, [built[i] for i in preds], max_start, start)
        built.append(node)
        slots[slot].append(node)
    return slots


def _check(doc: Any) -> None:
    if not isinstance(doc, dict) or doc.get("v") != VERSION:
        raise ValueError(f"unknown partial-match encoding version {doc.get('v') if isinstance(doc, dict) else doc!r}")
