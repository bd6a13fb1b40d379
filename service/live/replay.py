"""Rebuild live state on restart by replaying the archive's recent past.

When the archive writer opens, its WAL is replayed into Delta, so every acknowledged event
is in a Delta table. A partial match alive at the crash started at most ``window +
lateness`` before the newest archived event; the replay therefore starts at ``max ts -
max(window + lateness)`` over the active queries (``replay_max_s`` for a query without
WITHIN) and feeds the events, in the matcher's (ts_end, id) order (ts_end = ts for a point event; an
interval type's events are read with their ts_end), to the queries that saw them live
(``ingested_at > active_since``). Alerts found again are de-duplicated.

Reads use delta-rs directly (pyarrow dataset with partition and ts pruning), not Spark:
the service must come back in seconds and reads only the recent tail.
"""
from __future__ import annotations

import heapq
import logging
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from engine.events import Event
from engine.live_archived.plan import LiveArchivedPlan
from service.live.events import TypeSpec
from service.live.runtime import LiveQuery, LiveRuntime

log = logging.getLogger(__name__)
TS_TYPE = pa.timestamp("us", tz="UTC")
STATS_SLACK_US = 1_000  # Delta min/max statistics of timestamps are truncated to milliseconds


def _table_uri(root: Path, name: str) -> str | None:
    from deltalake import DeltaTable

    uri = str(root / name)
    return uri if DeltaTable.is_deltatable(uri) else None


def archived_max_ts(root: Path, names: list[str]) -> int | None:
    """The newest archived event time over ``names``, int microseconds (from Delta file statistics).

    An event's time is its ``ts_end`` in an interval type's table (its watermark runs on the end) and its
    ``ts`` otherwise."""
    from deltalake import DeltaTable

    best: int | None = None
    for name in names:
        uri = _table_uri(root, name)
        if uri is None:
            continue
        acts = pa.table(DeltaTable(uri).get_add_actions(flatten=True))
        column = "max.ts_end" if "max.ts_end" in acts.column_names else "max.ts"
        if acts.num_rows == 0 or column not in acts.column_names:
            continue
        top = pc.max(acts.column(column).cast(pa.int64())).as_py()
        if top is not None:
            top += STATS_SLACK_US
            best = top if best is None else max(best, top)
    return best


def read_tail(root: Path, spec: TypeSpec, since_us: int) -> list[tuple[tuple[int, int], Event, int]]:
    """Archived events of ``spec`` that end at or after ``since_us`` (int microseconds UTC):
    ``((ts_end, id), event, ingested_at_us)``, sorted in the matcher's order.

    A point event ends at its ``ts``; an event of an interval type carries its ``ts_end`` (its ``ts`` may
    lie before ``since_us``: the type's ``max_duration_us`` bounds how far, else every date is read).
    """
    import pyarrow.dataset as pds
    from deltalake import DeltaTable

    uri = _table_uri(root, spec.name)
    if uri is None:
        return []
    ds = DeltaTable(uri).to_pyarrow_dataset()
    interval = spec.interval and "ts_end" in ds.schema.names
    end = "ts_end" if interval else "ts"
    flt = pds.field(end) >= pa.scalar(since_us, TS_TYPE)
    first = since_us - (spec.max_duration_us or 0) if interval else since_us
    if not interval or spec.max_duration_us is not None:  # the date partition is the UTC date of ts
        flt &= pds.field("date") >= datetime.fromtimestamp(first / 1e6, tz=UTC).strftime("%Y-%m-%d")
    attrs = [a for a in spec.attributes if a in ds.schema.names]
    table = ds.to_table(columns=["id", "ts", *(["ts_end"] if interval else []), "ingested_at", *attrs], filter=flt)
    cols: dict[str, list[object]] = {}
    for name in table.column_names:
        col = table.column(name)
        cols[name] = (col.cast(pa.int64()) if pa.types.is_timestamp(col.type) else col).to_pylist()
    out = []
    ids, tss, ing = cols["id"], cols["ts"], cols["ingested_at"]
    ends = cols["ts_end"] if interval else tss
    for i in range(table.num_rows):
        values = {a: cols[a][i] for a in attrs if cols[a][i] is not None}
        ev = Event(ids[i], spec.name, tss[i], values, ends[i])  # type: ignore[arg-type]
        out.append(((ends[i], ids[i]), ev, ing[i]))
    out.sort(key=lambda r: r[0])
    return out  # type: ignore[return-value]


