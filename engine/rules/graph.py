"""The rule graph: several statements over one stream, with filters first and derived streams between them.

003 (sections 3 and 4: the filter, capture, continuous-query and CEP layers; rules inserted, updated and
deleted while the stream runs); docs/architecture.md section 7.9. One :class:`RuleGraph` holds every statement of a
``lace match`` run or of the service:

- **FILTER** rules run first, on every event of their type (:meth:`RuleGraph.filter`); a dropped event
  reaches nothing else (the service does not archive it).
- Every other statement is a **node** that runs a detector (:class:`engine.detector.Detector`): a
  :class:`~engine.matcher.Matcher`, a :class:`~engine.rules.windows.WindowedAggregate`, or any detector a
  factory builds (interval derivation, 002). An event reaches the nodes that read its type (through
  the rule index when one is given).
- A node with ``EMIT INTO T`` turns each result into an event of the derived type ``T``
  (:func:`engine.rules.derived.derived_event`) that flows to the nodes reading ``T``; a node without it
  ends in results the caller gets back (alerts).

Order (exact, "in watermark order"): a node that reads only ingested types gets their events as they
come (its detector handles the allowed lateness). A node that reads a derived type gets all its input
through an inbox released in (ts_end, id) order (the matcher's order; (ts, id) for point events, issue 15)
up to the node's input watermark: the smallest watermark of
the types it reads, where a derived type's watermark is the smallest *output watermark* of the nodes
that emit it (a bound below the ts of every result they may still emit: ``output_watermark(w)`` of a
window operator; for a pattern, the watermark it consumed, less its window when the pattern has a
negation, whose matches are emitted when the window closes). Nodes are settled in topological order, so
one pass propagates a watermark through every layer. Cycles are refused when a statement is added.

Timestamps are int microseconds UTC. A derived event's id is a hash of the emitting statement's identity and
version and of the result's inputs (:func:`engine.rules.derived.derived_event_id`), so the same input through the
same statement derives the same events, with the same ids, in any process (a restart's replay, issue 24).

This module runs the stream through the graph (push, advance, flush, warm, plan switches, failures and time
budgets); adding and removing statements and their topological order are :mod:`engine.rules.graph_topology`, the
nodes and their output watermarks :mod:`engine.rules.graph_nodes`.
"""
from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any

from engine.events import Event
from engine.lql.checks import read_types
from engine.match import Match
from engine.plugins.api import PluginError
from engine.rules.derived import derived_event, derived_event_id
from engine.rules.filters import CompiledFilter
from engine.rules.graph_nodes import (
    END_OF_TIME,
    NEVER,
    Factory,
    Node,
    _negation_slack,
    default_factory,
    statement_ast,
)
from engine.rules.graph_topology import _Topology


class DerivedInputError(ValueError):
    """An input event of a type a statement derives (EMIT INTO): refused, since it would move that type's
    watermark and mix with the derived events (docs/lql.md: EMIT INTO must not name an ingested type)."""


