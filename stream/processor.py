"""The stateful processor Spark runs per partition key: the engine's matcher inside ``transformWithStateInPandas``.

Runs in Spark's Python workers. For one grouping key (the statement's PARTITION BY value, ``repr``'d) it loads
the key's matcher state from a ``ValueState`` (:mod:`stream.state`), pushes the micro-batch's events of that key
in (ts, id) order, and saves the state back (or clears it when nothing is left). Whatever waits on time (a
trailing negation's deadline, events held back by the allowed lateness) gets an event-time timer at
``Matcher.next_deadline()``; when the watermark passes it, :meth:`LaceProcessor.handleExpiredTimer` advances the
key's matcher to just below the watermark (no event before the watermark can come any more).

Each match leaves as one output row (:data:`OUTPUT_SCHEMA`): the pickled :class:`~engine.match.Match` and the
place ``lace match`` would have emitted it, so the driver can restore that order (:func:`order_key`):

* a match completed by an event: the (ts, id) of its newest event (the event whose release completed it),
  ``kind`` 1;
* a trailing-negation match: ``(deadline, MAX)`` with ``kind`` 0: ``lace match`` emits it just before the
  first event after its deadline, before that event's own matches, in (deadline, creation) order;
* ``n``, the key's running count of matches, orders matches of one event (all of one key).

Timestamps are int microseconds UTC; Spark's timers and watermark are milliseconds.
"""
from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from engine.compiler import CompiledQuery
from engine.match import Match
from engine.matcher import LateEventError, Matcher
from stream import state

END_KEY = ""
"""The grouping key of the end-of-stream marker row (a real key is a ``repr``, never empty)."""
AFTER = (1 << 63) - 1
"""The id part of a trailing-negation match's place: after every event of its deadline's timestamp."""

LATE = -1
"""The ``kind`` of an output row that is no match: an event the key's matcher rejected as late (more than the
allowed lateness behind the key's newest event; ``pts``, ``pid``: its ts_end and id; ``m`` empty). Only in the
archive mode, where no driver filters the events first."""

INPUT_COLUMNS = ("k", "et", "ts", "id", "ev")
"""The source table: grouping key (string), event time (timestamp, = ts_end), ts_end and id (int64), the
pickled :class:`~engine.events.Event` (binary)."""
OUTPUT_SCHEMA = StructType([
    StructField("pts", LongType()),
    StructField("pid", LongType()),
    StructField("kind", LongType()),
    StructField("cts", LongType()),
    StructField("cid", LongType()),
    StructField("n", LongType()),
    StructField("m", BinaryType()),
])
"""One match: its place (``pts``, ``pid``, ``kind``, ``cts``, ``cid``, ``n``; see the module docstring) and the
pickled match ``m``."""
ORDER = ("pts", "pid", "kind", "cts", "cid", "n")
"""Sorting the output rows by these columns gives ``lace match``'s emission order: a trailing-negation match
``(deadline, MAX, 0, ...)`` sorts after every event at or before its deadline and before the first one after it,
and such matches tie by deadline, then creation."""
_STATE_SCHEMA = StructType([StructField("matcher", BinaryType()), StructField("n", LongType())])
_COLUMNS = [f.name for f in OUTPUT_SCHEMA.fields]
_compiled: dict[tuple[str, str | None], CompiledQuery] = {}


def compiled_query(text: str, strategy: str | None) -> CompiledQuery:
    """The statement ``text`` compiled once per Python worker (workers are reused across tasks and batches).

    Raises
    ------
    QueryError
        When it does not compile (the driver compiled it first, so only on a different engine version).
    """
    key = (text, strategy)
    query = _compiled.get(key)
    if query is None:
        from engine.compiler import compile_query
        query = _compiled[key] = compile_query(text, strategy=strategy)
    return query


