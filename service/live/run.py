"""How a running statement is run: one protocol (:class:`~service.live.live_query.Run`), two implementations
(docs/architecture.md sections 2, 4 and 5).

A statement whose class declares that it reads the archive (``reads_archive``: a live-and-archived query) runs on a
live-and-archived worker (:class:`WorkerRun`); every other statement is matched by the runtime's rule graph
(:class:`GraphRun`). :class:`~service.live.live_query.LiveQuery` holds one and asks it; the runtime, the restart
replay and the checkpoints call :class:`~service.live.live_query.LiveQuery`'s methods and never ask which one it is.

The verbs: :meth:`attach` / :meth:`detach` (start, stop: a node of the graph, or a worker the runtime offers
events through its host, :mod:`service.live.feeds`), :meth:`close` (service shut-down), :meth:`take_replayed` /
:meth:`offer_replayed` (the restart replay), :meth:`call` (once what was
handed over is matched), :meth:`checkpoint`, the restart position (``by_acks``: a worker's comes from its
acknowledgements, :meth:`WorkerRun.acked_position`; the graph's from its event-time horizon), and the counters
(:meth:`stats`, :meth:`counts`, :meth:`archive_load`). What a run needs of the runtime is
:class:`~service.live.live_query.RunHost` (the rule graph, ``offered``, the workers' host), not the runtime.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.detector import Detector
from engine.events import Event
from service.live.la_process import PooledQuery
from service.live.live_archived import LiveArchivedWorker
from service.live.live_query import LiveQuery, RunHost, RunOptions


def _base_counts(s: dict[str, Any]) -> tuple[int, int, float]:
    m = s.get("live_matcher", s)  # a live-and-archived runner nests its live matcher's counters
    return int(m.get("events", 0)), int(m.get("late", 0)), float(s.get("cpu_s", 0.0))


class GraphRun:
    """A statement the runtime's rule graph matches: its node (none for a FILTER rule, which the graph applies to
    each event before the others), fed by the ingest path; the runtime records its results under its lock.

    ``detector``: what runs it (None for a FILTER rule); ``node``: its node of the graph, once attached.
    """

    __slots__ = ("detector", "node")
    by_acks = False
    """Its restart position comes from its event-time horizon, not from acknowledgements."""

    def __init__(self, detector: Detector | None, node: Any = None) -> None:
        self.detector = detector
        self.node = node

    def attach(self, lq: LiveQuery, rt: RunHost) -> None:
        """Add it to the rule graph (derived event ids are made of (id, version))."""
        rt.graph.add(str(lq.id), lq.compiled, self.detector, version=lq.version)
        self.node = rt.graph.nodes.get(str(lq.id))

    def detach(self, lq: LiveQuery, rt: RunHost) -> None:
        """Remove it from the rule graph (its partial matches and open windows are dropped)."""
        rt.graph.remove(str(lq.id))

    def close(self) -> None:
        """Nothing runs beside the runtime."""

    def take_replayed(self, event: Event, seq: int | None) -> bool:
        """True: the replay pushes ``event`` through the rule graph."""
        return True

    def offer_replayed(self) -> None:
        """Nothing waits: the graph was pushed each event."""

    def call(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` now: what it was handed is matched."""
        fn()

    def settle(self, timeout_s: float) -> bool:
        """True: its results are recorded as ingest matches them (nothing waits)."""
        return True

    def extra_span_us(self, options: RunOptions) -> int:
        """Nothing beyond what the statement declares."""
        return 0

    def acked_position(self) -> int | None:
        """None: its position comes from its event-time horizon (:func:`service.live.recovery.horizon`)."""
        return None

    def checkpoint(self, lq: LiveQuery, next_seq: int, recorded: bool) -> None:
        """Take the checkpoint at ``next_seq`` when every result found so far is recorded (``recorded``)."""
        if recorded:
            lq.checkpoint_seq = next_seq

    def moved(self, lq: LiveQuery) -> bool:
        """Whether an event may have reached it since the last call (a FILTER rule: always)."""
        node = self.node
        if node is None:
            return True
        mark = (node.cpu_s, node.results, len(node.inbox))  # CPU time moves whenever an event reaches it
        if mark == lq.saved_mark:
            return False
        lq.saved_mark = mark
        return True

    def stats(self, lq: LiveQuery) -> dict[str, Any]:
        """Its detector's counters with the CPU time, results and failure of its node; a FILTER rule's counts."""
        if self.detector is None:  # a FILTER rule: the rule graph applies it, it keeps no detector
            f = lq.compiled.stats()  # type: ignore[union-attr]
            return {"events": f["kept"] + f["dropped"], "late": 0, "emitted": f["dropped"], "filter": f, "cpu_s": 0.0}
        cpu = self.node.cpu_s if self.node is not None else lq.cpu_s
        d = {**self.detector.stats(), "cpu_s": round(cpu, 6)}
        if self.node is not None:
            d["results"] = self.node.results
        if lq.failed is not None:
            d["failed"] = lq.failed
        return lq.with_cut(d)

    def counts(self, s: dict[str, Any]) -> dict[str, float]:
        """The counters of :meth:`stats` ``s`` that add up across restarts (matches: what it emitted)."""
        events, late, cpu = _base_counts(s)
        m = s.get("live_matcher", s)
        return {"events": events, "late": late, "matches": int(m.get("emitted", 0)), "cpu_s": cpu}

    def archive_load(self, s: dict[str, Any]) -> tuple[int, int] | None:
        """None: it makes no archive requests."""
        return None

    def held(self) -> dict[str, Any] | None:
        """What waits for its watermark: :meth:`engine.matcher.Matcher.held` (a detector without it holds nothing
        it can count) with the derived events in its node's inbox; None for a FILTER rule."""
        if self.detector is None:
            return None
        held_of = getattr(self.detector, "held", None)
        d: dict[str, Any] = (
            held_of() if held_of is not None else {"events": 0, "matches": 0, "earliest_us": None, "latest_us": None}
        )
        inbox = self.node.inbox if self.node is not None else []
        if inbox:
            times = [x[0] for x in inbox] + [t for t in (d["earliest_us"], d["latest_us"]) if t is not None]
            d = {**d, "events": d["events"] + len(inbox), "earliest_us": min(times), "latest_us": max(times)}
        return d