class RuleGraph(_Topology):
    """Statements over one stream: filters, then nodes linked by derived streams (module docstring).

    Parameters
    ----------
    factory : callable, optional
        Compiled statement -> detector (default :func:`default_factory`).
    allowed_lateness_us : int
        How far behind the newest ingested event an event may arrive (ingested types; int microseconds):
        the graph's watermark when none is given to :meth:`advance` is ``newest ts - lateness - 1``.
    router : object, optional
        The rule index (:class:`engine.rules.index.RuleIndex`: ``add(name, ast)``, ``remove(name)``,
        ``reached(event) -> list[str]``, 003 and Esper's filter service); by default every node reading
        the event's type gets it. It never changes results (docs/semantics.md section 9).
    auto_advance : bool
        Move the watermark as ingested events arrive (``newest ts - lateness - 1``): right for a sorted
        file. The service sets it False and calls :meth:`advance` with per-type watermarks.
    measure_cpu : bool
        Keep each node's CPU seconds (``stats()[name]["cpu_s"]``; costs two clock reads per event).

    Raises
    ------
    QueryError
        From :meth:`add`: a duplicate name, or an EMIT INTO that would close a cycle.
    """

    def __init__(
        self,
        *,
        factory: Factory | None = None,
        allowed_lateness_us: int = 0,
        router: Any = None,
        auto_advance: bool = True,
        measure_cpu: bool = False,
    ) -> None:
        self.factory = factory or (lambda statement: default_factory(statement, allowed_lateness_us))
        self.lateness = int(allowed_lateness_us)
        self.router = router
        self.index_min = 4
        """The rule index is consulted for an event type read by more than this many statements (with fewer,
        offering the event to each costs less than the lookup)."""
        self.auto_advance = auto_advance
        self.measure_cpu = measure_cpu
        self._base_wm: Callable[[frozenset[str]], int | None] | None = None
        self._wm_cache: dict[frozenset[str], int | None] = {}
        self.filters: dict[str, list[CompiledFilter]] = {}
        self.filter_names: dict[str, CompiledFilter] = {}
        self.nodes: dict[str, Node] = {}
        self._readers: dict[str, list[Node]] = {}
        self._emitters: dict[str, list[Node]] = {}
        self._order: list[Node] = []
        self._timed: list[Node] = []
        self.watermark = NEVER
        self._max_ts = NEVER
        self._seq = itertools.count()
        self._derived_out: list[tuple[str, Event]] = []
        self.keep_derived = False
        self.report_derived = False
        """Also return the results of EMIT INTO nodes from push/advance/flush (``lace match`` writes them)."""
        self.late_events: list[tuple[str, Event, str]] = []
        """(node, event, reason) of the late refusals since the last :meth:`take_late`."""
        self.failures: list[tuple[str, Event | None, str]] = []
        """(statement name, the event or None for a watermark, reason): nodes that failed (a plug-in misbehaved,
        or the node overran :attr:`time_budget_s`); they stop."""
        self.time_budget_s: float | None = None
        """CPU seconds (this thread's, ``time.thread_time``) one node may spend on one :meth:`push_batch` (or on
        releasing its inbox in one advance); past it the node stops (failed, with the reason) after the event in
        hand, so one statement cannot stall the ingest or the others (issue 13). Waiting does not count: a
        statement whose partial matches spill to a SQL store on every event is slow, not runaway, and a busy
        machine does not stop queries. The wall clock is read per event and the CPU clock only once the wall
        clock passed the budget. None: no bound."""
        self.budget_note = ""
        """Appended to the over-budget reason (the service names its setting there)."""
        self.late: list[str] = []
        """Why events were refused as late by some node since the last :meth:`take_late` (the event
        still reached the other nodes)."""

    # ------------------------------------------------------------------ the stream

    def filter(self, event: Event) -> str | None:
        """Run the FILTER rules of ``event.type``: None when it is kept, else why it was dropped."""
        for f in self.filters.get(event.type, ()):
            reason = f.check(event)
            if reason is not None:
                return reason
        return None

    def push(self, event: Event, accept: Callable[[str], bool] | None = None) -> list[tuple[str, Match]]:
        """Offer one ingested event (already filtered): returns (statement name, result) of the nodes
        without EMIT INTO that it, or the watermark it moved, completed.

        ``accept``: only the nodes whose name it accepts get the event (the service's restart replay
        feeds each statement the events it saw live).

        Raises
        ------
        engine.matcher.LateEventError
            From a node's detector when the event is late for it.
        DerivedInputError
            When a statement derives ``event.type`` (EMIT INTO): nothing is taken.
        """
        if event.type in self._emitters:
            self._refuse_derived(event.type)
        out: list[tuple[str, Match]] = []
        nodes = self._readers.get(event.type)
        if nodes:
            if self.router is not None and len(nodes) > self.index_min:
                reached = set(self.router.reached(event))
                nodes = [n for n in nodes if n.name in reached]
            if accept is not None:
                nodes = [n for n in nodes if accept(n.name)]
            for node in nodes:
                self._offer(node, event, out)
        if self.auto_advance and event.ts_end > self._max_ts:
            self._max_ts = event.ts_end
            wm = event.ts_end - self.lateness - 1
            if wm > self.watermark and self._timed:
                self.watermark = wm
                self._settle(out, wm)
        return out

    def push_batch(self, events: list[Event]) -> list[tuple[str, Match]]:
        """Offer ingested events (already filtered, in arrival order) node by node: each node that reads
        ingested types takes the whole batch in one loop (nodes are independent; derived events wait in
        their readers' inboxes as with :meth:`push`), and its CPU time is read once per batch.

        Returns (statement name, result) as :meth:`push` does; late refusals go to :attr:`late_events`.
        Raises :class:`DerivedInputError` (and takes none of them) when a statement derives one's type.
        """
        out: list[tuple[str, Match]] = []
        if not events:
            return out
        types = {e.type for e in events}
        for t in types.intersection(self._emitters):
            self._refuse_derived(t)
        nodes: dict[str, Node] = {}
        for t in types:
            for n in self._readers.get(t, ()):
                nodes.setdefault(n.name, n)
        router = self.router
        budget = self.time_budget_s
        per_node: dict[str, list[Event]] | None = None
        if router is not None and any(len(self._readers.get(t, ())) > self.index_min for t in types):
            # the events each statement can take, in arrival order: O(statements reached), not O(statements x events)
            per_node = {}
            for e in events:
                readers = self._readers.get(e.type, ())
                names = router.reached(e) if len(readers) > self.index_min else [n.name for n in readers]
                for name in names:
                    got = per_node.get(name)
                    if got is None:
                        per_node[name] = [e]
                    else:
                        got.append(e)
        for node in self._order:
            if node.name not in nodes or node.failed is not None:
                continue
            if per_node is not None:
                mine = per_node.get(node.name)
                if not mine:
                    continue
            else:
                mine = events if len(types) == 1 else [e for e in events if e.type in node.reads]
            if node.buffered:
                for e in mine:
                    heapq.heappush(node.inbox, (e.ts, e.id, next(self._seq), e))
                continue
            push, name = node.detector.push, node.name
            started = time.thread_time() if self.measure_cpu or budget is not None else 0.0
            deadline = None if budget is None else time.perf_counter() + budget
            for k, e in enumerate(mine):
                try:
                    found = push(e)
                except ValueError as err:  # LateEventError: counted by the node's detector
                    self._late(name, e, err)
                    continue
                except PluginError as err:  # a plug-in misbehaved: this node stops, the others go on
                    self._fail(node, e, str(err))
                    break
                if found:
                    self._results(node, found, out)
                if deadline is not None and time.perf_counter() > deadline:
                    deadline = self._cpu_deadline(started)
                    if deadline is None:
                        self._overran(node, e, k + 1, len(mine))
                        break
            if self.measure_cpu:
                node.cpu_s += time.thread_time() - started
        return out

    def advance(
        self, watermark_us: int, base_watermark: Callable[[frozenset[str]], int | None] | None = None
    ) -> list[tuple[str, Match]]:
        """Declare that no ingested event with ``ts <= watermark_us`` will come; returns the results it made due.

        ``base_watermark``: the watermark of a set of ingested types (a node's, without its derived
        types), None when none is known yet; the service passes its per-type watermarks with idleness.
        Without it every ingested type has ``watermark_us``. Only nodes with something due are advanced.
        """
        out: list[tuple[str, Match]] = []
        if watermark_us > self.watermark:
            self.watermark = watermark_us
        self._base_wm = base_watermark
        self._wm_cache = {}
        try:
            self._settle(out, self.watermark, force=base_watermark is None)
        finally:
            self._base_wm = None
        return out

    def flush(self) -> list[tuple[str, Match]]:
        """End of stream: every window fires, every inbox drains, every detector flushes, layer by layer."""
        out: list[tuple[str, Match]] = []
        self.watermark = END_OF_TIME
        for node in self._order:
            if node.failed is not None:
                continue
            self._release(node, END_OF_TIME, out)
            node.consumed = END_OF_TIME
            try:
                self._results(node, node.detector.flush(), out)
            except PluginError as err:
                self._fail(node, None, str(err))
        return out

    def warm(self, name: str, events: Iterable[Event], watermark_us: int | None) -> list[Match]:
        """Rebuild a new node's state from history: feed ``events`` (in (ts, id) order) to its detector only,
        then advance it to ``watermark_us``; returns its results, which flow nowhere (no derived event, no
        result of :meth:`push`): the caller drops them or records them as history.

        Late or out-of-order history events are skipped. Raises KeyError for an unknown node.
        """
        node = self.nodes[name]
        out: list[Match] = []
        push = node.detector.push
        for e in events:
            try:
                out.extend(push(e))
            except ValueError:
                continue
        if watermark_us is not None:
            out.extend(node.detector.advance(watermark_us))
            node.consumed = max(node.consumed, watermark_us)
        return out

    def replace(
        self, name: str, statement: Any, detector: Any, history: Iterable[Event], watermark_us: int | None
    ) -> int:
        """Switch node ``name`` to another plan of its statement on the fly (004: a plan switch on a running
        query loses and repeats nothing): ``detector`` (of ``statement``, the same pattern compiled another way)
        takes the node's place, is fed ``history`` (in (ts, id) order) and advanced to ``watermark_us`` as
        :meth:`warm` does, and what that history completes is dropped: the old detector reported it.

        ``history`` must hold every event of the node's types from ``newest ts - WITHIN - lateness`` on: a
        result still to come has its first event there, so the new detector finds every such result once, and
        its pending ones (a trailing negation waiting for its window to close) are rebuilt. The node keeps
        its name, inbox, counters and place in the graph. Returns how many history results were dropped.

        Raises
        ------
        KeyError
            For an unknown node.
        ValueError
            When ``statement`` reads other event types or emits into another type than the node.
        """
        node = self.nodes[name]
        tree = statement_ast(statement)
        if read_types(tree) != node.reads or getattr(tree, "emit_into", None) != node.emit_into:
            raise ValueError(f"a plan switch keeps the statement: {name} reads or emits other event types")
        node.statement, node.detector = statement, detector
        node.negation_slack_us = _negation_slack(statement)
        self._reorder()  # the timed nodes: a negation's slack may differ between plans
        consumed = node.consumed
        dropped = len(self.warm(name, history, watermark_us))
        node.consumed = max(consumed, node.consumed)
        return dropped

    def _refuse_derived(self, type_name: str) -> None:
        who = ", ".join(sorted(n.name for n in self._emitters[type_name]))
        raise DerivedInputError(
            f"'{type_name}' is derived by {who} (EMIT INTO {type_name}): its events cannot be read from the input"
        )

    def take_derived(self) -> list[tuple[str, Event]]:
        """The derived events emitted since the last call that passed the FILTER rules of their type (what the
        readers get), with the emitting statement's name (set ``keep_derived`` to collect them: the service
        archives them)."""
        out, self._derived_out = self._derived_out, []
        return out

    def stats(self) -> dict[str, Any]:
        """Per statement: its detector's counters (filters: kept/dropped), plus ``results``."""
        d: dict[str, Any] = {name: f.stats() for name, f in self.filter_names.items()}
        for node in self._order:
            s = dict(node.detector.stats())
            s["results"] = node.results
            s["inbox"] = len(node.inbox)
            if self.measure_cpu:
                s["cpu_s"] = round(node.cpu_s, 6)
            d[node.name] = s
        return d

    # ------------------------------------------------------------------ internals

    def take_late(self) -> list[str]:
        """The late-event reasons collected since the last call (one per node that refused an event)."""
        out, self.late = self.late, []
        self.late_events = []
        return out

    def take_failures(self) -> list[tuple[str, Event | None, str]]:
        """The node failures since the last call: ``(statement name, event or None, reason)``."""
        out, self.failures = self.failures, []
        return out

    def _fail(self, node: Node, event: Event | None, reason: str) -> None:
        node.failed = reason
        node.inbox.clear()
        self.failures.append((node.name, event, reason))

    def _cpu_deadline(self, cpu0: float) -> float | None:
        """The wall clock passed the budget: None when this thread's CPU time since ``cpu0`` (``time.thread_time``)
        did too, else the wall-clock time to look again (CPU time grows no faster than the wall clock, so the
        budget cannot run out before it). Waiting (for the partial-match store's SQL, for other threads holding
        the GIL on a busy machine) does not count against a query; computing does."""
        assert self.time_budget_s is not None
        left = self.time_budget_s - (time.thread_time() - cpu0)
        return None if left <= 0 else time.perf_counter() + left

    def _overran(self, node: Node, event: Event, done: int, total: int) -> None:
        self._fail(
            node,
            event,
            f"matching took more than {self.time_budget_s:g} s of CPU time for one batch (stopped after "
            f"{done} of its {total} events){self.budget_note}",
        )

    def _offer(self, node: Node, event: Event, out: list[tuple[str, Match]]) -> None:
        if node.failed is not None:
            return
        if node.buffered:
            heapq.heappush(node.inbox, (event.ts_end, event.id, next(self._seq), event))
            return
        try:
            if self.measure_cpu:
                started = time.thread_time()
                found = node.detector.push(event)
                node.cpu_s += time.thread_time() - started
            else:
                found = node.detector.push(event)
        except ValueError as e:  # LateEventError: counted by the node's detector; the others still get it
            self._late(node.name, event, e)
            return
        except PluginError as err:  # a plug-in misbehaved: this node stops, the others go on
            self._fail(node, event, str(err))
            return
        if found:
            self._results(node, found, out)

    def _late(self, name: str, event: Event, err: ValueError) -> None:
        """Record that node ``name`` refused ``event`` as late (:attr:`late`, :attr:`late_events`)."""
        self.late.append(f"{name}: {err}")
        self.late_events.append((name, event, str(getattr(err, "reason", err))))

    def _results(self, node: Node, matches: list[Match], out: list[tuple[str, Match]]) -> None:
        if not matches:
            return
        node.results += len(matches)
        if node.emit_into is None or self.report_derived:
            name = node.name
            out.extend((name, m) for m in matches)
            if node.emit_into is None:
                return
        tree = statement_ast(node.statement)
        for m in matches:
            event = derived_event(tree, m, derived_event_id(node.identity, node.version, m))
            if self.filter(event) is not None:
                continue  # dropped by a FILTER rule of its type: no reader sees it, nor the archive (one rule)
            if self.keep_derived:
                self._derived_out.append((node.name, event))
            readers = self._readers.get(event.type, ())
            if self.router is not None and len(readers) > self.index_min:
                reached = set(self.router.reached(event))
                readers = [n for n in readers if n.name in reached]
            for reader in readers:
                heapq.heappush(reader.inbox, (event.ts_end, event.id, next(self._seq), event))

    def _type_watermark(self, type_name: str, ingest_wm: int) -> int:
        emitters = self._emitters.get(type_name)
        if not emitters:
            return ingest_wm
        return min(e.output_watermark() for e in emitters)

    def _release(self, node: Node, wm: int, out: list[tuple[str, Match]]) -> None:
        inbox = node.inbox
        push = node.detector.push
        budget = self.time_budget_s
        cpu0 = time.thread_time() if budget is not None else 0.0
        deadline = None if budget is None else time.perf_counter() + budget
        done = 0
        while inbox and inbox[0][0] <= wm:
            event = heapq.heappop(inbox)[3]
            try:
                found = push(event)
            except PluginError as err:
                self._fail(node, event, str(err))
                return
            self._results(node, found, out)
            done += 1
            if deadline is not None and time.perf_counter() > deadline:
                deadline = self._cpu_deadline(cpu0)
                if deadline is None:
                    self._overran(node, event, done, done + sum(1 for x in inbox if x[0] <= wm))
                    return

    def _node_watermark(self, node: Node, ingest_wm: int) -> int | None:
        base = self._base_wm
        derived = [self._type_watermark(t, ingest_wm) for t in node.reads if t in self._emitters]
        if base is None:
            return min(derived, default=ingest_wm) if derived else ingest_wm
        plain = node.reads.difference(self._emitters) if derived else node.reads
        cache = self._wm_cache  # one settle: the same type set has the same watermark
        if plain in cache:
            wm = cache[plain]
        else:
            wm = cache[plain] = base(plain) if plain else None
        if plain and wm is None:
            return None  # an ingested type it reads has no event yet
        candidates = derived + ([wm] if wm is not None else [])
        return min(candidates) if candidates else None

    def _settle(self, out: list[tuple[str, Match]], ingest_wm: int, force: bool = False) -> None:
        for node in self._order if force or self._base_wm is not None else self._timed:
            if node.failed is not None:
                continue
            deadline = node.detector.next_deadline()
            if deadline is None and not force and node.emit_into is None and not node.buffered:
                continue  # nothing due, no inbox, no derived stream whose watermark follows its own: skipped
            wm = self._node_watermark(node, ingest_wm)
            if wm is None:
                continue
            if node.buffered:
                self._release(node, wm, out)
                deadline = node.detector.next_deadline()  # what the inbox brought
            if wm > node.consumed and node.failed is None:
                if force or (deadline is not None and deadline <= wm):
                    try:
                        self._results(node, node.detector.advance(wm), out)
                    except PluginError as err:
                        self._fail(node, None, str(err))
                node.consumed = wm
        for type_name, f_list in self.filters.items():
            wm = self._filter_watermark(type_name, ingest_wm)
            if wm is not None:
                for f in f_list:
                    f.advance(wm)

    def _filter_watermark(self, type_name: str, ingest_wm: int) -> int | None:
        """How far the FILTER rules of ``type_name`` may forget: its own watermark (a derived type's: its emitters'),
        never another type's. A duplicate is judged against the kept events of its type within WITHIN, and an event
        not late for its type lies after this watermark: the decision is the same whenever it is taken (an event
        posted again after a crash whose request reached the write-ahead log, the crash suite's ``FILTER +
        pattern``), not a function of how far other types ran ahead (None: its type has no event yet)."""
        if type_name in self._emitters or self._base_wm is None:
            return self._type_watermark(type_name, ingest_wm)
        return self._base_wm(frozenset((type_name,)))


__all__ = ["END_OF_TIME", "NEVER", "Node", "RuleGraph", "default_factory", "statement_ast"]
