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

A live-and-archived statement (``LIVE ... ARCHIVED ...``, 001 section 4) runs its live pattern ``P_L`` here: each
output row is then a completed live instance, with the two columns the archive join needs
(:data:`LA_OUTPUT_SCHEMA`): ``ak``, the instance's archive key (:func:`group_key` of
:meth:`~engine.live_archived.plan.LiveArchivedPlan.key_of`; ``""`` without a key plan), and ``lo``/``hi``, its access
range ``[start - lookback, start)``. An instance whose key value is missing joins nothing and is left out.
:func:`join_group` is the join, run by ``cogroup(...).applyInPandas`` per archive key (:mod:`stream.job`).

Timestamps are int microseconds UTC; Spark's timers and watermark are milliseconds.
"""
from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from engine.compiler import CompiledQuery
from engine.live_archived.plan import NO_KEY, LiveArchivedPlan
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
LA_OUTPUT_SCHEMA = StructType([
    *OUTPUT_SCHEMA.fields,
    StructField("ak", StringType()), StructField("lo", LongType()), StructField("hi", LongType()),
])
"""A live instance of a live-and-archived statement: :data:`OUTPUT_SCHEMA` (``m`` the pickled live match) and its
archive key ``ak`` and access range ``[lo, hi)`` (int us)."""
RESULT_SCHEMA = StructType([*OUTPUT_SCHEMA.fields[:-1], StructField("r", LongType()), OUTPUT_SCHEMA.fields[-1]])
"""A result of a live-and-archived statement: its live instance's place (:data:`ORDER`), ``r`` its rank among that
instance's results, ``m`` the pickled result."""
_STATE_SCHEMA = StructType([StructField("matcher", BinaryType()), StructField("n", LongType())])
_compiled: dict[tuple[str, str | None], CompiledQuery] = {}
_plans: dict[str, LiveArchivedPlan | None] = {}


def live_archived_plan(text: str) -> LiveArchivedPlan | None:
    """The statement ``text`` compiled as a live-and-archived plan once per Python worker; None when it is a
    live-only statement.

    Raises
    ------
    QueryError
        When it does not compile (the driver compiled it first, so only on a different engine version).
    """
    if text not in _plans:
        from engine.lql import ast
        from engine.lql.parser import parse

        tree = parse(text)
        if isinstance(tree, ast.LiveArchivedQuery):
            from engine.live_archived.plan import compile_live_archived
            _plans[text] = compile_live_archived(tree)
        else:
            _plans[text] = None
    return _plans[text]


def compiled_query(text: str, strategy: str | None) -> CompiledQuery:
    """The statement ``text`` compiled once per Python worker (workers are reused across tasks and batches); of a
    live-and-archived statement, its live pattern ``P_L``.

    Raises
    ------
    QueryError
        When it does not compile (the driver compiled it first, so only on a different engine version).
    """
    key = (text, strategy)
    query = _compiled.get(key)
    if query is None:
        plan = live_archived_plan(text)
        if plan is not None:
            query = _compiled[key] = plan.live
        else:
            from engine.compiler import compile_query
            query = _compiled[key] = compile_query(text, strategy=strategy)
    return query