class WorkerRun:
    """A statement that reads the archive, run by a live-and-archived worker (its own thread, or its own
    process): the runtime offers it the events of its types and the watermark; the worker records its results
    itself, when the archive has answered (later than the events).

    ``worker``: the worker (:class:`QueryWorker`): a :class:`~service.live.live_archived.LiveArchivedWorker` on a
    thread of the service, or a query hosted by a worker process of the pool
    (:class:`~service.live.la_process.PooledQuery`). The runtime offers the events of every ingested batch to the
    host (:meth:`LiveRuntime.offer`, :mod:`service.live.feeds`), not to the run.
    """

    __slots__ = ("worker", "replayed", "replayed_seqs")
    by_acks = True
    """Its restart position is what its worker acknowledged (:meth:`acked_position`)."""

    def __init__(self, worker: LiveArchivedWorker | PooledQuery) -> None:
        self.worker = worker
        self.replayed: list[Event] = []
        self.replayed_seqs: list[int | None] = []

    def attach(self, lq: LiveQuery, rt: RunHost) -> None:
        """Be offered events (:meth:`LiveRuntime.offer`)."""
        rt.offered[lq.id] = lq

    def detach(self, lq: LiveQuery, rt: RunHost) -> None:
        """Be offered nothing more; stop the worker."""
        rt.offered.pop(lq.id, None)
        rt.workers.remove(lq.id)

    def close(self) -> None:
        """Stop the worker (service shut-down)."""
        self.worker.stop()

    def take_replayed(self, event: Event, seq: int | None) -> bool:
        """Keep ``event`` (at ingest position ``seq``) for :meth:`offer_replayed` (False: the graph need not push
        it for this statement)."""
        self.replayed.append(event)
        self.replayed_seqs.append(seq)
        return False

    def offer_replayed(self) -> None:
        """Hand the worker what the replay kept for it, in one batch."""
        if self.replayed:
            events, self.replayed = self.replayed, []
            seqs, self.replayed_seqs = self.replayed_seqs, []
            self.worker.offer(events, None, seqs=seqs)

    def call(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once the worker has matched what it was handed."""
        self.worker.call(fn)

    def settle(self, timeout_s: float) -> bool:
        """Have the worker answer what is due before it stops (:meth:`LiveArchivedWorker.settle`); False when it
        took more than ``timeout_s`` wall seconds."""
        return self.worker.settle(timeout_s)

    def extra_span_us(self, options: RunOptions) -> int:
        """Its tolerance ``T_L``: live instances wait that long for their subwindow to close."""
        return options.tolerance_us or 0

    def acked_position(self) -> int | None:
        """The smallest ingest position its worker's unfinished work needs, as the worker last acknowledged it
        (None: it has acknowledged nothing yet). Never waits: a busy worker's last acknowledgement stands."""
        acked = self.worker.acked
        return None if acked is None else acked[1]

    def checkpoint(self, lq: LiveQuery, next_seq: int, recorded: bool) -> None:
        """Nothing: its worker records its results later than the events, so no position says they all are."""

    def moved(self, lq: LiveQuery) -> bool:
        """Always: the worker moves on its own."""
        return True

    def stats(self, lq: LiveQuery) -> dict[str, Any]:
        """The worker's counters (its live matcher's under ``live_matcher``)."""
        return lq.with_cut(self.worker.stats())

    def counts(self, s: dict[str, Any]) -> dict[str, float]:
        """The counters of :meth:`stats` ``s`` that add up across restarts (matches: its results), with its live
        instances and archive requests."""
        events, late, cpu = _base_counts(s)
        return {
            "events": events,
            "late": late,
            "matches": int(s["results"]),
            "cpu_s": cpu,
            "live_instances": int(s.get("live_instances", 0)),
            "archive_requests": int(s.get("archive_requests", 0)),
        }

    def archive_load(self, s: dict[str, Any]) -> tuple[int, int] | None:
        """(archive requests made, live instances waiting for the archive) from :meth:`stats` ``s``."""
        return s.get("archive_requests", 0), s.get("pending_instances", 0) + s.get("in_flight_instances", 0)

    def held(self) -> dict[str, Any] | None:
        """None: its worker's live instances wait for the archive, not counted here (its ``live_archived`` stats
        say how many)."""
        return None

