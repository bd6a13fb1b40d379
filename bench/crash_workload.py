"""The crash suite's workload (bench/crash.py, tests/crash/): event types, one statement of every kind, a seeded
stream.

Every statement kind of issue 24's crash suite is registered on one service, each with a webhook of its own when it
alerts (path ``/hook/<statement name>``). Four ingested types carry the stream:

- ``s`` (point; ``key`` of 4, ``v`` in 0..99): one event per second of event time. Read by the live pattern, the
  four live-and-archived algorithms, the two AGGREGATE windows, the INTERVAL derivation, the EMIT INTO chain, the
  derived type with a FILTER, ``PLAN tree`` and the query with a small ``pm_capacity``.
- ``f`` (point; ``v`` a multiple of 10): half the seconds; a FILTER drops low values and repeats of (key, v)
  within 30 s before a pattern reads it.
- ``alarm`` (point; 2 keys): bursts, read by ``dedup``.
- ``iv`` (interval, 5 s to 2 min): read by an Allen relation on the live side (``OVERLAPS``) and on the
  archived side of a live-and-archived query (``BEFORE`` in its JOIN).
- ``log`` (point): every 5 s, read by no statement: archived only, so a re-post after a crash is recognised by the
  producer ids the service restores from the archive, not by the replay (which reads only what statements read).
  Its ids start at :data:`LOG_ID0` and it draws from a random generator of its own, so the other types' events
  and ids are those of the earlier sessions' seeds.

The stream is posted in batches of ``batch_s`` seconds of event time, each type in its own time order (an interval
by its end); after ``jump_at`` of it event time jumps 30 days ahead. Then every ingested type's stream ends with
``POST /event-types/{name}/end`` (:attr:`Stream.ends`): its watermark becomes the end of time, so every window,
SLLAA subwindow and pending live instance closes (no event is posted to close them). Producer ids make every re-post
idempotent; an end posted again answers ``already_ended``. Three plan switches (:data:`SWITCHES`), two updates
with ``state=warm`` (:data:`UPDATES`) and a pause and a resume of the ``EMIT INTO`` chain's emitter and the four
live-and-archived queries (:data:`PAUSED`) are posted right after given batches, in the same step: one not
acknowledged is posted again with its batch (switching to the plan in use, or a new version warmed again, rebuilds
the query's state again, losing and repeating nothing; pausing a paused statement or resuming a running one changes
nothing).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

T0_MS = 1_709_251_200_000
"""2024-03-01T00:00:00Z: the stream's start (fixed: two runs of a seed post the same events)."""
JUMP_MS = 30 * 86_400_000
"""The event-time jump inside the stream (issue 24 item 3 lost every pending live-and-archived result over one)."""

TYPES: list[dict[str, Any]] = [
    {"name": "s", "attributes": {"key": "string", "v": "int"}},
    {"name": "f", "attributes": {"key": "string", "v": "int"}},
    {"name": "alarm", "attributes": {"key": "string"}},
    {"name": "iv", "attributes": {"key": "string", "v": "int"}, "interval": True, "max_duration_ms": 180_000},
    {"name": "log", "attributes": {"key": "string", "v": "int"}},
]
LOG_ID0 = 1_000_000
"""The first id of the ``log`` events (the others number from 1)."""

LA = (
    "NAME {name} LIVE PATTERN s p WHERE p.v >= 98 ARCHIVED PATTERN s q WHERE q.v <= 3 LOOKBACK 3 min "
    "JOIN p.key = q.key RETURN p.key AS key, p.v AS pv, q.v AS qv"
)


@dataclass(frozen=True)
class Statement:
    """One statement of the workload: its ``kind`` (the suite's row), LQL ``text``, extra ``POST /queries`` body
    fields, and whether it alerts (then it gets a webhook)."""

    name: str
    kind: str
    text: str
    options: dict[str, Any] = field(default_factory=dict)
    alerts: bool = True