def group_key(value: Any) -> str:
    """The archive join's grouping key of a key value: its ``repr``, with the values Python holds equal given one
    form (``True`` and ``1.0`` as ``1``), as the engine's dict of keys does."""
    if isinstance(value, bool):
        value = int(value)
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    return repr(value)


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
        self.plan: LiveArchivedPlan | None = None
        self.schema = OUTPUT_SCHEMA

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Spark's set-up call: the key's ``ValueState`` (pickled matcher state, match count)."""
        self.handle = handle
        self.value = handle.getValueState("matcher", _STATE_SCHEMA)
        self.plan = live_archived_plan(self.text)
        self.schema = OUTPUT_SCHEMA if self.plan is None else LA_OUTPUT_SCHEMA

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
            pad = ("", 0, 0) if self.plan is not None else ()
            yield output_table([(ts, i, LATE, 0, 0, 0, b"", *pad) for ts, i in late], self.schema).to_pandas()
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
        rows: list[tuple[Any, ...]] = list(match_rows(matcher, n, found))
        n += len(rows)
        if self.plan is not None and rows:
            rows = instance_rows(self.plan, found, rows)
        if state.is_idle(matcher):
            self.value.clear()
        else:
            self.value.update((state.dump(matcher), n))
            deadline = matcher.next_deadline()
            if deadline is not None:
                self.handle.registerTimer(deadline // 1000 + 1)  # fires once the watermark is past the deadline
        if rows:
            yield output_table(rows, self.schema).to_pandas()


def match_rows(matcher: Matcher, n: int, found: list[Match]) -> list[tuple[int, int, int, int, int, int, bytes]]:
    """The output rows (:data:`OUTPUT_SCHEMA`) of ``found``, matches of ``matcher`` (one key) whose running count
    of matches so far is ``n``: the first gets ``n``, the next ``n + 1``, ..."""
    if not found:
        return []
    trailing = {id(p.layout) for p in matcher.plans if p.trailing}
    window = matcher.query.window_us or 0
    dumps, proto = pickle.dumps, pickle.HIGHEST_PROTOCOL
    return [(*_place(m, trailing, window), n + i, dumps(m, proto)) for i, m in enumerate(found)]


def instance_rows(
    plan: LiveArchivedPlan, found: list[Match], rows: list[tuple[Any, ...]]
) -> list[tuple[Any, ...]]:
    """The :data:`LA_OUTPUT_SCHEMA` rows of live instances ``found`` (of ``plan.live``) whose :func:`match_rows` are
    ``rows``: each with its archive key and access range; an instance without a key value (it joins nothing) is left
    out."""
    out: list[tuple[Any, ...]] = []
    for m, row in zip(found, rows):
        key = plan.key_of(m)
        if key is NO_KEY:
            continue
        lo, hi = plan.access_range(m)
        out.append((*row, "" if plan.key is None else group_key(key), lo, hi))
    return out


def join_group(text: str) -> Any:
    """The function ``cogroup(...).applyInPandas`` runs per archive key: ``f(key, live, archived)`` with ``live``
    the key's live instances of a micro-batch (:data:`LA_OUTPUT_SCHEMA` columns) and ``archived`` the key's archived
    events (column ``ev``, pickled events, at least those ending in the instances' access ranges) gives their
    results (:data:`RESULT_SCHEMA` columns) by :func:`engine.live_archived.runner.join_instances`, the engine's own
    join (001 section 4)."""

    def join(key: Any, live: pd.DataFrame, archived: pd.DataFrame) -> pd.DataFrame:
        if live.empty:
            return output_table([], RESULT_SCHEMA).to_pandas()
        from engine.live_archived.runner import join_instances

        plan = live_archived_plan(text)
        assert plan is not None
        live = live.sort_values(list(ORDER), kind="stable")
        loads = pickle.loads
        instances = [loads(b) for b in live["m"]]
        events = [loads(b) for b in archived["ev"]]
        dumps, proto = pickle.dumps, pickle.HIGHEST_PROTOCOL
        rows = [
            (*place, r, dumps(res, proto))
            for place, found in zip(live[list(ORDER)].itertuples(index=False, name=None),
                                    join_instances(plan, instances, events))
            for r, res in enumerate(found)
        ]
        return output_table(rows, RESULT_SCHEMA).to_pandas()

    return join


def output_table(rows: list[tuple[Any, ...]], schema: StructType = OUTPUT_SCHEMA) -> Any:
    """``rows`` (:func:`match_rows`'s, a late event's; with ``schema`` :data:`LA_OUTPUT_SCHEMA`,
    :func:`instance_rows`'s; with :data:`RESULT_SCHEMA`, :func:`join_group`'s) as a ``pyarrow.Table`` of
    ``schema``'s columns (``m`` binary, ``ak`` string, the others int64); an empty table when there are none. The
    processor's frames are its ``to_pandas()``: built column by column, about half the time of
    ``pd.DataFrame(rows)``, which infers each column's type from the Python objects."""
    import pyarrow as pa

    names = [f.name for f in schema.fields]
    kinds = {"m": pa.binary(), "ak": pa.string()}
    cols = list(zip(*rows)) if rows else [()] * len(names)
    return pa.table([pa.array(c, kinds.get(name, pa.int64())) for name, c in zip(names, cols)], names=names)


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

