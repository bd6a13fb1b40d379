"""Match files: matches written in batches as JSONL (one object per line) or Parquet.

A JSONL line is ``Match.to_json()`` as compact JSON (docs/architecture.md section 7.12)::

    {"query":NAME,"events":{"a":[1],"b":[4,5]},"start":US,"end":US,"fields":{...}}

The engine's matches keep their binding (slot layout + environment); for those the line
is filled into a template made once per layout (variable names JSON-encoded when the
template is built, never evaluated). A match of an all-single layout is one literal
``bytes %`` of the text pieces around its ints (slot ids, start, end), which the compiled
build formats natively, straight from the fields. Other matches go through ``orjson``;
all give the same bytes.

A Parquet file has the columns ``query`` (string), ``start``, ``end`` (int64, microseconds
UTC), ``events`` (struct: variable -> list<int64> of event ids) and, when the query has a
RETURN, ``fields`` (struct: alias -> value).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO, Literal, cast

import orjson

from engine.events import Event
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


def _put1(ms: list[Match], pos: int, layout: Any, query: Any, pieces: tuple[bytes, ...], out: list[bytes]) -> int:
    p0, p1, p2, p3 = pieces
    for i in range(pos, len(ms)):
        m = ms[i]
        if m._layout is not layout or m.query is not query or m._fields or m._events is not None:
            return i
        v = cast("tuple[Event, ...]", m._env)
        a: Event = v[0]
        out.append(b"%b%d%b%d%b%d%b" % (p0, a.id, p1, m.start, p2, m.end, p3))
    return len(ms)


def _put2(ms: list[Match], pos: int, layout: Any, query: Any, pieces: tuple[bytes, ...], out: list[bytes]) -> int:
    p0, p1, p2, p3, p4 = pieces
    for i in range(pos, len(ms)):
        m = ms[i]
        if m._layout is not layout or m.query is not query or m._fields or m._events is not None:
            return i
        v = cast("tuple[Event, ...]", m._env)
        a: Event = v[0]
        b: Event = v[1]
        out.append(b"%b%d%b%d%b%d%b%d%b" % (p0, a.id, p1, b.id, p2, m.start, p3, m.end, p4))
    return len(ms)


def _put3(ms: list[Match], pos: int, layout: Any, query: Any, pieces: tuple[bytes, ...], out: list[bytes]) -> int:
    p0, p1, p2, p3, p4, p5 = pieces
    for i in range(pos, len(ms)):
        m = ms[i]
        if m._layout is not layout or m.query is not query or m._fields or m._events is not None:
            return i
        v = cast("tuple[Event, ...]", m._env)
        a: Event = v[0]
        b: Event = v[1]
        c: Event = v[2]
        out.append(b"%b%d%b%d%b%d%b%d%b%d%b" % (p0, a.id, p1, b.id, p2, c.id, p3, m.start, p4, m.end, p5))
    return len(ms)


def _put4(ms: list[Match], pos: int, layout: Any, query: Any, pieces: tuple[bytes, ...], out: list[bytes]) -> int:
    p0, p1, p2, p3, p4, p5, p6 = pieces
    for i in range(pos, len(ms)):
        m = ms[i]
        if m._layout is not layout or m.query is not query or m._fields or m._events is not None:
            return i
        v = cast("tuple[Event, ...]", m._env)
        a: Event = v[0]
        b: Event = v[1]
        c: Event = v[2]
        d: Event = v[3]
        out.append(
            b"%b%d%b%d%b%d%b%d%b%d%b%d%b" % (p0, a.id, p1, b.id, p2, c.id, p3, d.id, p4, m.start, p5, m.end, p6)
        )
    return len(ms)


def _put_any(ms: list[Match], pos: int, layout: Any, query: Any, pieces: tuple[bytes, ...], out: list[bytes]) -> int:
    for i in range(pos, len(ms)):
        m = ms[i]
        if m._layout is not layout or m.query is not query or m._fields or m._events is not None:
            return i
        line = [pieces[0]]
        for k, e in enumerate(cast("tuple[Event, ...]", m._env), 1):
            line.append(b"%d" % e.id)
            line.append(pieces[k])
        line.append(b"%d%b%d%b" % (m.start, pieces[-2], m.end, pieces[-1]))
        out.append(b"".join(line))
    return len(ms)


_Put = Callable[[list[Match], int, Any, Any, tuple[bytes, ...], list[bytes]], int]
# put(matches, pos, layout, query, pieces, out): from matches[pos], the matches of (layout, query) without fields,
# each appended to out as its line (UTF-8, newline included): the pieces of the line's text around its ints (slot ids
# in variable order, start, end), filled by one literal bytes % per line, which the compiled build (issue 45) runs
# natively (each int written straight from its field, no int object made); stops at the first other match and returns
# its index. Fixed arities read the slots as typed locals.
_PUT: dict[int, _Put] = {1: _put1, 2: _put2, 3: _put3, 4: _put4}
_WRITE_BYTES = 1 << 17  # bytes of JSONL text written at once
_pieces: dict[tuple[int, Any], tuple[Any, tuple[bytes, ...] | None]] = {}  # (id(layout), query) -> (layout, pieces)


def _fast_pieces(layout: Any, query: Any) -> tuple[bytes, ...] | None:
    """The text (UTF-8) of the lines of matches without fields of an all-single ``layout`` whose slots are in variable
    order, as the pieces around its ints: before the first slot's id (the query name in it), between the slots' ids,
    before start, before end, and after end (empty fields and the newline); None for any other layout (those lines
    go through :func:`match_line`)."""
    variables, slot_vars, kleene = layout
    if any(kleene) or tuple(slot_vars) != tuple(variables) or not variables:
        return None
    keys = [_dumps(v).encode() for v in variables]
    head = b'{"query":' + _query(query).encode() + b',"events":{' + keys[0] + b":["
    return (head, *[b"]," + k + b":[" for k in keys[1:]], b']},"start":', b',"end":', b',"fields":{}}\n')


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
        # jsonl: the lines (UTF-8, one bytes each) not yet written, and the run of matches of one fast layout
        self._parts: list[bytes] = []
        self._run: tuple[_Put, Any, Any, tuple[bytes, ...]] | None = None  # (put, layout, query, pieces)
        self._pending: list[Match] = []
        self._pq: Any = None
        self.written = 0

    def __enter__(self) -> MatchWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write(self, matches: Iterable[Match]) -> None:
        """Add matches (in order); written once a batch is full."""
        if self.format != "jsonl":
            self._pending.extend(matches)
            if len(self._pending) >= self._batch:
                self._flush_parquet()
            return
        ms: list[Match] = matches if type(matches) is list else list(matches)
        parts = self._parts
        pos = 0  # the next match to write: ms is never sliced (a slice per match or run made a long list quadratic)
        while pos < len(ms):
            run = self._run
            if run is not None:
                pos = run[0](ms, pos, run[1], run[2], run[3], parts)
                if pos == len(ms):
                    break
            # ms[pos] ends the run: start one for its layout, or write it on its own
            m = ms[pos]
            layout = m._layout
            pieces = None
            if layout is not None and not m._fields and m._events is None:
                key = (id(layout), m.query)
                entry = _pieces.get(key)
                if entry is None:
                    entry = _pieces[key] = (layout, _fast_pieces(layout, m.query))
                pieces = entry[1]
            if pieces is None:
                self._run = None
                parts.append((match_line(m) + "\n").encode())
                pos += 1
            else:
                self._run = (_PUT.get(len(layout[0]), _put_any), layout, m.query, pieces)
        if len(parts) >= self._batch:
            self._flush_lines()

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
        if self._parts:
            # written about _WRITE_BYTES of lines at a time: a batch-sized str and its bytes (6 MB each per 65,536
            # lines) came in fresh pages every batch, half of the page faults of `lace match` (issue 45)
            out = self._out
            group: list[bytes] = []
            size = 0
            for part in self._parts:
                if size + len(part) > _WRITE_BYTES and group:
                    out.write(b"".join(group))
                    group.clear()
                    size = 0
                group.append(part)
                size += len(part)
            if group:
                out.write(b"".join(group))
            self.written += len(self._parts)
            self._parts.clear()

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
        if layout is None or _fast_pieces(layout, query) is None:
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
