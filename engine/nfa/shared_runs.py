"""Runs that share work: skip_till_next_match and the contiguity strategies with merged runs.

Under skip_till_next_match, ``strict_contiguity`` and ``partition_contiguity`` a run never
branches on an event unless both *take* and *proceed* apply, and its future depends only on
its NFA state (slot), on what the conditions still to be evaluated read, and on its window.
When every such condition reads, of the run's binding, only the last bound event
(:attr:`engine.nfa.compiler.NFAPlan.shareable`, decided per slot at compile time from the
validated syntax tree), runs in the same slot with the same last bound event are the same
automaton: they are advanced **once**, as a :class:`Group`, and fan out to their starts
only when a match is emitted: the "merging equivalent runs" optimisation of SASE+ (Agrawal,
Diao, Gyllstrom, Immerman, *Efficient pattern matching over event streams*, SIGMOD 2008,
section 5.2; not among shared/seeds), here with per-start windows and bindings.

A :class:`Group` keeps its members sorted by the ts of their first event, so WITHIN still
applies per start: the oldest start bounds the group's expiry and members that leave the
window are dropped one by one. Trailing negations and RETURN are evaluated per start on
the fanned-out binding, so every count stays exact (docs/semantics.md section 4).

A member is ``(first_ts, env, off)``: ``env`` its binding up to the group's slot ``j``
when it joined (a prefix tuple as in :mod:`engine.nfa.runs`), ``off`` the number of the
group's ``seq`` events (taken into a Kleene slot ``j``) that were already in ``env``; its
whole binding is ``env`` with ``seq[off:]`` appended to slot ``j``.
"""
from __future__ import annotations

from operator import itemgetter
from typing import Any

from engine.events import Event
from engine.match import Match
from engine.nfa.compiler import NFAPlan
from engine.nfa.counters import Counters
from engine.nfa.runs import Sink
from engine.nfa.state import PlanState

_FAR_PAST = -(1 << 62)
_NO_SEQ: Any = ()  # a group that has taken nothing yet (a list once it takes)
_first = itemgetter(0)

Member = tuple  # (first_ts, env, off)


class Group:
    """Runs of one key in one slot with the same last bound event (one run when the slot is not shareable).

    Attributes
    ----------
    members : list[tuple[int, tuple, int]]
        ``(first_ts, env, off)`` sorted by ``first_ts`` (int microseconds).
    seq : list[Event]
        Events taken into the group's Kleene slot since the group formed.
    last : Event
        The last bound event (the same for every member).
    """

    __slots__ = ("members", "seq", "last")

    def __init__(self, members: list[Member], seq: Any, last: Event) -> None:
        self.members = members
        self.seq: Any = seq  # a list, or _NO_SEQ (an empty tuple): Any keeps the compiled build from checking
        self.last = last

    def __reduce__(self) -> tuple[Any, ...]:
        return Group, (self.members, self.seq, self.last)


class SharedRunState(PlanState):
    """Per-key groups: ``by_slot[j]`` holds the groups whose last bound slot is j."""

    __slots__ = ("by_slot",)

    def __init__(self, plan: NFAPlan) -> None:
        super().__init__(plan)
        self.by_slot: list[list[Group]] = [[] for _ in plan.slots]

    def live(self) -> int:
        """Partial matches held (members of every group)."""
        return sum(len(g.members) for groups in self.by_slot for g in groups)

    def groups(self) -> int:
        """Groups held (the runs actually advanced)."""
        return sum(len(groups) for groups in self.by_slot)