class LaceProcessor(StatefulProcessor):
    """Runs one LQL pattern statement per grouping key.

    Parameters
    ----------
    text : str
        The statement's LQL text (compiled in the worker: compiled plans hold closures and are not shipped).
    strategy : str, optional
        ``lace match --strategy``'s override.
    lateness_us : int
        Allowed lateness, int microseconds >= 0 (the matcher's reorder buffer; the query's watermark delay).
    """

    def __init__(self, text: str, strategy: str | None, lateness_us: int) -> None:
        self.text = text
        self.strategy = strategy
        self.lateness_us = lateness_us

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Spark's set-up call: the key's ``ValueState`` (pickled matcher state, match count)."""
        self.handle = handle
        self.value = handle.getValueState("matcher", _STATE_SCHEMA)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        """Push the key's events of this micro-batch, in (ts, id) order; yield their matches."""
        if key[0] == END_KEY:
            for _ in rows:
                pass
            return
        frame = pd.concat(list(rows), ignore_index=True).sort_values(["ts", "id"], kind="stable")
        matcher, n = self._load()
        found: list[Match] = []
        push = matcher.push
        late: list[tuple[int, int]] = []
        for blob in frame["ev"]:
            try:
                found.extend(push(event := pickle.loads(blob)))
            except LateEventError:  # file mode: the driver passes only events lace match accepts, not reached
                late.append((event.ts_end, event.id))
        if late:  # archive mode: an event more than the lateness behind its key's newest one
            yield pd.DataFrame([(ts, i, LATE, 0, 0, 0, b"") for ts, i in late], columns=_COLUMNS)
        yield from self._finish(matcher, n, found)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        """The watermark passed a deadline of this key: advance its matcher to just below the watermark."""
        if not self.value.exists():
            return
        matcher, n = self._load()
        watermark_us = timerValues.getCurrentWatermarkInMs() * 1000
        yield from self._finish(matcher, n, matcher.advance(watermark_us - 1))

    def close(self) -> None:
        """Spark's tear-down call: nothing to release."""

    def _load(self) -> tuple[Matcher, int]:
        query = compiled_query(self.text, self.strategy)
        matcher = Matcher(query, allowed_lateness_us=self.lateness_us)
        if self.value.exists():
            blob, n = self.value.get() or (b"", 0)
            return state.load(matcher, blob), int(n)
        return matcher, 0

    def _finish(self, matcher: Matcher, n: int, found: list[Match]) -> Iterator[pd.DataFrame]:
        rows = match_rows(matcher, n, found)
        n += len(rows)
        if state.is_idle(matcher):
            self.value.clear()
        else:
            self.value.update((state.dump(matcher), n))
            deadline = matcher.next_deadline()
            if deadline is not None:
                self.handle.registerTimer(deadline // 1000 + 1)  # fires once the watermark is past the deadline
        if rows:
            yield pd.DataFrame(rows, columns=_COLUMNS)


def match_rows(matcher: Matcher, n: int, found: list[Match]) -> list[tuple[int, int, int, int, int, int, bytes]]:
    """The output rows (:data:`OUTPUT_SCHEMA`) of ``found``, matches of ``matcher`` (one key) whose running count
    of matches so far is ``n``: the first gets ``n``, the next ``n + 1``, ..."""
    if not found:
        return []
    trailing = {id(p.layout) for p in matcher.plans if p.trailing}
    window = matcher.query.window_us or 0
    dumps, proto = pickle.dumps, pickle.HIGHEST_PROTOCOL
    return [(*_place(m, trailing, window), n + i, dumps(m, proto)) for i, m in enumerate(found)]


def output_table(rows: list[tuple[int, int, int, int, int, int, bytes]]) -> Any:
    """``rows`` (:func:`match_rows`'s, or a late event's) as a ``pyarrow.Table`` of :data:`OUTPUT_SCHEMA`'s columns
    (int64, ``m`` binary); an empty table when there are none."""
    import pyarrow as pa

    cols = list(zip(*rows)) if rows else [()] * len(_COLUMNS)
    return pa.table([pa.array(c, pa.binary() if name == "m" else pa.int64()) for name, c in zip(_COLUMNS, cols)],
                    names=_COLUMNS)


def _place(m: Match, trailing: set[int], window_us: int) -> tuple[int, int, int, int, int]:
    """``(pts, pid, kind, cts, cid)`` of a match (module docstring)."""
    if m._env is not None and m._layout is not None:  # from the binding: m.events would be built and pickled
        kleene = m._layout[2]
        newest = max((e.ts_end, e.id) for k, bound in zip(kleene, m._env) for e in (bound if k else (bound,)))
    else:
        newest = max((e.ts_end, e.id) for bound in m.events.values() for e in bound)
    if id(m._layout) in trailing:
        deadline = m.start + window_us
        return deadline, AFTER, 0, newest[0], newest[1]
    return newest[0], newest[1], 1, 0, 0

