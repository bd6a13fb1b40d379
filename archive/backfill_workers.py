"""What a backfill runs on Spark's Python workers (:mod:`archive.backfill`; docs/architecture.md section 7.11,
issue 7): the functions shipped to ``applyInArrow`` / ``mapInArrow``, and the compiled query they share.

- :func:`_instances_fn`, per key group: the group's events sorted by ``(ts, id)`` (``(ts_end, id)`` with interval
  types, issue 15) through the SAME :class:`engine.matcher.Matcher` as live detection (or an INTERVAL
  statement's deriver), one row ``(key, start, end, payload)`` per match;
- :func:`_join_fn`, over candidate pairs of a live-and-archived query: the whole JOIN
  (:meth:`engine.live_archived.plan.LiveArchivedPlan.joins`), then the result rows ``(query, match, start, end)``;
- :func:`_group_fn`, in the grouped RETURN form: one live instance's candidate pairs -> its one result.

Each Python worker compiles a query once (:func:`_plan`, :func:`_side`, cached), not once per key group (Spark
reuses workers). Times are int microseconds UTC; join keys are normalized so that values that compare equal
(``5 == 5.0 == True``) meet (:func:`_norm_key`).
"""
from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from engine.compiler import CompiledQuery
    from engine.intervals.derive import IntervalStatement
    from engine.live_archived.plan import LiveArchivedPlan

    LiveStatement = CompiledQuery | IntervalStatement
    """What a backfill runs per key group: a live pattern query, or an INTERVAL statement (issue 15)."""


def _norm_key(value: Any) -> str | None:
    """A join key as a string that is equal exactly when the values compare equal (5 == 5.0 == True)."""
    import orjson

    if value is None:
        return None
    if isinstance(value, bool):
        value = int(value)
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    return orjson.dumps(value).decode()


@functools.lru_cache(maxsize=16)
def _plan(query_text: str) -> LiveArchivedPlan:
    """The compiled live-and-archived query (cached per Python worker, like :func:`_side`)."""
    from engine.live_archived.plan import compile_live_archived

    return compile_live_archived(query_text)


@functools.lru_cache(maxsize=16)
def _side(query_text: str, side: str | None) -> tuple[LiveStatement, Callable[[Any], tuple[str | None, str] | None]]:
    """The compiled pattern of one side and ``encode(match) -> (join key, payload)`` (None: drop the match).

    ``side`` None: a live query, payload ``match_line`` (its output line); ``"live"``/``"archived"``:
    that side of a live-and-archived query, payload ``match_wire`` (whole events, for the join).
    Cached: a Python worker compiles the query once, not once per key group (Spark reuses workers).
    """
    from engine.io import match_line, match_wire

    if side is None:
        from engine.detector import compile_statement

        statement = compile_statement(query_text)  # a pattern query, or INTERVAL (issue 15)
        assert statement.backfills and not statement.reads_archive  # run_backfill checked
        return cast("LiveStatement", statement), lambda m: (None, match_line(m))
    from engine.live_archived.plan import NO_KEY

    plan = _plan(query_text)
    keyed = plan.key is not None
    if side == "live":

        def encode_live(m: Any) -> tuple[str | None, str] | None:
            k = plan.key_of(m)
            if k is NO_KEY:
                return None  # the key equality cannot hold: the instance joins nothing
            return (_norm_key(k) if keyed else None), match_wire(m)

        return plan.live, encode_live

    def encode_archived(m: Any) -> tuple[str | None, str] | None:
        k = _norm_key(plan.archived_key(m)) if keyed else None
        if keyed and k is None:
            return None
        return k, match_wire(m)

    return plan.archived, encode_archived


def _instances_fn(
    query_text: str, side: str | None, attrs_by_type: dict[str, list[str]], acc: Any
) -> Callable[[pa.Table], pa.Table]:
    """The per-key-group function shipped to the Python workers: events -> instance rows.

    Runs the side's :class:`engine.matcher.Matcher` over the group's events in ``(ts, id)`` order
    and returns one row ``(key, start, end, payload)`` per match (see :func:`_side`).
    """

    def run(table: pa.Table) -> pa.Table:
        from engine.detector import make_detector
        from engine.events import Event

        compiled, encode = _side(query_text, side)
        # what runs it live: a Matcher, or an INTERVAL statement's deriver (issue 15; a key group holds whole runs)
        matcher = make_detector(compiled)
        if "ts_end" in table.column_names:  # interval types (issue 15): the matcher's order is (ts_end, id)
            ends = pc.coalesce(table.column("ts_end"), table.column("ts"))
            table = table.set_column(table.column_names.index("ts_end"), "ts_end", ends)
            table = table.sort_by([("ts_end", "ascending"), ("id", "ascending")])
        else:
            table = table.sort_by([("ts", "ascending"), ("id", "ascending")])
        found: list[Any] = []
        push = matcher.push
        for etype, ids, tss, ends_, names, values in _columns(table, attrs_by_type):
            for i, ts, end, vals in zip(ids, tss, ends_, values):
                found.extend(push(Event(i, etype, ts, dict(zip(names, vals)), end)))
        found.extend(matcher.flush())
        acc.add(table.num_rows)
        keys, starts, ends, payloads = [], [], [], []
        for m in found:
            enc = encode(m)
            if enc is not None:
                keys.append(enc[0])
                starts.append(m.start)
                ends.append(m.end)
                payloads.append(enc[1])
        return pa.table(
            {
                "key": pa.array(keys, pa.string()),
                "start": pa.array(starts, pa.int64()),
                "end": pa.array(ends, pa.int64()),
                "payload": pa.array(payloads, pa.string()),
            }
        )

    return run


