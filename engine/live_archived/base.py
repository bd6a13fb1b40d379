"""What the four live-and-archived algorithms share (001 section 4, docs/architecture.md section 7.7).

A :class:`Runner` owns the live matcher of ``P_L`` and offers the engine's verbs: ``push(event)``,
``advance(watermark)``, ``flush()``, ``stats()``. Each algorithm decides *when* it asks the archive
(:meth:`Runner.request`), over which ranges and keys, and how it finds the archived instances
(:meth:`Runner.match_archived`); the join, the results and the counters are common.

The caller archives every event before pushing it (the stream *is* the archive's future); a live
instance ``I`` only ever reads ``[I.start - lookback, I.start)``, which is in the archive by then.
Timestamps are int microseconds UTC.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from engine.events import END_OF_TIME, Event
from engine.live_archived.counters import RunCounters
from engine.live_archived.known_ranges import FedEvents, KnownRanges
from engine.live_archived.ledger import Ledger
from engine.live_archived.memo import ArchivedMemo
from engine.live_archived.plan import LiveArchivedPlan, Range
from engine.live_archived.source import ArchiveSource, Ranges
from engine.lql.pattern_checks import single_event_var
from engine.match import Match
from engine.matcher import LateEventError, Matcher
from engine.pm.store import PartialMatchStore

MIN_TS = -(1 << 62)
NO_EVENTS: dict[str, tuple[Event, ...]] = {}
"""No events bound: the other side's argument when one side of a JOIN equality is evaluated alone."""


def never_equal(value: object) -> bool:
    """A JOIN equality with this side never holds (null, or NaN: ``NaN == NaN`` is false, as in WHERE)."""
    return value is None or value != value


@dataclass(slots=True)
class LiveInstance:
    """A complete live instance and when it completed.

    Attributes
    ----------
    match : Match
        The match of ``P_L``.
    completed_ts : int
        The watermark (event time, int us) when the live matcher reported it.
    completed_wall : float
        The clock (seconds) when the event that completed it was pushed.
    requested_ts : int | None
        The event time (int us) when the archive request that answers it was made (:meth:`Runner.submit`):
        the watermark then, or its own ``completed_ts`` when the watermark is the end of time (the end of a
        stream: nothing waited in event time). Its event-time delay is measured to this, not to the watermark
        when the answer came back (which may have moved on by years: issue 25). None until then.
    """

    match: Match
    completed_ts: int
    completed_wall: float
    requested_ts: int | None = None


@dataclass(slots=True)
class ArchiveWork:
    """One archive request and the joins that wait on it, handed to a runner's ``defer`` callback.

    ``run()`` makes the request (e.g. one Spark job), matches ``P_A`` over what came back, joins
    ``instances`` and returns their results; it may run on another thread (the runner's counters are
    updated under its lock). Calling it twice repeats the work.

    Attributes
    ----------
    instances : list[LiveInstance]
        The completed live instances it answers (one for LLAA, a subwindow for SLLAA).
    answer : callable
        ``answer(instances) -> list[Match]``: one request for ``instances``, their joins.
    mergeable : bool
        Whether the work may be merged with other waiting work of the same runner into one request
        over the union of their access ranges (SLLAA: subwindows that closed while the archive was
        busy; every instance's whole access range is still requested, so nothing is lost). False:
        never merged (LLAA's one request per live instance).
    """

    instances: list[LiveInstance]
    answer: Callable[[list[LiveInstance]], list[Match]]
    mergeable: bool = False
    earliest_start_us: int = field(init=False)

    def __post_init__(self) -> None:
        self.earliest_start_us = min(i.match.start for i in self.instances)

    def run(self) -> list[Match]:
        """Make the request and return the results of every instance."""
        return self.answer(self.instances)

    @staticmethod
    def merged(works: list[ArchiveWork]) -> ArchiveWork:
        """One work answering every instance of ``works`` (all mergeable, of one runner) with one request."""
        assert all(w.mergeable for w in works)
        return ArchiveWork([i for w in works for i in w.instances], works[0].answer, mergeable=True)


