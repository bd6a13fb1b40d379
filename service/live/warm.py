"""Rebuilding a started statement's state from the archive: ``state=warm`` and plan switches.

Both read the statement's types over its span (:func:`window_history`: Delta and the recent buffer) and feed them
to its detector alone, so it behaves as if it had always run (docs/architecture.md section 4).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from engine.compiler import CompiledQuery
from engine.events import Event
from service.live.host import StreamState
from service.live.live_query import LiveQuery
from service.live.outbox import Found
from service.live.recovery import read_rows
from service.live.run import GraphRun

if TYPE_CHECKING:
    from engine.pm.store import PartialMatchStore
    from service.live.registry import StatementRegistry


class WarmHost(StreamState, Protocol):
    """What rebuilding a statement's state needs of the runtime (:class:`~service.live.runtime.LiveRuntime` is one):
    the running statements and the rule graph, event types and who emits the derived ones, event time, the ingest
    order, the archive (its recent buffer and Delta root), the replay limit, the partial-match store, the registry
    (a pattern's detector) and the recording of results."""

    @property
    def replay_max_us(self) -> int:
        """How far back a state without a bound is rebuilt, int us."""

    @property
    def pm_store(self) -> PartialMatchStore | None:
        """Where partial matches beyond a budget spill."""

    @property
    def registry(self) -> StatementRegistry:
        """Makes a pattern query's detector."""


def warm_query(rt: WarmHost, query_id: int, *, emit_history: bool = False) -> dict[str, int]:
    """Rebuild a just-started statement's state from the archive over its span (``state=warm``, issue 14).

    Reads the statement's types from the archive (Delta and the recent buffer) from ``newest ts - span
    - lateness`` (span: WITHIN or the window size; ``replay_max_us`` without one), feeds them to its
    detector alone and advances it to the current watermark, so it behaves as if it had always run.
    What that history completes is dropped, or recorded as alerts with ``emit_history`` (an EMIT INTO
    statement's history is never re-emitted: its readers saw it live). Call under the lock, right
    after :meth:`StatementRegistry.start_query`.

    Returns
    -------
    dict
        ``{"events": history events fed, "results": results they completed, "alerts": recorded}``.

    Raises
    ------
    ValueError
        For a live-and-archived query (it reads the archive itself) or without an archive.
    """
    lq = rt.queries[query_id]
    if str(query_id) not in rt.graph.nodes:
        raise ValueError("state=warm applies to statements of the rule graph, not to live-and-archived queries")
    history, wm, since = window_history(rt, lq)
    results = rt.graph.warm(str(query_id), history, wm)
    alerts = 0
    if emit_history and results and lq.compiled.emit_into is None:
        alerts = rt.results.save([Found(query_id, m, lq.version) for m in results])
    lq.warm = {"events": len(history), "results": len(results), "alerts": alerts}
    # The checkpoint this amounts to (the caller commits it with ``warmed``): replaying from where the history starts
    # in the ingest order rebuilds this state, and what the history completed counts as recorded (dropped, or
    # alerted just now). Without it a restart fed the statement only what came after it started. Not for an EMIT INTO
    # statement: the replay would hand its readers the events its history derives, which warming never emitted (the
    # readers saw the previous version's); a restart feeds it only what came after it started, as before.
    if lq.compiled.emit_into is not None:
        return lq.warm
    lq.warmed = True
    lq.checkpoint_seq = rt.order.next_seq
    buffered = None if since.since_us is None else rt.order.position_of(since.since_us, rt.order.floor)
    lq.resume_seq = min((s for s in (since.first_seq, buffered) if s is not None), default=rt.order.next_seq)
    return lq.warm

def switch_plan(rt: WarmHost, query_id: int, compiled: CompiledQuery) -> dict[str, int]:
    """Switch a running pattern query to another plan of its text (``POST /queries/{id}/plan``, 004):
    a new detector of ``compiled`` takes its place in the rule graph, rebuilt from the current window's
    events (archive and recent buffer, as ``state=warm`` reads them), so nothing is lost and nothing is
    reported twice (:meth:`engine.rules.graph.RuleGraph.replace`). Counters go on; its spilled partial
    matches are dropped with the old detector. Call under the lock.

    Returns ``{"events": window events fed, "results": results they completed (dropped: reported)}``.

    Raises
    ------
    ValueError
        For a query that is not a running pattern query of the rule graph, a failed one, or without the
        archive.
    """
    lq = rt.queries.get(query_id)
    node = rt.graph.nodes.get(str(query_id))
    if lq is None or node is None or not lq.compiled.chooses_plan:
        raise ValueError("a plan switch applies to running pattern queries (PATTERN ...)")
    if lq.failed is not None:
        raise ValueError(f"the query failed ({lq.failed}); resume it first")
    history, wm, _ = window_history(rt, lq)
    totals = lq.totals()
    if rt.pm_store is not None and lq.options.pm_capacity is not None:
        rt.pm_store.clear(f"q{query_id}")  # the old detector's spilled partial matches
    detector = rt.registry.pattern_detector(query_id, compiled, lq.options)
    dropped = rt.graph.replace(str(query_id), compiled, detector, history, wm)
    lq.compiled, lq.run = compiled, GraphRun(detector, node)
    lq.base = totals
    lq.offset = lq.counts()  # the window's events are counted once, before the switch
    lq.saved_mark = None
    lq.warm = {"events": len(history), "results": dropped}
    return lq.warm


@dataclass(frozen=True, slots=True)
class HistoryStart:
    """Where a window's history (:func:`window_history`) starts: ``since_us``, the event time (int us) it reads from
    (events ending at or after it; None: its types have no event yet), and ``first_seq``, the smallest ``ingest_seq``
    among its events read from Delta (None: none, or none with a position). Events still in the recent buffer were
    ingested by this process, so the ingest order's index (:meth:`service.live.ingest_order.IngestOrder.position_of`)
    knows their positions."""

    since_us: int | None
    first_seq: int | None


def window_history(rt: WarmHost, lq: LiveQuery) -> tuple[list[Event], int | None, HistoryStart]:
    """The events of ``lq``'s types from ``newest ts - span - lateness`` on (span: WITHIN plus what its
    operators remember, ``CompiledQuery.state_span_us``, or the window size; ``replay_max_us`` without one),
    from the archive and the recent buffer, in the matcher's (ts_end, id) order (an interval event counts by
    its end), the query's watermark, and where that history starts (:class:`HistoryStart`): what rebuilds its
    state (``state=warm``, a plan switch).

    Raises ValueError without the archive."""
    if rt.archive is None:
        raise ValueError("rebuilding a query's state reads the archive (LACE_ARCHIVE_ENABLED=true)")
    types = lq.compiled.stream_types
    newest = rt.event_time.newest_of(types)
    wm = rt.event_time.watermark(frozenset(t for t in types if t not in rt.emitters))
    if newest is None:
        return [], wm, HistoryStart(None, None)
    span = lq.state_span_us()
    since = newest - min(rt.replay_max_us if span is None else span + lq.max_lateness_us, rt.replay_max_us)
    # The recent buffer first, then Delta: a flush commits to Delta and only then drops what it committed from the
    # buffer, and it does not take the runtime's lock. Read the other way round, a flush between the two reads left
    # its events in neither (a plan switch under load lost partial matches, and their alerts). The same rule as
    # archive.extractor.Extractor.extract's.
    seen: dict[int, Event] = {
        e.id: e for e in rt.archive.buffer.events([t for t in types if t in rt.types]) if e.ts_end >= since
    }
    first_seq: int | None = None
    for t in sorted(types):
        spec = rt.types.get(t)
        if spec is None:
            continue
        for row in read_rows(rt.archive.root, spec, from_seq=None, since=(0, since)):
            seen.setdefault(row.event.id, row.event)
            if row.seq is not None and (first_seq is None or row.seq < first_seq):
                first_seq = row.seq
    return sorted(seen.values(), key=Event.order_key), wm, HistoryStart(since, first_seq)