STATEMENTS: list[Statement] = [
    Statement(
        "live_pattern", "live pattern",
        "NAME live_pattern PATTERN SEQ(s a, s b) WHERE a.v < 10 AND b.v > 90 PARTITION BY key "
        "STRATEGY skip_till_next_match WITHIN 2 min RETURN a.key AS key, a.v AS av, b.v AS bv",
    ),
    *(
        Statement(f"la_{alg}", f"LIVE/ARCHIVED {alg.upper()}", LA.format(name=f"la_{alg}"), {"algorithm": alg})
        for alg in ("sllaa", "ollaa", "llaa", "alaa")
    ),
    Statement("f_clean", "FILTER + pattern", "NAME f_clean FILTER f x DROP DUPLICATE key, v WITHIN 30 s "
              "DROP WHEN x.v < 10", alerts=False),
    Statement(
        "f_rise", "FILTER + pattern",
        "NAME f_rise PATTERN SEQ(f a, f b) WHERE b.v > a.v + 40 PARTITION BY key STRATEGY skip_till_next_match "
        "WITHIN 1 min RETURN a.key AS key, a.v AS av, b.v AS bv",
    ),
    Statement("hi", "EMIT INTO chain", "NAME hi PATTERN s x WHERE x.v > 88 RETURN x.key AS key, x.v AS v EMIT INTO hi",
              alerts=False),
    Statement(
        "hi_pair", "EMIT INTO chain",
        "NAME hi_pair PATTERN SEQ(hi a, hi b) PARTITION BY key STRATEGY skip_till_next_match WITHIN 2 min "
        "RETURN a.key AS key, a.v AS av, b.v AS bv EMIT INTO hipair",
        alerts=False,
    ),
    Statement("chain", "EMIT INTO chain",
              "NAME chain PATTERN hipair h WHERE h.av + h.bv > 190 RETURN h.key AS key, h.av AS av, h.bv AS bv"),
    Statement(
        "agg_tumbling", "AGGREGATE tumbling",
        "NAME agg_tumbling AGGREGATE s x GROUP BY key WINDOW TUMBLING 2 min "
        "RETURN x.key AS key, count(x) AS n, max(x.v) AS mx",
    ),
    Statement(
        "agg_sliding", "AGGREGATE sliding",
        "NAME agg_sliding AGGREGATE s x WHERE x.v > 50 GROUP BY key WINDOW SLIDING 3 min EVERY 1 min "
        "HAVING count(x) > 2 RETURN x.key AS key, count(x) AS n, sum(x.v) AS total",
    ),
    Statement(
        "runs", "INTERVAL derivation",
        "NAME runs INTERVAL s t WHEN t.v > 60 PARTITION BY key COVER 5 s MAX GAP 10 s "
        "RETURN t[1].key AS key, count(t) AS n EMIT INTO run",
        alerts=False,
    ),
    Statement(
        "run_pair", "INTERVAL derivation",
        "NAME run_pair PATTERN SEQ(run a, run b) WHERE a.n >= 2 AND b.n >= 2 PARTITION BY key "
        "STRATEGY skip_till_next_match WITHIN 5 min RETURN a.key AS key, a.n AS an, b.n AS bn",
    ),
    Statement(
        "iv_overlap", "interval Allen, live",
        "NAME iv_overlap PATTERN SEQ(iv x, iv y) WHERE x OVERLAPS y AND x.v > 40 PARTITION BY key WITHIN 10 min "
        "RETURN x.key AS key, x.v AS xv, y.v AS yv",
    ),
    Statement(
        "iv_la", "interval Allen, archived",
        "NAME iv_la LIVE PATTERN iv x WHERE x.v >= 80 ARCHIVED PATTERN iv y WHERE y.v < 15 LOOKBACK 5 min "
        "JOIN x.key = y.key AND y BEFORE x RETURN x.key AS key, x.v AS xv, y.v AS yv",
    ),
    Statement("lo", "FILTER on a derived type",
              "NAME lo PATTERN s x WHERE x.v < 12 RETURN x.key AS key, x.v AS v EMIT INTO lo", alerts=False),
    Statement("lo_clean", "FILTER on a derived type", "NAME lo_clean FILTER lo l DROP WHEN l.v < 4", alerts=False),
    Statement(
        "lo_pair", "FILTER on a derived type",
        "NAME lo_pair PATTERN SEQ(lo a, lo b) PARTITION BY key WITHIN 1 min RETURN a.key AS key, a.v AS av, b.v AS bv",
    ),
    Statement(
        "dedup_alarm", "operator dedup",
        "NAME dedup_alarm PATTERN SEQ(dedup(alarm, 2 min) d, alarm b) PARTITION BY key WITHIN 1 min",
    ),
    Statement(
        "tree3", "PLAN tree",
        "NAME tree3 PATTERN SEQ(s a, s b, s c) WHERE a.v > 75 AND b.v < 25 AND c.v > 75 PARTITION BY key "
        "WITHIN 20 s PLAN tree RETURN a.key AS key, a.v AS av, b.v AS bv, c.v AS cv",
    ),
    Statement(
        "spill", "pm_capacity spilling",
        "NAME spill PATTERN SEQ(s a, s b) WHERE b.v > a.v + 85 PARTITION BY key WITHIN 1 min "
        "RETURN a.key AS key, a.v AS av, b.v AS bv",
        {"pm_capacity": 4},
    ),
]
"""Registered in this order (emitters before their readers) on a fresh database, so query ids, and the derived
event ids hashed from them, are the same in every run."""