def replay_start_us(
    runtime: LiveRuntime, tops: Mapping[str, int], replay_max_us: int, resume: Mapping[int, int]
) -> int:
    """Earliest ts the replay must read so that no partial match alive at the crash is lost.

    Per query, from the newest archived ts of its own types (``tops``: type -> ts): a live-only query
    needs its WITHIN plus lateness, plus how far back its operators' state reaches
    (``CompiledQuery.state_span_us``, issue 24 item 7); a live-and-archived query also the live instances still
    waiting for the archive: its live span, lateness and ``T_L``, and back to its recorded ``resume_from_us``
    (``resume``: query id -> ts), however far that is: a recorded resume point is never cut
    (issue 24 item 3: a 30-day event-time jump lost every pending result). Without a resume point,
    a query's need is capped at ``replay_max_us``; the cap is an explicit loss: logged as a warning
    with the query and the event time cut, recorded on the query (``LiveQuery.replay_cut_us``, its
    ``stats`` show ``replay_cut_ms``) and counted in ``lace_replay_cut_total`` /
    ``lace_replay_cut_seconds_total``. A query without WITHIN (unbounded state) counts how far back the
    replay went as cut.
    """
    since: int | None = None
    for lq in runtime.queries.values():
        c = lq.compiled
        newest = max((tops[t] for t in c.stream_types if t in tops), default=None)
        if newest is None:
            continue
        if isinstance(c, LiveArchivedPlan):
            span = c.live_span_us
            w = None if span is None else span + (lq.options.tolerance_us or 0)
        else:  # a pattern's WITHIN plus what its operators remember (dedup: its period); a window's size
            w = getattr(c, "state_span_us", c.window_us)
        need = None if w is None else w + lq.max_lateness_us
        start = newest - (replay_max_us if need is None else min(need, replay_max_us))
        if lq.id in resume:
            start = min(start, resume[lq.id])  # never cut: the replay goes back to the recorded resume point
        if need is None:
            _cut(runtime, lq, newest - start, True)
        elif need > newest - start:
            _cut(runtime, lq, need - (newest - start), False)
        since = start if since is None else min(since, start)
    return (since if since is not None else max(tops.values(), default=0)) - STATS_SLACK_US


def _cut(runtime: LiveRuntime, lq: LiveQuery, cut_us: int, unbounded: bool) -> None:
    """Record that the replay limit cut ``cut_us`` of ``lq``'s state: warning, stats, metrics."""
    lq.replay_cut_us = cut_us
    runtime.metrics.replay_cut.labels(lq.name).inc()
    runtime.metrics.replay_cut_seconds.labels(lq.name).inc(cut_us / 1e6)
    if unbounded:
        log.warning(
            "query %s (%d): the restart replay goes back only %d s (LACE_REPLAY_MAX_S, or its recorded resume point) "
            "because the query has no WITHIN; partial matches that started earlier are lost",
            lq.name, lq.id, cut_us // 1_000_000,
        )
    else:
        log.warning(
            "query %s (%d): the restart replay stops LACE_REPLAY_MAX_S back; its WITHIN + lateness reaches %d s "
            "further: partial matches that started in those %d s are lost",
            lq.name, lq.id, cut_us // 1_000_000, cut_us // 1_000_000,
        )


def rebuild(
    runtime: LiveRuntime,
    root: Path,
    types: Mapping[str, TypeSpec],
    *,
    replay_max_us: int,
    resume: Mapping[int, int] | None = None,
) -> dict[str, int]:
    """Replay the archive tail into ``runtime``; return counters for the log.

    ``resume``: query id -> ``resume_from_us`` of live-and-archived queries (their restart checkpoint).
    """
    tops = {name: archived_max_ts(root, [name]) for name in types}
    known = {name: top for name, top in tops.items() if top is not None}
    if not known:
        return {"events": 0, "alerts": 0}
    with runtime.lock:
        for name, top in known.items():  # each stream's event time; refined by the replayed events below
            runtime.type_max[name] = max(runtime.type_max.get(name, top - STATS_SLACK_US), top - STATS_SLACK_US)
        wanted = {t for lq in runtime.queries.values() for t in lq.compiled.stream_types if t in types}
        since = replay_start_us(runtime, known, replay_max_us, resume or {})
    parts = [read_tail(root, types[t], since) for t in sorted(wanted)]

    def rows() -> Iterator[tuple[Event, int]]:
        for _, ev, ing in heapq.merge(*parts, key=lambda r: r[0]):
            yield ev, ing

    n, alerts = runtime.replay(rows())
    log.info("replayed %d archived events from ts %d us: %d new alerts", n, since, alerts)
    return {"events": n, "alerts": alerts, "since_us": since}
