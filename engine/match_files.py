"""Match files: matches written in batches as JSONL (one object per line) or Parquet.

A JSONL line is ``Match.to_json()`` as compact JSON (DESIGN.md section 12)::

    {"query":NAME,"events":{"a":[1],"b":[4,5]},"start":US,"end":US,"fields":{...}}

The engine's matches keep their binding (slot layout + environment); for those the line
is filled into a template made once per layout (variable names JSON-encoded when the
template is built, never evaluated), so writing a match costs one string formatting.
Other matches go through ``orjson``; both give the same bytes.

A Parquet file has the columns ``query`` (string), ``start``, ``end`` (int64, microseconds
UTC), ``events`` (struct: variable -> list<int64> of event ids) and, when the query has a
RETURN, ``fields`` (struct: alias -> value).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO, Literal

import orjson

from engine.match import Match

MatchFormat = Literal["jsonl", "parquet"]
_OPTS = orjson.OPT_NON_STR_KEYS
_LineFn = Callable[[Match], str]
_line_fns: dict[int, tuple[Any, _LineFn | None]] = {}  # id(layout) -> (layout, fn); the layout is kept alive
_query_json: dict[Any, str] = {}


def _dumps(value: Any) -> str:
    return orjson.dumps(value, default=str, option=_OPTS).decode()


def _query(name: Any) -> str:
    text = _query_json.get(name)
    if text is None:
        text = _query_json[name] = _dumps(name)
    return text


def _line_fn(layout: Any) -> _LineFn | None:
    """The line builder of one slot layout ``(variables, slot_vars, kleene)``; None: use orjson."""
    variables, slot_vars, kleene = layout
    if len(set(slot_vars)) != len(slot_vars):
        return None
    slot = {v: i for i, v in enumerate(slot_vars)}
    parts, order = [], []
    for v in variables:
        key = _dumps(v).replace("%", "%%")
        if v in slot:
            order.append(slot[v])
            parts.append(f"{key}:[%s]" if kleene[slot[v]] else f"{key}:[%d]")
        else:
            parts.append(f"{key}:[]")
    template = '{"query":%s,"events":{' + ",".join(parts) + '},"start":%d,"end":%d,"fields":%s}'
    order_t = tuple(order)
    kleene_t = tuple(kleene[i] for i in order)
    if not any(kleene_t):

        def single(m: Match) -> str:
            env = m._env
            f = m._fields
            return template % (
                _query(m.query), *[env[i].id for i in order_t], m.start, m.end, _dumps(f) if f else "{}"  # type: ignore[index]
            )

        return single

    def general(m: Match) -> str:
        env = m._env
        f = m._fields
        ids = [
            ",".join([str(e.id) for e in env[i]]) if k else env[i].id  # type: ignore[index]
            for i, k in zip(order_t, kleene_t)
        ]
        return template % (_query(m.query), *ids, m.start, m.end, _dumps(f) if f else "{}")

    return general


# fill(template, env, start, end) for all-single layouts of 1..8 slots in variable order
_FILL: dict[int, Callable[[str, Any, int, int], str]] = {
    1: lambda t, v, s, e: t % (v[0].id, s, e),
    2: lambda t, v, s, e: t % (v[0].id, v[1].id, s, e),
    3: lambda t, v, s, e: t % (v[0].id, v[1].id, v[2].id, s, e),
    4: lambda t, v, s, e: t % (v[0].id, v[1].id, v[2].id, v[3].id, s, e),
    5: lambda t, v, s, e: t % (v[0].id, v[1].id, v[2].id, v[3].id, v[4].id, s, e),
    6: lambda t, v, s, e: t % (v[0].id, v[1].id, v[2].id, v[3].id, v[4].id, v[5].id, s, e),
    7: lambda t, v, s, e: t % (v[0].id, v[1].id, v[2].id, v[3].id, v[4].id, v[5].id, v[6].id, s, e),
    8: lambda t, v, s, e: t % (v[0].id, v[1].id, v[2].id, v[3].id, v[4].id, v[5].id, v[6].id, v[7].id, s, e),
}
_fast: dict[tuple[int, Any], tuple[Any, Any, str | None]] = {}  # (id(layout), query) -> (layout, fill, template)


def _fast_entry(layout: Any, query: Any) -> tuple[Any, Any, str | None]:
    """``(layout, fill, template)`` for matches without fields of an all-single layout whose slots are
    in variable order (the query name and empty fields are in the template); fill None otherwise."""
    variables, slot_vars, kleene = layout
    if any(kleene) or tuple(slot_vars) != tuple(variables) or len(variables) not in _FILL:
        return (layout, None, None)
    parts = ",".join(f"{_dumps(v).replace('%', '%%')}:[%d]" for v in variables)
    q = _query(query).replace("%", "%%")
    template = '{"query":' + q + ',"events":{' + parts + '},"start":%d,"end":%d,"fields":{}}'
    return (layout, _FILL[len(variables)], template)


def match_lines(matches: Iterable[Match]) -> list[str]:
    """:func:`match_line` of every match (the per-layout fast path without a call per match)."""
    out: list[str] = []
    append = out.append
    cur_layout: Any = None
    cur_query: Any = None
    fill: Any = None
    template: Any = None
    for m in matches:
        layout = m._layout
        if m._fields or m._events is not None or layout is None:
            append(match_line(m))
            continue
        if layout is not cur_layout or m.query is not cur_query:
            cur_layout, cur_query = layout, m.query
            entry = _fast.get((id(layout), cur_query))
            if entry is None:
                entry = _fast[(id(layout), cur_query)] = _fast_entry(layout, cur_query)
            fill, template = entry[1], entry[2]
        if fill is None:
            append(match_line(m))
        else:
            append(fill(template, m._env, m.start, m.end))
    return out


def match_line(match: Match) -> str:
    """One match as a compact JSON line (no newline): ``Match.to_json()``.

    Values JSON cannot hold natively (e.g. a Decimal in a RETURN field) are written as strings.
    """
    layout = match._layout
    if match._events is None and layout is not None:
        entry = _line_fns.get(id(layout))
        if entry is None:
            entry = _line_fns[id(layout)] = (layout, _line_fn(layout))
        fn = entry[1]
        if fn is not None:
            return fn(match)
    return orjson.dumps(match.to_json(), default=str, option=_OPTS).decode()


class MatchWriter:
    """Writes matches in batches to a binary stream (``jsonl``) or a Parquet file.

    Parameters
    ----------
    out : BinaryIO or str or Path
        Where to write; a path is opened (and closed by :meth:`close`).
    format : {"jsonl", "parquet"}
    batch : int
        Matches gathered before one write.

    Use as a context manager, or call :meth:`close` (writes what is left).
    """

    def __init__(self, out: BinaryIO | str | Path, format: MatchFormat = "jsonl", batch: int = 65_536) -> None:
        if format not in ("jsonl", "parquet"):
            raise ValueError(f"unknown match format {format!r} (jsonl or parquet)")
        self.format = format
        self._own = not hasattr(out, "write")
        self._out: BinaryIO = open(out, "wb") if self._own else out  # type: ignore[arg-type, assignment]
        self._batch = batch
        self._lines: list[str] = []
        self._pending: list[Match] = []
        self._pq: Any = None
        self.written = 0

    def __enter__(self) -> MatchWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write(self, matches: Iterable[Match]) -> None:
        """Add matches (in order); written once a batch is full."""
        if self.format == "jsonl":
            lines = self._lines
            lines.extend(match_lines(matches))
            if len(lines) >= self._batch:
                self._flush_lines()
        else:
            self._pending.extend(matches)
            if len(self._pending) >= self._batch:
                self._flush_parquet()

    def flush(self) -> None:
        """Write what is gathered (a Parquet row group, or JSONL lines) and flush the stream."""
        if self.format == "jsonl":
            self._flush_lines()
        else:
            self._flush_parquet()
        self._out.flush()

    def close(self) -> None:
        """Flush, end the Parquet file, and close the stream if this writer opened it."""
        try:
            self.flush()
            if self._pq is not None:
                self._pq.close()
        finally:
            if self._own:
                self._out.close()

    def _flush_lines(self) -> None:
        lines = self._lines
        if lines:
            self._out.write(("\n".join(lines) + "\n").encode())
            self.written += len(lines)
            lines.clear()

    def _flush_parquet(self) -> None:
        import pyarrow.parquet as pq

        ms = self._pending
        if not ms and self._pq is not None:
            return
        table = self._columns_fast(ms)
        if table is None:
            table = self._columns(ms)
        if self._pq is None:
            self._pq = pq.ParquetWriter(self._out, table.schema)
        self._pq.write_table(table.cast(self._pq.schema))
        self.written += len(ms)
        ms.clear()

    def _columns_fast(self, ms: list[Match]) -> Any:
        """The columns of engine matches of one all-single layout without fields, straight from the
        bindings (no ``to_json()`` per match); None when ``ms`` is not that."""
        import numpy as np
        import pyarrow as pa

        if not ms or (self._pq is not None and "fields" in self._pq.schema.names):
            return None
        first = ms[0]
        layout, query = first._layout, first.query
        if layout is None or _fast_entry(layout, query)[1] is None:
            return None
        for m in ms:
            if m._layout is not layout or m._events is not None or m._fields or m.query != query:
                return None
        variables = layout[0]
        envs = [m._env for m in ms]
        offsets = pa.array(np.arange(len(ms) + 1, dtype=np.int32))
        lists = [
            pa.ListArray.from_arrays(offsets, pa.array([env[i].id for env in envs], pa.int64()))  # type: ignore[index]
            for i in range(len(variables))
        ]
        return pa.table({
            "query": pa.array([query] * len(ms), pa.string()),
            "start": pa.array([m.start for m in ms], pa.int64()),
            "end": pa.array([m.end for m in ms], pa.int64()),
            "events": pa.StructArray.from_arrays(lists, names=list(variables)),
        })

    def _columns(self, ms: list[Match]) -> Any:
        import pyarrow as pa

        docs = [m.to_json() for m in ms]
        cols: dict[str, Any] = {
            "query": pa.array([d["query"] for d in docs], pa.string()),
            "start": pa.array([d["start"] for d in docs], pa.int64()),
            "end": pa.array([d["end"] for d in docs], pa.int64()),
        }
        schema = self._pq.schema if self._pq is not None else None
        events_type = schema.field("events").type if schema is not None else None
        if events_type is None:
            variables = list(docs[0]["events"]) if docs else []
            events_type = pa.struct([(v, pa.list_(pa.int64())) for v in variables])
        cols["events"] = pa.array([d["events"] for d in docs], events_type)
        fields_type = None
        if schema is not None and "fields" in schema.names:
            fields_type = schema.field("fields").type
        if fields_type is not None or (schema is None and any(d["fields"] for d in docs)):
            cols["fields"] = pa.array([d["fields"] or None for d in docs], fields_type)
        return pa.table(cols)