SWITCHES: list[tuple[str, str]] = [("tree3", "nfa"), ("spill", "nfa"), ("tree3", "tree")]
"""Plan switches of running pattern queries (``POST /queries/{id}/plan``, a rebuild from the window's events): the
first two a third of the way to the jump (``PLAN tree`` to the NFA; the query that spills partial matches, whose
spilled ones the switch drops), the last right after the jump (back to the tree)."""

UPDATES: list[str] = ["live_pattern", "agg_sliding"]
"""Statements given a new version mid-stream, two thirds of the way to the jump: ``PUT /queries/{id}?state=warm`` with
the same text (the new version's partial matches and windows rebuilt from the archive: what it completes from that
history is dropped, what it completes later is alerted as the old version would have)."""

PAUSED: list[str] = ["hi", "la_sllaa", "la_ollaa", "la_llaa", "la_alaa"]
"""Statements paused mid-stream (``POST /queries/{id}/pause``, half way to the jump: the results already due are
recorded first, a live-and-archived query's waiting live instances answered; then the partial matches are dropped
and nothing is derived or alerted while paused) and resumed (``POST /queries/{id}/resume``, five sixths of the
way: each sees the events after the call). The ``EMIT INTO`` chain's emitter, so its readers (``hi_pair``,
``chain``) see the gap too, and the four live-and-archived algorithms (which must still agree). A restart must keep
them paused, and after the resume feed them only what came after it."""

KINDS = list(dict.fromkeys(s.kind for s in STATEMENTS))
"""The suite's rows, in order."""


@dataclass(frozen=True)
class Control:
    """A request about a statement posted right after batch ``after``, in the same step: ``kind`` ``switch``
    (``POST /queries/{id}/plan`` to ``plan``), ``update`` (``PUT /queries/{id}?state=warm`` with its own text),
    ``pause`` or ``resume`` (``POST /queries/{id}/pause``, ``/resume``)."""

    after: int
    kind: str
    statement: str
    plan: str | None = None


