"""A running statement of the live service: what runs it, how it is configured, its counters and its
checkpointed position in the ingest order (docs/architecture.md sections 4 and 6; the statement's row is
``service.db.models.QueryRow``, its API shape is made by the query routes)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.detector import Detector, RuleStatement, Statement
from service.db.models import QueryRow
from service.live.la_process import ProcessWorker
from service.live.live_archived import LiveArchivedWorker


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


@dataclass(slots=True)
class LiveQuery:
    """An active query: its compiled statement and what runs it.

    ``detector`` is the live-only query's matcher (None for a live-and-archived query, which runs
    on ``worker``).
    """

    id: int
    name: str
    compiled: Statement | RuleStatement
    detector: Detector | None
    worker: LiveArchivedWorker | ProcessWorker | None
    max_lateness_us: int
    active_since_us: int
    options: RunOptions
    offered_wm: int | None = None
    offered_idle: bool = False
    """Its worker was told that every type it reads is idle or ended (told once per quiet spell)."""
    cpu_s: float = 0.0
    """CPU seconds spent matching (live-only; a live-and-archived query's worker keeps its own)."""
    base: dict[str, float] = field(default_factory=dict)
    """Totals recorded before this start (kept across restarts and pauses)."""
    offset: dict[str, float] = field(default_factory=dict)
    """What the restart replay counted again: left out of the totals."""
    node: Any = None
    """Its node in the runtime's rule graph (every statement but a live-and-archived one)."""
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
    replay_cut_us: int | None = None
    """How much event time the restart replay did not go back over for this query because of
    ``LACE_REPLAY_MAX_S`` (None: not cut); partial matches that started earlier were lost."""
    warm: dict[str, int] | None = None
    """What rebuilt this start's state from the archive (``state=warm``, a plan switch; None: nothing did):
    the answer of :meth:`LiveRuntime.warm_query` or :meth:`LiveRuntime.switch_plan`, shown as ``warm``."""
    failed: str | None = None
    """Why the query stopped matching: a plug-in it names misbehaved (issue 16); it sees no more events
    until it is updated or the service restarts, and the other queries go on."""

    def state_span_us(self) -> int | None:
        """How far before its newest event its state reaches, int microseconds (None: unbounded): what its
        statement declares (``state_span_us``), plus ``T_L`` for one run by a live-and-archived worker."""
        span: int | None = self.compiled.state_span_us
        if span is not None and self.worker is not None:
            span += self.options.tolerance_us or 0
        return span

    def pending_from_us(self) -> int | None:
        """The event time of its oldest result still being worked on (a live-and-archived worker's live
        instances waiting for the archive; None: none, or no worker). May wait 0.2 s for a busy worker."""
        return None if self.worker is None else self.worker.resume_from_us()

    def moved_since_checkpoint(self) -> bool:
        """Whether an event may have reached it since the last checkpoint (a worker: always)."""
        node = self.node
        if node is None:
            return True
        mark = (node.cpu_s, node.results, len(node.inbox))  # CPU time moves whenever an event reaches it
        if mark == self.saved_mark:
            return False
        self.saved_mark = mark
        return True

    def counts(self) -> dict[str, float]:
        """The counters that add up across restarts, since this start."""
        s = self.stats()
        m = s.get("live_matcher", s)
        out = {
            "events": float(m.get("events", 0)),
            "late": float(m.get("late", 0)),
            "matches": float(s["results"] if self.worker is not None else m.get("emitted", 0)),
            "cpu_s": float(s.get("cpu_s", 0.0)),
        }
        if self.worker is not None:
            out["live_instances"] = float(s.get("live_instances", 0))
            out["archive_requests"] = float(s.get("archive_requests", 0))
        return out

    def totals(self) -> dict[str, float]:
        """Counters since the query was created or last updated, kept across restarts (see ``offset``)."""
        now = self.counts()
        keys = set(now) | set(self.base)
        return {k: round(self.base.get(k, 0.0) + now.get(k, 0.0) - self.offset.get(k, 0.0), 6) for k in sorted(keys)}

    def mark_replayed(self) -> None:
        """The restart replay is done: what it counted is not counted again."""
        self.offset = self.counts()

    @property
    def live_archived(self) -> bool:
        return self.worker is not None

    def stats(self) -> dict[str, Any]:
        """The detector's counters (a live-and-archived query's include the worker's)."""
        if self.worker is not None:
            return self._with_cut(self.worker.stats())
        if self.detector is None:  # a FILTER rule: the rule graph applies it, it keeps no detector
            f = self.compiled.stats()  # type: ignore[union-attr]
            return {"events": f["kept"] + f["dropped"], "late": 0, "emitted": f["dropped"], "filter": f, "cpu_s": 0.0}
        assert self.detector is not None
        cpu = self.node.cpu_s if self.node is not None else self.cpu_s
        d = {**self.detector.stats(), "cpu_s": round(cpu, 6)}
        if self.node is not None:
            d["results"] = self.node.results
        if self.failed is not None:
            d["failed"] = self.failed
        return self._with_cut(d)

    def _with_cut(self, d: dict[str, Any]) -> dict[str, Any]:
        if self.replay_cut_us is not None:
            d["replay_cut_ms"] = self.replay_cut_us / 1_000
        return d

