"""OLLAA: LLAA ordered by selectivity (001 section 4.3 (1), Definition 6).

``Sel_P = N_P / |S|``: pattern instances per event of the query stream ``S`` (the events of both
patterns' types). The side with the lower selectivity drives:

- **live-driven** when ``Sel_PL <= Sel_PA``: exactly LLAA, one archive request per live instance;
- **archive-driven** when ``Sel_PA < Sel_PL``: the archived instances come first. ``P_A`` is matched
  over the archive continuously, by key, from the look-back horizon on, one request every ``T_L``
  of event time (live events wait for it, so results are at most ``T_L`` late), and the instances
  are kept by key. A live event then reaches the live matcher only when its key has an archived
  instance that could join an instance starting at it (it *opens* the key for the live window), or
  its key is open, or sampled: the live matcher keeps state only for keys that can produce results.
  Every live instance is joined with the kept instances; no per-instance requests.

``Sel_PA`` comes from archive statistics (:meth:`ArchiveSource.selectivity` and
:meth:`ArchiveSource.count` over the last decision period), ``Sel_PL`` from online sampling (all
live events in live-driven mode; a fixed hash sample of keys, never filtered, in archive-driven
mode). The first choice is made as soon as ``min_sample`` live events were seen, then every
``decide_every_us`` of event time; every decision, with its inputs, is in ``stats()["ollaa"]``.

Exactness of the filter: an instance ``I`` that joins something starts at an event that opens its
key (the store holds every archived instance that ends before ``I.start``), and an open key passes
every event up to ``I.start + WITHIN``, so all of ``I``'s events and negation windows reach the
matcher. The filter needs the live side partitioned by the JOIN's key attribute (not
``strict_contiguity``) and a bounded live window; otherwise archive-driven mode filters nothing.
"""
from __future__ import annotations

import zlib
from collections.abc import Callable, Hashable
from typing import Any

from engine.events import Event
from engine.live_archived.alaa import ContinuousArchive
from engine.live_archived.base import MIN_TS, LiveInstance
from engine.live_archived.llaa import LLAA
from engine.live_archived.plan import NO_KEY, LiveArchivedPlan
from engine.live_archived.source import ArchiveSource
from engine.match import Match
from engine.matcher import LateEventError

Chooser = Callable[[float, float], str]


def paper_rule(sel_live: float, sel_archived: float) -> str:
    """001 section 4.3: live drives when ``Sel_PL <= Sel_PA``, the archive otherwise."""
    return "live" if sel_live <= sel_archived else "archive"