@dataclass
class Stream:
    """The batches to post (each a list of event JSON objects), the index of the first batch after the jump, the
    ingested types whose streams end after the last batch (``POST /event-types/{name}/end``, in this order), and the
    plan switches, updates, pauses and resumes posted right after given batches (:class:`Control`, in the order they
    are posted)."""

    batches: list[list[dict[str, Any]]]
    jump_batch: int
    ends: list[str] = field(default_factory=lambda: [t["name"] for t in TYPES])
    controls: list[Control] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[Control]:
        """The controls of ``kind``, in the order they are posted (a ``switch:n``, ``update:n``, ``pause:n`` or
        ``resume:n`` fault counts in this list, from 0)."""
        return [c for c in self.controls if c.kind == kind]

    @property
    def events(self) -> int:
        """How many events the batches hold."""
        return sum(len(b) for b in self.batches)

    @property
    def steps(self) -> int:
        """The requests of a run: each batch, then each end call."""
        return len(self.batches) + len(self.ends)


def make_stream(seed: int, seconds: int = 600, batch_s: int = 30, jump_at: float = 0.6) -> Stream:
    """The seeded stream (see the module docstring): ``seconds`` of event time, the jump after ``jump_at`` of them."""
    rng = random.Random(seed)
    jump_s = int(seconds * jump_at)
    out: list[tuple[int, int, dict[str, Any]]] = []  # (second it is posted in, id, event)
    nid = 0

    def at(sec: int) -> int:
        return T0_MS + sec * 1_000 + (JUMP_MS if sec >= jump_s else 0)

    def add(sec: int, ev: dict[str, Any]) -> None:
        nonlocal nid
        nid += 1
        out.append((sec, nid, {"id": nid, **ev}))

    log_rng = random.Random(seed + 1_000_003)
    for sec in range(0, seconds, 5):
        attrs = {"key": f"l{log_rng.randrange(3)}", "v": log_rng.randrange(100)}
        out.append((sec, LOG_ID0 + sec, {"id": LOG_ID0 + sec, "type": "log", "ts": at(sec) + 900, "attrs": attrs}))
    for sec in range(seconds):
        add(sec, {"type": "s", "ts": at(sec) + 100, "attrs": {"key": f"k{rng.randrange(4)}", "v": rng.randrange(100)}})
        if rng.random() < 0.5:
            add(sec, {"type": "f", "ts": at(sec) + 300, "attrs": {"key": f"k{rng.randrange(3)}",
                                                                   "v": 10 * rng.randrange(10)}})
        if rng.random() < 0.08:
            add(sec, {"type": "alarm", "ts": at(sec) + 500, "attrs": {"key": f"a{rng.randrange(2)}"}})
        if rng.random() < 0.15:
            # an interval ends in the same stretch (before or after the jump) as it starts
            last = (jump_s if sec < jump_s else seconds) - 1
            end_sec = min(sec + rng.randrange(5, 120), last)
            if end_sec > sec:
                ts, end = at(sec) + 700, at(end_sec) + 700
                attrs = {"key": f"k{rng.randrange(4)}", "v": rng.randrange(100)}
                add(end_sec, {"type": "iv", "ts": ts, "ts_end": end, "attrs": attrs})
    out.sort(key=lambda r: (r[0], r[2].get("ts_end", r[2]["ts"]), r[1]))
    batches: dict[int, list[dict[str, Any]]] = {}
    for sec, _, ev in out:
        batches.setdefault(sec // batch_s, []).append(ev)
    listed = [batches[k] for k in sorted(batches)]
    jump_batch = jump_s // batch_s
    placed = [
        *(Control(max(1, jump_batch // 3), "switch", name, plan) for name, plan in SWITCHES[:2]),
        *(Control(jump_batch // 2, "pause", name) for name in PAUSED),
        *(Control(jump_batch * 2 // 3, "update", name) for name in UPDATES),
        *(Control(jump_batch * 5 // 6, "resume", name) for name in PAUSED),
        *(Control(jump_batch + 1, "switch", name, plan) for name, plan in SWITCHES[2:]),
    ]
    controls = [c for c in placed if 0 < c.after < len(listed) - 1]
    return Stream(listed, jump_batch, controls=controls)