class Runner:
    """Base class: the live matcher, the join and the counters of one live-and-archived query.

    Parameters
    ----------
    plan : LiveArchivedPlan
        From :func:`engine.live_archived.plan.compile_live_archived`.
    source : ArchiveSource
        The archive (it must hold every pushed event before the next request).
    pm_capacity, pm_policy, pm_store, pm_query_id
        Partial-match management of the live matcher (docs/architecture.md section 7.6), as for
        :class:`engine.matcher.Matcher`.
    clock : callable
        Wall clock in seconds (``time.perf_counter``), for the wall-time delays.
    allowed_lateness_us : int or dict
        How far out of (ts, id) order events may arrive, per event type or for all, int microseconds:
        the live matcher buffers them, and the runner's watermark (which closes subwindows and live
        windows) trails the newest ts by the largest lateness. Default 0: events in order.
    defer : callable, optional
        Receives every deferrable archive request as an :class:`ArchiveWork` instead of running it
        at once (the service answers them on a bounded pool of Spark threads; ingest never waits).
        Its results then come from ``work.run()``, not from ``push``/``advance``. None: run at once.
    """

    algorithm: ClassVar[str] = ""
    index_by_start: ClassVar[bool] = False
    """The order of the known ranges' index buckets (:meth:`join_known`): by start (SLLAA's, as its per-subwindow
    index had them) or by end (the order of :meth:`archived_in`'s matches, LLAA's and OLLAA's)."""
    reads_by_instance: ClassVar[bool] = True
    """Its requests read live instances' access ranges (:meth:`archived_in`); ALAA reads the archive as it grows."""

    def __init__(
        self,
        plan: LiveArchivedPlan,
        source: ArchiveSource,
        *,
        pm_capacity: int | None = None,
        pm_policy: str = "stpm",
        pm_store: PartialMatchStore | None = None,
        clock: Callable[[], float] = time.perf_counter,
        allowed_lateness_us: int | dict[str, int] = 0,
        pm_query_id: str | None = None,
        defer: Callable[[ArchiveWork], None] | None = None,
        known_ranges: bool = False,
    ) -> None:
        self.plan = plan
        self.defer = defer
        self.lock = threading.Lock()
        """Guards the counters against deferred work running on other threads."""
        self.source = source
        self.clock = clock
        self.live = Matcher(
            plan.live,
            allowed_lateness_us=allowed_lateness_us,
            pm_capacity=pm_capacity,
            pm_policy=pm_policy,
            pm_store=pm_store,
            pm_query_id=pm_query_id,
        )
        lateness = allowed_lateness_us.values() if isinstance(allowed_lateness_us, dict) else [allowed_lateness_us]
        self.lateness_us = max(lateness, default=0)
        self.counters = RunCounters(self.algorithm)
        self.archived_memo: ArchivedMemo | None = (
            ArchivedMemo() if single_event_var(plan.archived.ast) is not None else None
        )
        """Each archived event's matches of a one-event ``P_A``, reused by later requests (:class:`ArchivedMemo`)."""
        self._equi_cache: dict[int, tuple[Match, tuple[Any, ...]]] | None = (
            {} if self.archived_memo is not None and plan.join_equi else None
        )
        """``id(j) -> (j, archived sides of the JOIN equalities)`` for the memo's archived instances."""
        one_type = len(plan.archived_types) == 1 and frozenset(plan.archived_types) == plan.live_types
        self.known_ranges: KnownRanges | None = (
            KnownRanges() if known_ranges and self.reads_by_instance and one_type and self.archived_memo is not None
            else None
        )
        """The access ranges read and ``P_A``'s matches in them, by key (:mod:`engine.live_archived.known_ranges`):
        with ``known_ranges`` (the caller refuses late events of the type, so a range read stays as read), a
        one-event ``P_A`` over the one type ``P_L`` reads; requests read only what was not read before."""
        if self.known_ranges is not None:  # a hash join index kept as matches become known
            self.known_ranges.index_by(self._bucket_values, by_start=self.index_by_start)
        self.fed: FedEvents | None = (
            None if self.known_ranges is None
            else FedEvents(self._match_fresh, self._key_of, self.lateness_us)
        )
        """``P_A``'s matches of the events of that type this runner was fed (with :attr:`known_ranges`): the newest
        parts of a request come from them, not from the archive."""
        self.ledger: Ledger | None = None
        """The query's unfinished work (:class:`~engine.live_archived.ledger.Ledger`), when a service worker keeps
        one: every live instance enters at :meth:`completed`; the runner marks those it answers itself
        (:meth:`answered`); the worker takes them out once their results are committed."""
        self.watermark = MIN_TS
        self.live_clock = MIN_TS
        """Event time the live matcher has reached: later live instances start after ``live_clock - span``."""
        self._started: float | None = None

    # ------------------------------------------------------------------ the engine's verbs

    def push(self, event: Event) -> list[Match]:
        """Offer one live event (already archived); return the results it made due.

        Raises
        ------
        LateEventError
            From the live matcher, for an event behind the watermark (counted there).
        """
        now = self._now()
        self.counters.live_events += 1
        if self.fed is not None:
            self.fed.feed((event,))
        if event.ts_end - self.lateness_us > self.watermark:  # ts_end: the matcher's time (issue 15)
            self.watermark = event.ts_end - self.lateness_us
        out = self.on_time()
        out += self.on_event(event, now)
        return out

    def push_many(self, events: Sequence[Event]) -> tuple[list[Match], int]:
        """:meth:`push` of each of ``events`` in order, with one clock reading for the batch (its live instances'
        ``completed_wall``): ``(the results they made due, how many were late)``. A late event (behind the
        watermark, :class:`LateEventError` from the live matcher) is counted and skipped, as a caller of :meth:`push`
        does; the results made due before it are kept."""
        now = self._now()
        self.counters.live_events += len(events)
        if self.fed is not None:
            self.fed.feed(events)  # the query's events are all of the one type P_A reads
        lateness = self.lateness_us
        on_time, on_event = self.on_time, self.on_event
        out: list[Match] = []
        late = 0
        for event in events:
            end = event.ts_end - lateness  # ts_end: the matcher's time (issue 15)
            if end > self.watermark:
                self.watermark = end
            found = on_time()
            if found:
                out += found
            try:
                found = on_event(event, now)
            except LateEventError:
                late += 1
                continue
            if found:
                out += found
        return out, late

    def advance(self, watermark_us: int) -> list[Match]:
        """Declare that no event with ``ts <= watermark_us`` will come (closes windows and subwindows)."""
        now = self._now()
        if watermark_us > self.watermark:
            self.watermark = watermark_us
        out = self.on_time()
        found = self.advance_live(watermark_us)
        if found:
            out += self.completed(found, now)
        return out

    def flush(self) -> list[Match]:
        """End of stream: complete every live instance, answer every pending one, stop the clock."""
        now = self._now()
        found = self.live.flush()
        out = self.completed(found, now) if found else []
        out += self.finish()
        self.counters.wall_s = self.clock() - (self._started or now)
        return out

    def stats(self) -> dict[str, Any]:
        """The run's counters (:class:`RunCounters`) and the live matcher's (``live_matcher``)."""
        with self.lock:
            d = self.counters.as_dict()
        d["live_matcher"] = self.live.stats()
        d["pending_instances"] = len(self.waiting())
        if self.known_ranges is not None:
            d["known_ranges"] = self.known_ranges.stats()
        if self.fed is not None:
            d["known_ranges"].update(self.fed.stats())
        return d

    def idle(self) -> list[Match]:
        """The query's streams are quiet (idle or ended): close what waits only to batch archive requests (SLLAA's
        open subwindow, ALAA's live window; their instances are complete and their access ranges archived, so closing
        early changes no result). Never completes a live instance or a query's window: that needs event time
        (:meth:`advance`)."""
        return []

    def next_deadline(self) -> int | None:
        """The smallest watermark at which :meth:`advance` would emit or close something (None: none)."""
        own = self.own_deadline()
        live = self.live.next_deadline()
        if own is None:
            return live
        return own if live is None else min(own, live)

    def own_deadline(self) -> int | None:
        """The algorithm's own next deadline (a subwindow or live window to close); None: none."""
        return None

    def waiting(self) -> list[LiveInstance]:
        """Completed live instances waiting for their archive request (deferred work not included)."""
        return []

    # ------------------------------------------------------------------ what an algorithm overrides

    def on_time(self) -> list[Match]:
        """The watermark moved (``self.watermark``): close what is due."""
        return []

    def on_event(self, event: Event, now: float) -> list[Match]:
        """Give ``event`` to the live matcher (OLLAA filters or defers here)."""
        found = self.push_live(event)
        return self.completed(found, now) if found else []

    def on_instances(self, insts: list[LiveInstance]) -> list[Match]:
        """Live instances just completed."""
        raise NotImplementedError

    def finish(self) -> list[Match]:
        """End of stream: answer every live instance still waiting."""
        return []

    # ------------------------------------------------------------------ helpers

    def _now(self) -> float:
        now = self.clock()
        if self._started is None:
            self._started = now
        return now

    def push_live(self, event: Event) -> list[Match]:
        """``live.push(event)``, keeping :attr:`live_clock` (the matcher ignores other types' events)."""
        found = self.live.push(event)
        if event.type in self.plan.live_types and event.ts_end - self.lateness_us > self.live_clock:
            self.live_clock = event.ts_end - self.lateness_us  # a buffered (late) event may still start one
        return found

    def advance_live(self, watermark_us: int) -> list[Match]:
        """``live.advance(watermark_us)``, keeping :attr:`live_clock`."""
        found = self.live.advance(watermark_us)
        self.live_clock = max(self.live_clock, watermark_us)
        return found

    def horizon(self) -> int | None:
        """Archived instances starting before this can join no later live instance (None: unbounded).

        Every live instance not yet reported starts after ``live_clock - span`` (it ends, or its
        trailing negation is decided, after ``live_clock``).
        """
        span = self.plan.live_span_us
        return None if span is None else self.live_clock - span - self.plan.lookback_us

    def completed(self, found: list[Match], now: float, at_ts: int | None = None) -> list[Match]:
        """Hand the live matches ``found`` (completed at event time ``at_ts``, default: the watermark) on."""
        self.counters.live_instances += len(found)
        ts = self.watermark if at_ts is None else at_ts
        insts = [LiveInstance(m, ts, now) for m in found]
        if self.ledger is not None:
            for inst in insts:
                self.ledger.enter(inst)
        return self.on_instances(insts)

    def answered(self, instances: list[LiveInstance]) -> None:
        """``instances`` are answered here, on the caller's thread: their results (maybe none) are in what the
        current ``push``/``advance``/``idle``/``flush`` returns (:meth:`Ledger.answered`)."""
        if self.ledger is not None:
            self.ledger.answered(instances)

    def submit(
        self,
        instances: list[LiveInstance],
        answer: Callable[[list[LiveInstance]], list[Match]],
        *,
        mergeable: bool = False,
    ) -> list[Match]:
        """Answer ``instances`` now, or hand the work to :attr:`defer` (then return nothing).

        ``mergeable``: see :class:`ArchiveWork`.
        """
        for inst in instances:  # at the end of input the watermark is END_OF_TIME: nothing waited in event time
            inst.requested_ts = self.watermark if self.watermark < END_OF_TIME else inst.completed_ts
        work = ArchiveWork(instances, answer, mergeable)
        if self.defer is None:
            out = work.run()
            self.answered(instances)
            return out
        self.defer(work)  # its instances leave the ledger when the worker has committed its results
        return []

    def request(self, keys: Iterable[Hashable] | None, ranges: Ranges, *, logical: bool = True) -> list[Event]:
        """One archive request for ``P_A``'s types (see :meth:`ArchiveSource.extract`), naming ``P_A``: the
        source may leave out events that can be in none of its matches. ``logical``: count it in
        ``archive_requests`` (False: a read for a request counted already, :meth:`archived_in`)."""
        key_attr = self.plan.key.attr if self.plan.key is not None else None
        events = self.source.extract(self.plan.archived_types, keys, ranges, key_attr=key_attr,
                                     pattern=self.plan.archived)
        with self.lock:
            self.counters.archive_requests += int(logical)
            self.counters.archived_events_scanned += len(events)
        return events

    def archived_in(
        self, request: dict[Hashable, list[Range]], *, collect: bool = True, logical: bool = True
    ) -> dict[Hashable, list[Match]]:
        """One logical archive request, through :attr:`known_ranges`: ``P_A``'s matches whose event ends in each
        key's ranges (``request``: key -> merged ranges, int microseconds; the key None without a key plan), by key,
        in ``(ts_end, id)`` order. Only the parts no earlier request read are read (one read for all keys), and of
        those only what the events this runner was fed do not cover (:attr:`fed`); a part forgotten meanwhile (the
        bound of :class:`KnownRanges`) is read again. ``collect`` False: only make sure every range is known, return
        nothing (the caller takes the matches from :meth:`KnownRanges.candidates`). ``logical`` False: a request
        counted in ``archive_requests`` already.

        Raises
        ------
        RuntimeError
            Without :attr:`known_ranges`.
        """
        known = self.known_ranges
        if known is None:
            raise RuntimeError("archived_in needs known_ranges")
        keyed = self.plan.key is not None
        if logical:
            with self.lock:
                self.counters.archive_requests += 1
        if keyed and self.fed is not None and known.claim_prime():
            self._prime(request)
        missing = known.missing(request)
        if missing and self.fed is not None:  # the newest parts: from the events this runner was fed
            covered, fed_found, missing = self.fed.take(missing)
            if covered:
                known.add(covered, fed_found, self.horizon())
        if not missing:
            known.read_nothing()
        else:
            by_key = self._matches_by_key(self.request(None, missing if keyed else missing[None], logical=False))
            known.add(missing, by_key, self.horizon())
        if not collect:
            return {}
        got = known.found(request)
        if got is None:  # forgotten meanwhile (the bound): this request reads its whole ranges
            got = self._matches_by_key(self.request(None, request if keyed else request[None], logical=False))
            got = {k: got.get(k, []) for k in request}
        with self.lock:
            self.counters.archived_instances += sum(map(len, got.values()))
        return got

    def _prime(self, request: dict[Hashable, list[Range]]) -> None:
        """The first request of a known-ranges runner fed its events: one read for every key, from the request's
        earliest range to where the fed events take over (:attr:`fed`), instead of one read per key's first request
        (a first read per key: hundreds of small reads in ``bench.service --live-archived``)."""
        fed, known = self.fed, self.known_ranges
        assert fed is not None and known is not None
        lo = min((r[0][0] for r in request.values() if r), default=None)
        start, hi = fed.complete()
        if lo is None or start is None or lo >= min(start, hi):
            return
        read = (lo, min(start, hi))
        known.add_every(read, self._matches_by_key(self.request(None, [read], logical=False)), self.horizon())

    def _key_of(self, j: Match) -> Hashable:
        """Archived instance ``j``'s archive key (None without a key plan)."""
        return self.plan.archived_key(j) if self.plan.key is not None else None

    def join_known(
        self, request: dict[Hashable, list[Range]], wanted: list[tuple[int, LiveInstance, Hashable, Range]],
        out: list[list[Match]],
    ) -> bool:
        """One logical request through the known ranges' own hash index (:meth:`KnownRanges.index_by`: kept as
        matches become known, not built per request): only the parts of ``request`` (key -> merged ranges) not
        known yet are read; each ``(i, instance, key, access range)`` of ``wanted`` is joined into ``out[i]`` with
        the candidates of its key and JOIN equality values. False (nothing joined, the request counted) when a
        range was forgotten meanwhile or the index is off: the caller joins :meth:`archived_in`'s matches
        (``logical=False``)."""
        known = self.known_ranges
        assert known is not None
        plan = self.plan
        hashed = plan.key is not None and bool(plan.join_equi)
        self.archived_in(request, collect=False)
        asks: list[tuple[Hashable, Hashable, int, int]] = []
        whose: list[tuple[int, LiveInstance]] = []
        for i, inst, key, (lo, hi) in wanted:
            values: Hashable = ()
            if hashed:
                live = self._live_sides(inst)
                if live is None:
                    continue
                try:
                    hash(live)
                except TypeError:  # unhashable here, every archived side hashable: no equality holds
                    continue
                values = live
            asks.append((key, values, lo, hi))
            whose.append((i, inst))
        got = known.candidates(request, asks)
        if got is None:
            return False
        lists, count = got
        with self.lock:
            self.counters.archived_instances += count
            for (i, inst), candidates in zip(whose, lists):
                self.join(inst, candidates, out[i], equi_checked=hashed)
        return True

    def _bucket_values(self, j: Match) -> Hashable | None:
        """``j``'s bucket in the known ranges' index: the archived sides of JOIN's equalities (None: a null side,
        it joins nothing), ``()`` without them."""
        if self.plan.key is None or not self.plan.join_equi:
            return ()
        values = self._archived_sides(j)  # once per match: not kept in the cache of _equi_values
        return None if any(never_equal(v) for v in values) else values

    def _live_sides(self, inst: LiveInstance) -> tuple[Any, ...] | None:
        """The live sides of :attr:`LiveArchivedPlan.join_equi` on ``inst`` (None: one never equals, the instance
        joins nothing)."""
        live = tuple(e.live(inst.match.events, NO_EVENTS, None) for e in self.plan.join_equi)
        return None if any(never_equal(v) for v in live) else live

    def _archived_sides(self, j: Match) -> tuple[Any, ...]:
        """The archived sides of :attr:`LiveArchivedPlan.join_equi` on ``j``, evaluated."""
        b = j.events
        return tuple(e.archived(NO_EVENTS, b, None) for e in self.plan.join_equi)

    def _matches_by_key(self, events: list[Event]) -> dict[Hashable, list[Match]]:
        """``P_A``'s matches over ``events`` (a fresh matcher, in ``(ts_end, id)`` order) by archive key (None
        without a key plan)."""
        out: dict[Hashable, list[Match]] = {}
        key_of = self._key_of
        for j in self._match_fresh(sorted(events, key=Event.order_key)):
            out.setdefault(key_of(j), []).append(j)
        return out

    def match_archived(self, events: list[Event]) -> list[Match]:
        """Every match of ``P_A`` over ``events`` (fed in the matcher's (ts_end, id) order), with a fresh matcher.

        A one-event ``P_A`` (:func:`engine.lql.pattern_checks.single_event_var`) matches each event on its own: an
        event already matched for an earlier request of this query is not matched again (:attr:`archived_memo`;
        consecutive requests of LLAA, OLLAA and SLLAA cover mostly the same look-back), only the others go
        through a fresh matcher. The result is the same list either way.
        """
        ordered = sorted(events, key=Event.order_key)  # a no-op pass when the source kept the order
        memo = self.archived_memo
        if memo is not None:
            out = memo.match(ordered, self._match_fresh, self.horizon())
        else:
            out = self._match_fresh(ordered)
        with self.lock:
            self.counters.archived_instances += len(out)
        return out

    def _match_fresh(self, ordered: list[Event]) -> list[Match]:
        matcher = Matcher(self.plan.archived)
        out: list[Match] = []
        push = matcher.push
        for e in ordered:
            try:
                found = push(e)
            except LateEventError:
                continue  # a duplicate (ts, id): the archive returned an event twice
            if found:
                out += found
        out += matcher.flush()
        return out

    def join(
        self, inst: LiveInstance, candidates: Iterable[Match], out: list[Match], *, equi_checked: bool = False
    ) -> None:
        """Join ``inst`` with the archived ``candidates`` that lie in its access range; append the results.

        Every algorithm calls this exactly once per completed live instance, with every archived
        instance that may join it, so the grouped form (:attr:`LiveArchivedPlan.grouped`) is built
        here: one result (:meth:`LiveArchivedPlan.group`) when at least one candidate joins, else
        none; the pairwise form appends one result per joined pair. One delay sample per result.
        With a key plan, ``candidates`` must all have ``inst``'s key (requested or kept by key); ``equi_checked``
        (with a key plan): the caller took them by JOIN's equalities too (:attr:`LiveArchivedPlan.join_equi`, a hash
        join: SLLAA), so only the other conjuncts are evaluated here.
        """
        plan = self.plan
        start = inst.match.start
        lo = start - plan.lookback_us
        deadline = plan.archived_deadline_us
        joins = plan.joins
        keyed = plan.key is not None  # every algorithm takes an instance's candidates from its key
        tried = 0
        joined: list[Match] = []
        equi = plan.join_equi if keyed and not equi_checked else ()
        rest_only = keyed and bool(plan.join_equi)  # equalities checked apart from joins(), here or by the caller
        # the conjuncts joins() would evaluate: none left, every qualifying candidate joins (no call per pair)
        rest = (plan.join_rest if rest_only else plan.join_same_key) if keyed else plan.join
        if equi:  # each side of an equality once: the live one here, the archived one per archived instance
            live_events = inst.match.events
            wanted = [e.live(live_events, NO_EVENTS, None) for e in equi]
            hopeless = any(v is None for v in wanted)
        for j in candidates:
            # plan.qualifies(start, j), inlined: in [start - lookback, start), and the trailing negation decided
            if j.start < lo or j.end >= start or (deadline is not None and j.start + deadline >= start):
                continue
            tried += 1
            if equi and (
                hopeless or not all(g is not None and bool(w == g) for w, g in zip(wanted, self._equi_values(j)))
            ):
                continue
            if not rest or joins(inst.match, j, same_key=keyed, equi_checked=rest_only):
                joined.append(j)
        self.counters.join_pairs_tried += tried
        if not joined:
            return
        if plan.grouped:
            out.append(plan.group(inst.match, joined))
            emitted = 1
        else:
            out.extend(plan.result(inst.match, j) for j in joined)
            emitted = len(joined)
        due = inst.requested_ts if inst.requested_ts is not None else self.watermark
        delay_event = due - inst.completed_ts
        delay_wall = self.clock() - inst.completed_wall
        self.counters.delay_event_us.extend([delay_event] * emitted)
        self.counters.delay_wall_s.extend([delay_wall] * emitted)
        self.counters.results += emitted  # not the delays' length: the service trims those to the latest

    def _equi_values(self, j: Match) -> tuple[Any, ...]:
        """The archived sides of :attr:`LiveArchivedPlan.join_equi` on ``j``; kept per archived instance while the
        memo keeps it (:attr:`archived_memo`: the same ``Match`` object serves many requests), else evaluated."""
        cache = self._equi_cache
        if cache is not None:
            hit = cache.get(id(j))
            if hit is not None and hit[0] is j:
                return hit[1]
        got = self._archived_sides(j)
        if cache is not None:
            memo = self.archived_memo  # a cache implies the memo
            if memo is not None and len(cache) >= memo.max_events:
                cache.clear()  # values are evaluated again; the entries hold their Match, so no id is reused
            cache[id(j)] = (j, got)
        return got

    def access(self, inst: LiveInstance) -> Range:
        """``R_A(I)``, int microseconds, half-open."""
        return self.plan.access_range(inst.match)