class OLLAA(LLAA):
    """Selectivity-ordered LLAA (see the module docstring).

    Parameters
    ----------
    tolerance_us : int
        ``T_L``: in archive-driven mode the archive is brought up to date (one request) every
        ``max(T_L, 1 us)`` of event time and live events wait for it.
    decide_every_us : int, optional
        Event time between decisions; default the LOOKBACK.
    sample_rate : float
        Fraction of keys never filtered in archive-driven mode (they measure ``Sel_PL``).
    min_sample : int
        Events needed on each side before a decision is made.
    mode : {"auto", "live", "archive"}
        ``auto`` decides by selectivity; the others fix the mode (benchmarks, tests).
    chooser : callable, optional
        ``(Sel_PL, Sel_PA) -> "live" | "archive"``; default :func:`paper_rule`.
    """

    algorithm = "ollaa"

    def __init__(
        self,
        plan: LiveArchivedPlan,
        source: ArchiveSource,
        *,
        tolerance_us: int = 0,
        decide_every_us: int | None = None,
        sample_rate: float = 0.1,
        min_sample: int = 200,
        mode: str = "auto",
        chooser: Chooser | None = None,
        **kw: Any,
    ) -> None:
        if mode not in ("auto", "live", "archive"):
            raise ValueError(f"mode must be auto, live or archive, not {mode!r}")
        super().__init__(plan, source, **kw)
        self.refresh_us = max(tolerance_us, 1)
        self.decide_every_us = decide_every_us or plan.lookback_us
        self.sample_cut = int(sample_rate * 10_000)
        self.min_sample = min_sample
        self.fixed = None if mode == "auto" else mode
        self.chooser = chooser or paper_rule
        key = plan.key
        live = plan.live
        gate = key is not None and key.live_attr in live.partition_by and live.strategy != "strict_contiguity"
        self.gate_attr = key.live_attr if gate and key is not None and plan.live_span_us is not None else None
        self.mode = "live"
        self.archive: ContinuousArchive | None = None
        self.batch: list[tuple[Event, float]] = []
        self.batch_end: int | None = None
        self.open_until: dict[Hashable, int] = {}
        self.open_all_until = MIN_TS
        self.next_decision: int | None = None
        self.period_start = MIN_TS
        self.period_events = 0
        self.period_instances = 0
        self.decisions: list[dict[str, Any]] = []
        self.tried = False
        self.filtered = 0
        self.switches = 0

    # ------------------------------------------------------------------ sampling

    def sampled(self, key: Hashable) -> bool:
        """Whether ``key`` is in the fixed sample (a hash of its text, the same in every process)."""
        return zlib.crc32(repr(key).encode()) % 10_000 < self.sample_cut

    def _observed(self, key: Hashable) -> bool:
        return self.mode == "live" or self.gate_attr is None or self.sampled(key)

    # ------------------------------------------------------------------ the runner's hooks

    def on_time(self) -> list[Match]:
        out: list[Match] = []
        wm = self.watermark
        if self.mode == "archive" and self.batch_end is not None and wm >= self.batch_end:
            out += self.process_batch(self.batch_end)
        if self.next_decision is None:
            self.next_decision = wm + self.decide_every_us
            self.period_start = wm
            if self.fixed is not None:
                out += self.switch(self.fixed, {"at_us": wm, "mode": self.fixed, "reason": "fixed"})
        elif wm >= self.next_decision or (not self.tried and self.period_events >= max(self.min_sample, 1)):
            self.tried = True  # the first decision comes as soon as the sample is big enough
            out += self.decide(wm)
        return out

    def on_event(self, event: Event, now: float) -> list[Match]:
        if event.type in self.plan.stream_types:
            key = event.get(self.gate_attr) if self.gate_attr is not None else None
            if self._observed(key):
                self.period_events += 1
        if self.mode == "live":
            return super().on_event(event, now)
        if event.type not in self.plan.live_types:
            return []
        self.batch.append((event, now))
        if self.batch_end is None:
            self.batch_end = event.ts + self.refresh_us
        return []

    def on_instances(self, insts: list[LiveInstance]) -> list[Match]:
        for inst in insts:
            if self._observed(self.plan.key_of(inst.match)):
                self.period_instances += 1
        if self.mode == "live":
            return super().on_instances(insts)
        assert self.archive is not None
        out: list[Match] = []
        store = self.archive.store
        for inst in insts:
            key = self.plan.key_of(inst.match)
            if key is NO_KEY:
                continue
            lo, hi = self.access(inst)
            self.join(inst, store.candidates(key, lo, hi), out)
        self.answered(insts)  # joined here: their results are in ``out``
        return out

    def advance(self, watermark_us: int) -> list[Match]:
        out: list[Match] = []
        if self.mode == "archive":
            self.watermark = max(self.watermark, watermark_us)
            out += self.process_batch(watermark_us + 1)
        return out + super().advance(watermark_us)

    def finish(self) -> list[Match]:
        return []

    def idle(self) -> list[Match]:
        """The streams are quiet (:meth:`Runner.idle`): in archive-driven mode, bring the archive up to the
        watermark and run the live events held for the next refresh now, as the refresh would (every event up to
        the watermark is archived); their complete instances are joined. Live-driven mode holds nothing."""
        if self.mode == "archive" and self.batch:
            return self.process_batch(self.watermark + 1)
        return []

    def own_deadline(self) -> int | None:
        """The next archive refresh (archive-driven mode) or selectivity decision, whichever is first."""
        times = [t for t in (self.batch_end if self.mode == "archive" else None, self.next_decision) if t is not None]
        return min(times) if times else None

    def flush(self) -> list[Match]:
        out: list[Match] = []
        if self.mode == "archive":
            out += self.process_batch(self.watermark + 1)
        return out + super().flush()

    # ------------------------------------------------------------------ archive-driven mode

    def process_batch(self, hi_us: int) -> list[Match]:
        """Bring the archive up to ``hi_us``, then run the buffered live events through the filter."""
        assert self.archive is not None
        batch, self.batch, self.batch_end = self.batch, [], None
        self.archive.catch_up(hi_us)
        out: list[Match] = []
        attr = self.gate_attr
        span = self.plan.live_span_us or 0
        store = self.archive.store
        for event, wall in batch:
            if attr is not None:
                key = event.get(attr)
                if not self.sampled(key):
                    if store.has_candidate(key, event.ts):  # it may start an instance that joins: open the key
                        if self.open_until.get(key, MIN_TS) < event.ts + span:
                            self.open_until[key] = event.ts + span
                    elif event.ts > self.open_all_until and self.open_until.get(key, MIN_TS) < event.ts:
                        self.filtered += 1
                        continue
            try:
                found = self.push_live(event)
            except LateEventError:
                continue  # counted by the live matcher
            if found:
                out += self.completed(found, wall, at_ts=event.ts)
        # every event before hi_us is here (the one being pushed may share the watermark's ts): the
        # live matcher's clock moves on even when the filter held its events back
        settled = min(hi_us, self.watermark) - 1
        if settled > self.live.watermark:
            found = self.advance_live(settled)
            if found:
                out += self.completed(found, self.clock(), at_ts=settled)
        horizon = self.horizon()
        if horizon is not None:
            self.archive.evict(horizon)
            if len(self.open_until) > 4096:
                self.open_until = {k: t for k, t in self.open_until.items() if t >= self.watermark}
        return out

    # ------------------------------------------------------------------ choosing

    def decide(self, wm: int) -> list[Match]:
        lo = max(self.period_start, wm - self.decide_every_us)
        entry: dict[str, Any] = {
            "at_us": wm,
            "live_events": self.period_events,
            "live_instances": self.period_instances,
        }
        self.next_decision = wm + self.decide_every_us
        self.period_start = wm
        if self.fixed is not None:
            self.period_events = self.period_instances = 0
            return []
        plan = self.plan
        types = sorted(plan.stream_types)
        n_stream = self.source.count(types, None, (lo, wm))
        self.counters.stat_requests += 1
        entry["archived_events"] = n_stream
        if self.period_events < max(self.min_sample, 1) or n_stream < max(self.min_sample, 1):
            entry.update(mode=self.mode, reason="too few events to estimate")
            self.decisions.append(entry)
            return []
        sel_a = self.source.selectivity(plan.archived, (lo, wm))
        self.counters.stat_requests += 1
        if set(plan.archived_types) != plan.stream_types:
            n_a = self.source.count(plan.archived_types, None, (lo, wm))
            self.counters.stat_requests += 1
            sel_a = sel_a * n_a / n_stream
        sel_l = self.period_instances / self.period_events
        self.period_events = self.period_instances = 0
        mode = self.chooser(sel_l, sel_a)
        reason = "Sel_PL <= Sel_PA" if mode == "live" else "Sel_PA < Sel_PL"
        entry.update(sel_live=sel_l, sel_archived=sel_a, mode=mode, reason=reason)
        return self.switch(mode, entry)

    def switch(self, mode: str, entry: dict[str, Any]) -> list[Match]:
        """Record the decision; change mode (exactly: see the module docstring)."""
        self.decisions.append(entry)
        if mode == self.mode:
            return []
        self.switches += 1
        out: list[Match] = []
        span = self.plan.live_span_us
        if mode == "archive":
            horizon = self.horizon()
            self.archive = ContinuousArchive(self, MIN_TS if horizon is None else horizon)
            # live instances already under way get every event of their window
            self.open_all_until = (1 << 62) if span is None else self.watermark + span
            self.open_until.clear()
            self.mode = "archive"
        else:
            if self.batch:
                out += self.process_batch(self.watermark + 1)
            self.archive = None
            self.mode = "live"
        return out

    def stats(self) -> dict[str, Any]:
        d = super().stats()
        d["ollaa"] = {
            "mode": self.mode,
            "switches": self.switches,
            "filter_attr": self.gate_attr,
            "live_events_filtered": self.filtered,
            "refresh_us": self.refresh_us,
            "decide_every_us": self.decide_every_us,
            "decisions": self.decisions,
        }
        return d
