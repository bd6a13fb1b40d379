"""ALAA: the active (eager) live-and-archived algorithm (001 section 4.1, Algorithm 1).

``P_L`` is matched live and ``P_A`` over the archive *continuously*: every archived event of
``P_A``'s types, whatever its key, goes through one long-lived archive matcher, and the archived
instances found are kept (:class:`~engine.live_archived.store.InstanceStore`). At the end of every
live window ``W_L`` (tumbling, event time), the archive is first matched up to the window's end
(one archive request for the new part of the largest access range ``R_max``), then every live
instance completed in the window is joined with the kept instances in its access range. Blind: it
matches ``P_A`` everywhere, needed or not.

    Cost_ALAA = |W_L| Cost_L + |R_max| Cost_RDB + |R_max| Cost_A + Cost_join N_InstL N_InstA   (001 eq. 1)
"""
from __future__ import annotations

from engine.events import Event
from engine.live_archived.base import MIN_TS, LiveInstance, Runner
from engine.live_archived.plan import NO_KEY, LiveArchivedPlan
from engine.live_archived.source import ArchiveSource
from engine.live_archived.store import InstanceStore
from engine.match import Match
from engine.matcher import LateEventError, Matcher


class ContinuousArchive:
    """``P_A`` matched over the archive as it grows, from ``start_us`` on; instances kept by key and start.

    Used by ALAA and by OLLAA's archive-driven mode. :meth:`catch_up` reads ``[covered, hi)`` in one
    request and advances the archive matcher to ``hi - 1`` (trailing negations that end before ``hi``
    are decided).
    """

    def __init__(self, runner: Runner, start_us: int) -> None:
        self.runner = runner
        self.covered = start_us
        self.matcher = Matcher(runner.plan.archived)
        self.store = InstanceStore(runner.plan)
        self.events = 0
        self.instances = 0

    def catch_up(self, hi_us: int) -> None:
        """Match the archive up to (not including) ``hi_us``."""
        if hi_us <= self.covered:
            return
        events = self.runner.request(None, [(self.covered, hi_us)])
        found: list[Match] = []
        push = self.matcher.push
        for e in sorted(events, key=Event.order_key):  # the request selects by end: one stretch of the stream
            try:
                got = push(e)
            except LateEventError:
                continue
            if got:
                found += got
        found += self.matcher.advance(hi_us - 1)
        for j in found:
            self.store.add(j)
        self.covered = hi_us
        self.events += len(events)
        self.instances += len(found)
        self.runner.counters.archived_instances += len(found)

    def evict(self, before_us: int) -> None:
        self.store.evict(before_us)


class ALAA(Runner):
    """Eager: ``P_A`` over the whole archive, joined at the end of every live window (module docstring).

    Parameters
    ----------
    window_us : int, optional
        ``W_L``, the live window, int us; default the live WITHIN, else the LOOKBACK.
    """

    algorithm = "alaa"
    reads_by_instance = False

    def __init__(
        self, plan: LiveArchivedPlan, source: ArchiveSource, *, window_us: int | None = None, **kw: object
    ) -> None:
        super().__init__(plan, source, **kw)  # type: ignore[arg-type]
        self.window_us = window_us or plan.live.window_us or plan.lookback_us
        self.window_end: int | None = None
        self.pending: list[LiveInstance] = []
        self.archive: ContinuousArchive | None = None
        self.windows = 0

    def on_time(self) -> list[Match]:
        if self.window_end is not None and self.watermark >= self.window_end:
            return self.close(self.window_end)
        return []

    def on_instances(self, insts: list[LiveInstance]) -> list[Match]:
        if self.window_end is None:
            self.window_end = (self.watermark // self.window_us + 1) * self.window_us
        self.pending.extend(insts)
        return []

    def finish(self) -> list[Match]:
        return self.close(self.watermark + 1)

    def idle(self) -> list[Match]:
        """The streams are quiet: close the open live window now, as the end of input does (see
        :meth:`Runner.idle`): its instances are complete and every event up to the watermark is archived (a later
        one is late), so catching the archive up to the watermark and joining them now gives their results."""
        return self.close(self.watermark + 1) if self.pending else []

    def own_deadline(self) -> int | None:
        """The end of the current live window ``W_L`` (its instances are joined then)."""
        return self.window_end

    def waiting(self) -> list[LiveInstance]:
        return self.pending

    def close(self, hi_us: int) -> list[Match]:
        """End of a live window: match the archive up to ``hi_us``, join the window's instances."""
        pending, self.pending, self.window_end = self.pending, [], None
        if not pending:
            return []
        self.windows += 1
        plan = self.plan
        if self.archive is None:
            horizon = self.horizon()  # None: a live instance may start anywhere before: match everything
            first = min(i.match.start for i in pending) - plan.lookback_us
            self.archive = ContinuousArchive(self, MIN_TS if horizon is None else min(first, horizon))
        self.archive.catch_up(hi_us)
        out: list[Match] = []
        for inst in pending:
            key = plan.key_of(inst.match)
            if key is NO_KEY:
                continue
            lo, hi = self.access(inst)
            self.join(inst, self.archive.store.candidates(key, lo, hi), out)
        self.answered(pending)  # joined here: their results are in ``out``
        horizon = self.horizon()
        if horizon is not None:
            self.archive.evict(horizon)
        return out

    def stats(self) -> dict[str, object]:
        d = super().stats()
        d["alaa"] = {
            "window_us": self.window_us,
            "windows": self.windows,
            "kept_instances": 0 if self.archive is None else self.archive.store.size,
        }
        return d
