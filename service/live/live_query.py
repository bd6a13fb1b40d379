"""A running statement of the live service: what runs it, how it is configured, its counters and its
checkpointed position in the ingest order (docs/architecture.md sections 4 and 6; the statement's row is
``service.db.models.QueryRow``, its API shape is made by the query routes)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.detector import RuleStatement, Statement
from engine.events import Event
from engine.rules.graph import RuleGraph
from service.db.models import QueryRow


def _opt_iso(us: int | None) -> str | None:
    if us is None:
        return None
    from engine.events import END_OF_TIME
    from service.schemas.common import iso

    return None if us >= END_OF_TIME else iso(us)


def counter_totals(counts: Mapping[str, float]) -> dict[str, int | float]:
    """Counters as the API answers them (``totals``), sorted by name: the CPU seconds (names ending ``_s``) as
    floats rounded to the microsecond, every other counter an int (what the JSON column of an older version
    stored as ``4.0`` too).

    >>> counter_totals({"events": 4.0, "cpu_s": 0.0123456789, "matches": 1})
    {'cpu_s': 0.012346, 'events': 4, 'matches': 1}
    """
    return {k: round(float(v), 6) if k.endswith("_s") else int(round(v)) for k, v in sorted(counts.items())}


@dataclass(slots=True)
class RunOptions:
    """How one query runs (``None``: the service default from the settings).

    ``algorithm`` and ``tolerance_us`` (SLLAA's ``T_L``, int microseconds) apply to live-and-archived
    queries; ``pm_capacity`` and ``pm_policy`` to every query.
    """

    algorithm: str | None = None
    tolerance_us: int | None = None
    pm_capacity: int | None = None
    pm_policy: str | None = None

    @classmethod
    def from_row(cls, row: QueryRow) -> RunOptions:
        """The options stored in a query's row."""
        return cls(row.algorithm, row.tolerance_us, row.pm_capacity, row.pm_policy)


class Workers(Protocol):
    """What a run needs of the host of the live-and-archived workers (:class:`~service.live.la_process.WorkerPool`,
    :class:`~service.live.feeds.ThreadWorkers`): to stop hosting a query."""

    def remove(self, query_id: int) -> None:
        """Stop query ``query_id``'s worker."""


class RunHost(Protocol):
    """What a run needs of the runtime it starts and stops in (:meth:`Run.attach`, :meth:`Run.detach`): the rule
    graph (a statement of the graph is its node), the statements the runtime offers events (``offered``: a
    live-and-archived query's) and the host of their workers. :class:`~service.live.runtime.LiveRuntime` is one."""

    @property
    def graph(self) -> RuleGraph:
        """The rule graph of every statement but the live-and-archived ones."""

    @property
    def offered(self) -> dict[int, LiveQuery]:
        """The statements run by live-and-archived workers, by id."""

    @property
    def workers(self) -> Workers:
        """Where the live-and-archived queries run."""


class Run(Protocol):
    """What runs a statement (:mod:`service.live.run`: :class:`~service.live.run.GraphRun` on the runtime's rule
    graph, :class:`~service.live.run.WorkerRun` on a live-and-archived worker): the verbs :class:`LiveQuery` asks it,
    and nothing else of it is read."""

    @property
    def by_acks(self) -> bool:
        """Whether the statement's restart position is what its worker acknowledged (:meth:`acked_position`)."""

    def attach(self, lq: LiveQuery, rt: RunHost) -> None:
        """Start running ``lq`` in ``rt``."""

    def detach(self, lq: LiveQuery, rt: RunHost) -> None:
        """Stop running ``lq`` in ``rt``."""

    def close(self) -> None:
        """Stop what runs beside the runtime (service shut-down)."""

    def take_replayed(self, event: Event, seq: int | None) -> bool:
        """Take an event of the restart replay; True when the rule graph must push it."""

    def offer_replayed(self) -> None:
        """Hand what the replay kept to the worker."""

    def call(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once what was handed over is matched."""

    def settle(self, timeout_s: float) -> bool:
        """Record the results already due before a stop on purpose; False past ``timeout_s``."""

    def extra_span_us(self, options: RunOptions) -> int:
        """What the run adds to the statement's state span, int us."""

    def acked_position(self) -> int | None:
        """The smallest ingest position the worker's unfinished work needs, as last acknowledged."""

    def checkpoint(self, lq: LiveQuery, next_seq: int, recorded: bool) -> None:
        """Take ``lq``'s checkpoint at ``next_seq`` when its results are all recorded."""

    def moved(self, lq: LiveQuery) -> bool:
        """Whether an event may have reached ``lq`` since the last call."""

    def stats(self, lq: LiveQuery) -> dict[str, Any]:
        """``lq``'s counters."""

    def counts(self, s: dict[str, Any]) -> dict[str, float]:
        """The counters of ``s`` that add up across restarts."""

    def archive_load(self, s: dict[str, Any]) -> tuple[int, int] | None:
        """(archive requests made, live instances waiting for the archive) from ``s``; None: it reads no archive."""

    def held(self) -> dict[str, Any] | None:
        """What waits for the watermark (None: it does not say)."""


@dataclass(slots=True)
class LiveQuery:
    """An active query: its compiled statement and what runs it.

    ``run`` runs it (:mod:`service.live.run`): the runtime's rule graph, or a live-and-archived worker for a
    statement that reads the archive. Its methods are the one protocol the runtime, the restart replay and the
    checkpoints use; none of them asks which ``run`` it holds.
    """

    id: int
    name: str
    compiled: Statement | RuleStatement
    run: Run
    max_lateness_us: int
    active_since_us: int
    options: RunOptions
    cpu_s: float = 0.0
    """CPU seconds spent matching (a statement of the graph without a node; a worker keeps its own)."""
    base: dict[str, float] = field(default_factory=dict)
    """Totals recorded before this start (kept across restarts and pauses)."""
    offset: dict[str, float] = field(default_factory=dict)
    """What the restart replay counted again: left out of the totals."""
    saved_mark: tuple[float, int, int] | None = None
    """(CPU seconds, results, events) of its graph node at the last checkpoint."""
    saved: dict[str, Any] | None = None
    """What the last checkpoint wrote to its row (not written again while unchanged)."""
    version: int = 1
    resume_seq: int | None = None
    """Its checkpoint: the position in the ingest order (:mod:`service.live.ingest_order`) from which a
    restart replays what rebuilds its state (None: not known yet; a restart then reads what it received
    after ``active_since_us`` within its event-time horizon)."""
    checkpoint_seq: int | None = None
    """The position its checkpoint was taken at (the next position then): every result of the events before it
    was recorded, so the restart replay rebuilds its state from ``resume_seq`` without alerting them again (an
    AGGREGATE window or a ``dedup`` chain the replay starts inside of would come out otherwise). None: not
    checkpointed since it started, or a live-and-archived query (its worker's results come later)."""
    warmed: bool = False
    """It started with ``?state=warm`` (:func:`service.live.warm.warm_query`): it counts as having received the events
    of its horizon ingested before ``active_since_us`` too, so the restart replay feeds them to it (its row's
    ``warmed``)."""
    replay_cut_us: int | None = None
    """How much event time the restart replay did not go back over for this query because of
    ``LACE_REPLAY_MAX_S`` (None: not cut); partial matches that started earlier were lost."""
    warm: dict[str, int] | None = None
    """What rebuilt this start's state from the archive (``state=warm``, a plan switch; None: nothing did):
    the answer of :func:`service.live.warm.warm_query` or :func:`service.live.warm.switch_plan`, shown as ``warm``."""
    failed: str | None = None
    """Why the query stopped matching: a plug-in it names misbehaved (issue 16); it sees no more events
    until it is updated or the service restarts, and the other queries go on."""

    # ------------------------------------------------------------------ running

    def attach(self, rt: RunHost) -> None:
        """Start running in ``rt``: a node of its rule graph, or a worker it offers events (call under its lock)."""
        self.run.attach(self, rt)

    def detach(self, rt: RunHost) -> None:
        """Stop running in ``rt`` (its state is dropped; call under its lock)."""
        self.run.detach(self, rt)

    def close(self) -> None:
        """Stop what runs beside the runtime (a worker; service shut-down)."""
        self.run.close()

    def take_replayed(self, event: Event, seq: int | None) -> bool:
        """Take an event the restart replay read for it (at ingest position ``seq``); True when the rule graph must
        push it (else its worker gets it with the others, :meth:`offer_replayed`)."""
        return self.run.take_replayed(event, seq)

    def offer_replayed(self) -> None:
        """Hand what the restart replay kept for it to its worker (nothing for a statement of the graph)."""
        self.run.offer_replayed()

    def settle(self, timeout_s: float) -> bool:
        """Before it stops on purpose (a pause): record the results already due (a live-and-archived query's
        completed live instances: their subwindow or live window closed, their archive requests answered); its
        partial matches are not completed. False when that took more than ``timeout_s`` wall seconds."""
        return self.run.settle(timeout_s)

    def note_checkpoint(self, next_seq: int, recorded: bool) -> None:
        """Take its checkpoint at ``next_seq`` when every result of the events before it is recorded: the runtime
        recorded all it found (``recorded``) and it records no results later (a worker does; then it keeps
        none)."""
        self.run.checkpoint(self, next_seq, recorded)

    def state_span_us(self) -> int | None:
        """How far before its newest event its state reaches, int microseconds (None: unbounded): what its
        statement declares (``state_span_us``), plus ``T_L`` for one run by a live-and-archived worker."""
        span: int | None = self.compiled.state_span_us
        return None if span is None else span + self.run.extra_span_us(self.options)

    @property
    def by_acks(self) -> bool:
        """Whether its restart position is what its worker acknowledged (a live-and-archived query:
        :meth:`acked_position`) rather than its event-time horizon."""
        return self.run.by_acks

    def acked_position(self) -> int | None:
        """The smallest ingest position its worker's unfinished work needs, as last acknowledged (None: no worker,
        or nothing acknowledged yet). Never waits."""
        return self.run.acked_position()

    def moved_since_checkpoint(self) -> bool:
        """Whether an event may have reached it since the last checkpoint (a worker: always)."""
        return self.run.moved(self)

    # ------------------------------------------------------------------ counters

    def counts(self) -> dict[str, float]:
        """The counters that add up across restarts, since this start."""
        return self.run.counts(self.stats())

    def totals(self) -> dict[str, int | float]:
        """Counters since the query was created or last updated, kept across restarts (see ``offset``)."""
        now = self.counts()
        keys = set(now) | set(self.base)
        return counter_totals({k: self.base.get(k, 0) + now.get(k, 0) - self.offset.get(k, 0) for k in keys})

    def mark_replayed(self) -> None:
        """The restart replay is done: what it counted is not counted again (for a worker, once it has matched
        the replayed events)."""
        self.run.call(self._forget_replayed)

    def _forget_replayed(self) -> None:
        self.offset = self.counts()

    def stats(self) -> dict[str, Any]:
        """The detector's counters (a live-and-archived query's are its worker's)."""
        return self.run.stats(self)

    def archive_load(self, stats: dict[str, Any]) -> tuple[int, int] | None:
        """(archive requests made, live instances waiting for the archive) from its :meth:`stats`; None when it
        reads no archive."""
        return self.run.archive_load(stats)

    def held(self, watermark_us: int | None) -> dict[str, Any] | None:
        """What of it waits for its watermark (``watermark_us``, int us; None: no event yet), as the API gives it
        (:class:`~service.schemas.resources.Held`): events not matched yet, complete matches waiting for a trailing
        negation's deadline, the earliest and latest event time among them and the watermark (ISO-8601). None: it
        does not say (a FILTER rule, a live-and-archived query)."""
        d = self.run.held()
        if d is None:
            return None
        return {
            "events": d["events"],
            "matches": d["matches"],
            "earliest": _opt_iso(d["earliest_us"]),
            "latest": _opt_iso(d["latest_us"]),
            "watermark": _opt_iso(watermark_us),
        }

    def with_cut(self, d: dict[str, Any]) -> dict[str, Any]:
        """``d`` with ``replay_cut_ms`` when the replay limit cut its state."""
        if self.replay_cut_us is not None:
            d["replay_cut_ms"] = self.replay_cut_us / 1_000
        return d