def _columns(
    table: pa.Table, attrs_by_type: dict[str, list[str]]
) -> Iterator[tuple[str, list[int], list[int], Any, list[str], Iterator[tuple[Any, ...]]]]:
    """A sorted group as ``(type, ids, tss, ts_ends, attribute names, value tuples)`` runs of one type each.

    ``ts_ends`` is the ``ts_end`` list of an extract with interval types, else an iterator of None
    (point events).

    A group of one event type (the usual case) is one run: its columns are converted once, not cell by cell.
    """
    types = table.column("type")
    if types.null_count == 0 and pc.count_distinct(types).as_py() <= 1:
        bounds = [(0, table.num_rows)]
    else:  # consecutive events of the same type
        tl = types.to_pylist()
        cuts = [0] + [i for i in range(1, len(tl)) if tl[i] != tl[i - 1]] + [len(tl)]
        bounds = list(zip(cuts[:-1], cuts[1:]))
    for lo, hi in bounds:
        if hi <= lo:
            continue
        part = table.slice(lo, hi - lo)
        etype = part.column("type")[0].as_py()
        names = list(attrs_by_type.get(etype, ()))
        cols = [part.column(a).to_pylist() for a in names]
        values = zip(*cols) if cols else itertools.repeat((), part.num_rows)
        ends = (
            part.column("ts_end").to_pylist()
            if "ts_end" in part.column_names
            else itertools.repeat(None, part.num_rows)
        )
        yield etype, part.column("id").to_pylist(), part.column("ts").to_pylist(), ends, names, values


def _join_fn(query_text: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``mapInArrow`` over candidate pairs ``(live payload, archived payload)``: the JOIN, then the result rows."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from engine.io import match_from_wire, match_line

        plan = _plan(query_text)
        for batch in batches:
            lives, archs = batch.column(0).to_pylist(), batch.column(1).to_pylist()
            cache: dict[str, Any] = {}
            names, lines, starts, ends = [], [], [], []
            for lp, ap in zip(lives, archs):
                inst = cache.get(lp)
                if inst is None:
                    inst = cache[lp] = match_from_wire(lp)
                j = match_from_wire(ap)
                if plan.joins(inst, j):
                    r = plan.result(inst, j)
                    names.append(r.query)
                    lines.append(match_line(r))
                    starts.append(r.start)
                    ends.append(r.end)
            yield pa.RecordBatch.from_pydict(
                {
                    "query": pa.array(names, pa.string()),
                    "match": pa.array(lines, pa.string()),
                    "start": pa.array(starts, pa.int64()),
                    "end": pa.array(ends, pa.int64()),
                }
            )

    return run


def _group_fn(query_text: str) -> Callable[[pa.Table], pa.Table]:
    """``groupBy(live payload).applyInArrow`` for the grouped RETURN form: one live instance's candidate
    pairs -> its one result (:meth:`LiveArchivedPlan.group`), or no row when no candidate joins."""

    def run(table: pa.Table) -> pa.Table:
        from engine.io import match_from_wire, match_line

        plan = _plan(query_text)
        names, lines, starts, ends = [], [], [], []
        lives = table.column("lp")
        if table.num_rows:
            inst = match_from_wire(lives[0].as_py())
            joined = [j for j in map(match_from_wire, table.column("ap").to_pylist()) if plan.joins(inst, j)]
            if joined:
                r = plan.group(inst, joined)
                names.append(r.query)
                lines.append(match_line(r))
                starts.append(r.start)
                ends.append(r.end)
        return pa.table(
            {
                "query": pa.array(names, pa.string()),
                "match": pa.array(lines, pa.string()),
                "start": pa.array(starts, pa.int64()),
                "end": pa.array(ends, pa.int64()),
            }
        )

    return run