class SharedRunStorage:
    """Evaluates one plan under skip_till_next_match or a contiguity strategy with merged runs.

    Same parameters and results as :class:`engine.nfa.runs.RunStorage` (the same matches, in a
    possibly different order within one event); ``strategy`` must not be skip_till_any_match.
    Counters: ``created`` counts groups advanced or started (the runs actually created),
    ``merged`` the partial matches that joined another group instead of being advanced
    on their own, ``live`` / ``peak_live`` the partial matches held (group members).

    Raises
    ------
    ValueError
        For skip_till_any_match (its runs branch on every event; chain storage shares that work).
    """

    def __init__(
        self,
        plan: NFAPlan,
        window_us: int | None,
        strategy: str,
        counters: Counters,
        query_name: str | None,
        sink: Sink,
    ) -> None:
        if strategy == "skip_till_any_match":
            raise ValueError("shared runs need skip_till_next_match or a contiguity strategy")
        self.plan = plan
        self.query_name = query_name
        self.sink = sink
        self.direct = not plan.trailing and not plan.returns
        self.window_us = window_us
        self.next = strategy == "skip_till_next_match"
        self.counters = counters
        self.final = plan.final
        self.slots = plan.slots
        self.kleene = [s.kleene for s in plan.slots]
        self.shareable = list(plan.shareable) if plan.shareable else [False] * len(plan.slots)
        self.first = plan.slots[0]
        empty: frozenset[str] = frozenset()
        self.take_types = [s.types if s.kleene else empty for s in plan.slots]
        self.proceed_types = [
            plan.slots[j + 1].types if j < self.final else empty for j in range(len(plan.slots))
        ]
        # conditions that need a whole binding (the rest read the last bound event and e only)
        self.take_needs_env = [bool(s.take_general) for s in plan.slots]
        self.entry_needs_env = [
            bool(s.entry_general) or any(n.local_fns is None and n.edge_fns is None for n in s.negations)
            for s in plan.slots
        ]
        # slots whose groups proceed on every event of the next slot's types (no conditions, no negation;
        # a final next slot must be single, so that its matches go straight out)
        self.plain_proceed = [
            j < self.final
            and not (nxt := plan.slots[j + 1]).entry_local
            and not nxt.entry_edge
            and not nxt.entry_general
            and not nxt.negations
            and (j + 1 < self.final or not nxt.kleene)
            for j in range(len(plan.slots))
        ]
        # a new run at slot 0 is filed as is: slot 0 is single (no group takes e into it) and not final
        self.plain_start = not plan.slots[0].kleene and self.final > 0
        n = len(plan.slots)
        self.all_slots = tuple(range(n - 1, -1, -1))
        self.visit: dict[str, tuple[int, ...]] = {}
        self.default_visit = () if self.next else self.all_slots
        if self.next:
            for t in {t for s in plan.slots for t in s.types}:
                self.visit[t] = tuple(
                    j for j in self.all_slots if t in self.take_types[j] or t in self.proceed_types[j]
                )

    def new_state(self) -> SharedRunState:
        return SharedRunState(self.plan)

    def expire(self, state: SharedRunState, lower_ts: int) -> None:
        """Drop the members whose first event is older than ``lower_ts``, and empty groups."""
        counters = self.counters
        for j, groups in enumerate(state.by_slot):
            if not groups:
                continue
            alive = []
            for g in groups:
                members = g.members
                if members[0][0] < lower_ts:
                    cut = _cut(members, lower_ts)
                    counters.live -= cut
                    if cut == len(members):
                        continue
                    del members[:cut]
                alive.append(g)
            if len(alive) != len(groups):
                state.by_slot[j] = alive
        state.trim(lower_ts)

    def clear(self, state: SharedRunState) -> None:
        """Kill every run (strict contiguity: an event of another key arrived)."""
        for j, groups in enumerate(state.by_slot):
            self.counters.live -= sum(len(g.members) for g in groups)
            state.by_slot[j] = []

    # ------------------------------------------------------------------ matching

    def process(self, state: SharedRunState, e: Event, out: list[Match]) -> None:
        """Advance the groups of this key that ``e`` can concern, then start a new run at ``e``."""
        counters = self.counters
        lower = e.ts - self.window_us if self.window_us is not None else _FAR_PAST
        plan = self.plan
        if self.window_us is not None and plan.negations:
            state.trim(lower)
        etype = e.type
        by_slot = state.by_slot
        arrivals: dict[int, Group] = {}
        contiguous = not self.next
        final = self.final
        kleene = self.kleene
        shareable = self.shareable
        emits_and_ends = not kleene[final] and not plan.emit_general
        # last slot first: groups that proceed into slot j+1 do not see e again
        for j in self.visit.get(etype, self.default_visit):
            groups = by_slot[j]
            if not groups:
                continue
            can_take = etype in self.take_types[j]
            can_proceed = etype in self.proceed_types[j]
            if can_proceed and not can_take and self.plain_proceed[j]:
                self._proceed_all(state, j, groups, e, lower, by_slot, out, arrivals)
                continue
            keep: list[Group] = []
            by_slot[j] = keep  # arrivals at j (takes) go here
            up = by_slot[j + 1] if j < self.final else keep
            for g in groups:
                members = g.members
                if members[0][0] < lower:
                    cut = _cut(members, lower)
                    counters.live -= cut
                    if cut == len(members):
                        continue
                    del members[:cut]
                if not can_take and not can_proceed:
                    if contiguous:
                        counters.live -= len(members)
                    else:
                        keep.append(g)  # ignore an irrelevant event
                    continue
                took = can_take and self._take_ok(j, g, e)
                if can_proceed:
                    applies, proceeds = self._proceed_ok(state, j, g, e)
                else:
                    applies = proceeds = False
                if not took and not applies:
                    if contiguous:
                        counters.live -= len(members)
                    else:
                        keep.append(g)
                    continue
                counters.live -= len(members)  # g leaves slot j; arrivals count their members again
                if proceeds:
                    if took:
                        counters.copied += 1
                    seq = g.seq
                    if j + 1 == final and emits_and_ends:
                        # the final single component: fan out at once, nothing stays
                        counters.created += 1
                        self._emit_bound(state, members, seq, kleene[j], e, out)
                    else:
                        kj = kleene[j]
                        bind: Any = (e,) if kleene[j + 1] else e
                        if len(members) == 1:
                            f, env, o = members[0]
                            if kj and o < len(seq):
                                env = env[:-1] + (env[-1] + tuple(seq[o:]),)
                            moved = [(f, env + (bind,), 0)]
                        else:
                            moved = [
                                (f, (env[:-1] + (env[-1] + tuple(seq[o:]),) if kj and o < len(seq) else env)
                                 + (bind,), 0)
                                for f, env, o in members
                            ]
                        self._arrive(state, j + 1, Group(moved, _NO_SEQ, e), up, out, arrivals)
                if took:
                    if g.seq:
                        g.seq.append(e)
                    else:
                        g.seq = [e]
                    g.last = e
                    if j == final or not shareable[j]:
                        self._arrive(state, j, g, keep, out, arrivals)
                    else:  # _arrive inlined for the common case
                        counters.created += 1
                        counters.live += len(members)
                        other = arrivals.get(j)
                        if other is None:
                            arrivals[j] = g
                            keep.append(g)
                        else:
                            self._merge(j, other, g)
        first = self.first
        if etype in first.types and (not first.entry_local or all(fn(None, e, None) for fn in first.entry_local)):
            start: tuple[Any, ...] = ((e,),) if first.kleene else (e,)
            if not first.entry_general or all(c.holds_all(start) for c in first.entry_general):
                if self.plain_start:  # nothing else can reach slot 0 with e as its last event
                    by_slot[0].append(Group([(e.ts, start, 0)], _NO_SEQ, e))
                    counters.created += 1
                    counters.live += 1
                else:
                    self._arrive(state, 0, Group([(e.ts, start, 0)], _NO_SEQ, e), by_slot[0], out, arrivals)
        if counters.live > counters.peak_live:
            counters.peak_live = counters.live
        if plan.negations:
            state.record_negations(e)

    def _proceed_all(
        self,
        state: SharedRunState,
        j: int,
        groups: list[Group],
        e: Event,
        lower: int,
        by_slot: list[list[Group]],
        out: list[Match],
        arrivals: dict[int, Group],
    ) -> None:
        """Every group of slot ``j`` proceeds with ``e`` unconditionally: one group (or matches) in slot ``j + 1``.

        Same effects and counters as the general loop, where each group would proceed on its own
        and merge on arrival.
        """
        counters = self.counters
        by_slot[j] = []
        kj = self.kleene[j]
        n_groups = 0
        first_alive = 0
        moved: list[Member] = []
        for g in groups:
            members = g.members
            counters.live -= len(members)
            seq = g.seq
            n = len(moved)
            for f, env, o in members:
                if f >= lower:
                    moved.append((f, env[:-1] + (env[-1] + tuple(seq[o:]),) if kj and o < len(seq) else env, 0))
            if len(moved) > n:
                if not n_groups:
                    first_alive = len(moved)
                n_groups += 1
        if not moved:
            return
        if j + 1 == self.final:
            counters.created += n_groups
            self._emit_bound(state, moved, _NO_SEQ, False, e, out)
            return
        counters.created += n_groups - 1  # _arrive counts the last one
        if self.shareable[j + 1]:
            counters.merged += len(moved) - first_alive
        bind: Any = (e,) if self.kleene[j + 1] else e
        moved = [(f, env + (bind,), 0) for f, env, _o in moved]
        if n_groups > 1:
            moved.sort(key=_first)
        self._arrive(state, j + 1, Group(moved, _NO_SEQ, e), by_slot[j + 1], out, arrivals)

    def _arrive(
        self, state: SharedRunState, j: int, g: Group, into: list[Group], out: list[Match], arrivals: dict[int, Group]
    ) -> None:
        """A group reached slot ``j`` by binding the current event: emit, merge or file it."""
        counters = self.counters
        counters.created += 1
        if j == self.final:
            self._emit(state, g, out)
            if not self.kleene[j]:
                return
        if not self.shareable[j]:
            if len(g.members) > 1:  # the futures differ from here on: one group per run
                kj = self.kleene[j]
                seq = g.seq
                for f, env, o in g.members:
                    full = env[:-1] + (env[-1] + tuple(seq[o:]),) if kj and o < len(seq) else env
                    into.append(Group([(f, full, 0)], _NO_SEQ, g.last))
                counters.live += len(g.members)
                return
            into.append(g)
            counters.live += 1
            return
        counters.live += len(g.members)
        other = arrivals.get(j)
        if other is None:
            arrivals[j] = g
            into.append(g)
            return
        self._merge(j, other, g)

    def _merge(self, j: int, other: Group, g: Group) -> None:
        """Merge ``g`` into ``other``: same slot, same last bound event (the current one), identical futures.

        The smaller group's members are rebased onto the larger one's ``seq``.
        """
        if len(g.members) > len(other.members):
            other.members, g.members = g.members, other.members
            other.seq, g.seq = g.seq, other.seq
        seq = g.seq
        off = len(other.seq)
        members = other.members
        absorbed = g.members
        self.counters.merged += len(absorbed)
        if len(absorbed) == 1 and not seq:  # the common case: a run that just proceeded into slot j
            m = absorbed[0]
            members.append((m[0], m[1], off))
            if m[0] < members[-2][0]:
                members.sort(key=_first)
            return
        kj = self.kleene[j]
        newest = members[-1][0]
        members.extend(
            (f, env[:-1] + (env[-1] + tuple(seq[o:]),) if kj and o < len(seq) else env, off) for f, env, o in absorbed
        )
        if absorbed[0][0] < newest:
            members.sort(key=_first)

    def _emit(self, state: SharedRunState, g: Group, out: list[Match]) -> None:
        """Fan a group at the final slot out to one match per member."""
        kj = self.kleene[self.final]
        seq = g.seq
        members = g.members
        if self.plan.emit_general:
            # shareable (or a single run): the conditions read what every member shares
            _f, env, o = members[-1]
            env = env[:-1] + (env[-1] + tuple(seq[o:]),) if kj and o < len(seq) else env
            if not all(c.holds_all(env) for c in self.plan.emit_general):
                return
        if self.direct:
            name = self.query_name
            layout = self.plan.layout
            last_ts = g.last.ts
            for f, env, o in members:  # f: the ts of the member's first event
                if kj and o < len(seq):
                    env = env[:-1] + (env[-1] + tuple(seq[o:]),)
                out.append(Match(name, None, f, last_ts, None, layout, env))
        else:
            for _f, env, o in members:
                if kj and o < len(seq):
                    env = env[:-1] + (env[-1] + tuple(seq[o:]),)
                self.sink(state, env)

    def _emit_bound(
        self, state: SharedRunState, members: list[Member], seq: Any, kj: bool, e: Event, out: list[Match]
    ) -> None:
        """Members that bind ``e`` to the final single component: one match each."""
        if self.direct:
            name = self.query_name
            layout = self.plan.layout
            ts = e.ts
            append = out.append
            for f, env, o in members:
                if kj and o < len(seq):
                    append(Match(name, None, f, ts, None, layout, env[:-1] + (env[-1] + tuple(seq[o:]), e)))
                else:
                    append(Match(name, None, f, ts, None, layout, env + (e,)))
        else:
            for _f, env, o in members:
                self.sink(state, env[:-1] + (env[-1] + tuple(seq[o:]), e) if kj and o < len(seq) else env + (e,))

    def _rep_env(self, j: int, g: Group) -> tuple[Any, ...]:
        """The whole binding of the group's newest member (what shareable conditions read is the same in all)."""
        _f, env, o = g.members[-1]
        seq = g.seq
        if self.kleene[j] and o < len(seq):
            return env[:-1] + (env[-1] + tuple(seq[o:]),)
        return env

    def _take_ok(self, j: int, g: Group, e: Event) -> bool:
        slot = self.slots[j]
        for fn in slot.take_local:
            if not fn(None, e, None):
                return False
        prev = g.last
        for fn in slot.take_edge:
            if not fn(prev, e, None):
                return False
        if self.take_needs_env[j]:
            env = self._rep_env(j, g)
            env = env[:-1] + (env[-1] + (e,),)
            for c in slot.take_general:
                if not c.holds_last(env):
                    return False
        return True

    def _proceed_ok(self, state: SharedRunState, j: int, g: Group, e: Event) -> tuple[bool, bool]:
        """(whether proceeding applies, whether the run proceeds: False when a negation fails)."""
        slot = self.slots[j + 1]
        for fn in slot.entry_local:
            if not fn(None, e, None):
                return False, False
        prev = g.last
        for fn in slot.entry_edge:
            if not fn(prev, e, None):
                return False, False
        env: tuple[Any, ...] = ()
        if self.entry_needs_env[j + 1]:
            env = self._rep_env(j, g) + (((e,),) if slot.kleene else (e,))
            for c in slot.entry_general:
                if not c.holds_all(env):
                    return False, False
        for spec in slot.negations:
            if spec.local_fns is not None or spec.edge_fns is not None:
                if not state.edge_negations_ok([spec], prev, e):
                    return True, False
            elif not state.general_negation_ok(spec, env):
                return True, False
        return True, True


def _cut(members: list[Member], lower_ts: int) -> int:
    """How many leading members (sorted by first ts) started before ``lower_ts``."""
    cut = 0
    n = len(members)
    while cut < n and members[cut][0] < lower_ts:
        cut += 1
    return cut
