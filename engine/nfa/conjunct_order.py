"""Cost-based conjunct order at run time: pass probabilities measured online, edges re-ordered on drift.

After 004 (Cesar; section 4.1.2, formula (9) and Strategy 1): when an NFA edge has
several WHERE conjuncts, evaluating them by ascending ``cost / (1 - p)`` minimises the
expected cost ``sum_i c_i * prod_{k<i} p_k`` (lowest pass probability first when costs
are equal). The compiler orders each edge by prior estimates
(:mod:`engine.nfa.compiler`); a :class:`ConjunctPlanner`, owned by one
:class:`engine.matcher.Matcher`, measures the real pass probabilities and re-orders.

How it measures without slowing the common path: a group (one conjunct list of one
edge) is measured in *bursts*. For a burst the group's list is replaced, in place, by
one *probe* that evaluates every conjunct of the group (no short-circuit, so each
conjunct's unconditional pass rate is counted), counts, and returns their AND; the
result of the edge is therefore unchanged. After ``burst`` evaluations the probe puts
the conjuncts back, in the best order for the rates measured so far. The first burst
is ``first`` evaluations long; then every ``period`` events the matcher re-arms each
group for ``burst`` evaluations. Outside bursts the lists hold the plain compiled
conjuncts: no counter, no wrapper.

Drift and hysteresis: counts decay by ``decay`` at the start of each burst (recent
bursts weigh more); a new order replaces the current one only when its expected cost
is below ``1 - hysteresis`` times the current order's, under the measured rates.

Results never change: a probe returns the AND of the same conjuncts, and a list is only
replaced between events (re-arming) or by a probe while its own list is being iterated,
where the items that follow in the new list are conjuncts of the same AND.

Scope: the conjuncts of single-event conditions (``entry_local``, ``take_local``), edge
conditions (``entry_edge``, ``take_edge``) and the general ones of run storage
(``entry_general``, ``take_general``, ``emit_general``); chain storage copies its general
conjuncts once at start, so those keep their compile-time order there.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from engine.events import Event
from engine.nfa.compiler import GROUPS, Conjunct, ConjunctMeta, NFAPlan
from engine.nfa.conditions import expected_cost, order_rank

PRIOR_WEIGHT = 20.0
"""Pseudo-observations given to a conjunct's prior estimate when blending it with measured counts."""


def clone_plan(plan: NFAPlan) -> NFAPlan:
    """A copy of ``plan`` whose conjunct lists a matcher may re-order in place (conjuncts themselves shared)."""
    slots = []
    for s in plan.slots:
        copy = replace(s, meta={k: list(v) for k, v in s.meta.items()})
        for g in GROUPS:
            setattr(copy, g, list(getattr(s, g)))
        slots.append(copy)
    return replace(plan, slots=slots, emit_general=list(plan.emit_general), emit_meta=list(plan.emit_meta))


@dataclass(slots=True)
class GroupStats:
    """Measured counts of one group: ``calls`` evaluations of the group, ``passes[i]`` of conjunct i
    (unconditional: the probe evaluates every conjunct), ``all_passed`` evaluations where all held."""

    calls: float = 0.0
    passes: list[float] = field(default_factory=list)
    all_passed: float = 0.0


class ConjunctGroup:
    """One conjunct list of one NFA edge (a slot's group or the plan's ``emit_general``), re-orderable in place.

    Parameters
    ----------
    plan_index, slot : int
        Where the group is (``slot`` -1 for ``emit_general``).
    name : str
        The group name (:data:`engine.nfa.compiler.GROUPS` or ``emit_general``).
    target : list
        The live list the engines evaluate (``Fn`` items, or :class:`Conjunct` for general groups).
    metas : list[ConjunctMeta]
        Parallel to ``target``.
    """

    def __init__(
        self, plan_index: int, slot: int, name: str, target: list[Any], metas: list[ConjunctMeta]
    ) -> None:
        self.plan_index = plan_index
        self.slot = slot
        self.name = name
        self.target = target
        self.items = list(target)
        self.metas = list(metas)
        self.general = name.endswith("general")
        self.order = list(range(len(self.items)))
        self.stats = GroupStats(passes=[0.0] * len(self.items))
        self.remaining = 0
        self.probing = False
        self.reorders = 0
        self.planner: ConjunctPlanner | None = None
        self._probe: Any = self._make_probe()

    # ------------------------------------------------------------------ estimates
    def pass_probabilities(self) -> list[float]:
        """Per conjunct (declaration index), the measured pass rate blended with its prior."""
        s = self.stats
        return [
            (s.passes[i] + PRIOR_WEIGHT * m.estimate) / (s.calls + PRIOR_WEIGHT) for i, m in enumerate(self.metas)
        ]

    def best_order(self) -> list[int]:
        """Indices by ascending ``cost / (1 - p)`` (ties: the current order)."""
        ps = self.pass_probabilities()
        pos = {i: k for k, i in enumerate(self.order)}
        return sorted(self.order, key=lambda i: (order_rank(self.metas[i].cost, ps[i]), pos[i]))

    def cost_of(self, order: list[int]) -> float:
        """Expected cost of one evaluation in ``order`` under the measured probabilities (004, formula (9))."""
        ps = self.pass_probabilities()
        return expected_cost([self.metas[i].cost for i in order], [ps[i] for i in order])

    def current(self) -> list[ConjunctMeta]:
        """The conjuncts in their current evaluation order."""
        return [self.metas[i] for i in self.order]

    # ------------------------------------------------------------------ bursts
    def arm(self, evaluations: int, decay: float) -> None:
        """Start measuring: the list becomes one probe for ``evaluations`` evaluations (between events only)."""
        if self.probing:
            return
        s = self.stats
        s.calls *= decay
        s.all_passed *= decay
        s.passes = [p * decay for p in s.passes]
        self.remaining = evaluations
        self.probing = True
        self.target[:] = [self._probe]

    def disarm(self, hysteresis: float, adaptive: bool) -> None:
        """Stop measuring; re-order when the best order is cheaper by more than ``hysteresis``."""
        if adaptive and len(self.items) > 1:
            best = self.best_order()
            if best != self.order and self.cost_of(best) < (1.0 - hysteresis) * self.cost_of(self.order):
                self.order = best
                self.reorders += 1
        self.probing = False
        self.target[:] = [self.items[i] for i in self.order]

    def _finish(self) -> None:
        planner = self.planner
        if planner is not None:
            self.disarm(planner.hysteresis, planner.adaptive)
        else:
            self.disarm(0.0, False)

    def _make_probe(self) -> Any:
        group = self
        if not self.general:

            def probe(a: Any, b: Any, c: Any) -> bool:
                return _measure(group, lambda f: f(a, b, c))

            return probe
        return _ProbeConjunct(self)


def _measure(group: ConjunctGroup, check: Callable[[Any], bool]) -> bool:
    """One probe evaluation: every member of ``group`` checked (``check(member)``) and counted, in the
    current order; the burst ends after its last evaluation. True when all passed."""
    st = group.stats
    st.calls += 1
    ok = True
    passes = st.passes
    items = group.items
    for i in group.order:
        if check(items[i]):
            passes[i] += 1
        else:
            ok = False
    if ok:
        st.all_passed += 1
    group.remaining -= 1
    if group.remaining == 0:
        group._finish()
    return ok


class _ProbeConjunct(Conjunct):
    """The probe of a general group: a :class:`Conjunct` whose checks evaluate and count every member."""

    __slots__ = ("group",)

    def __init__(self, group: ConjunctGroup) -> None:
        super().__init__(fn=_never)
        self.group = group

    def holds_all(self, env: Any, x: Event | None = None) -> bool:
        return _measure(self.group, lambda c: c.holds_all(env, x))

    def holds_last(self, env: Any) -> bool:
        return _measure(self.group, lambda c: c.holds_last(env))


def _never(env: Any, i: int, x: Any) -> bool:  # pragma: no cover - the probe overrides holds_*
    return False


class ConjunctPlanner:
    """Measures and re-orders the conjuncts of a matcher's (cloned) plans.

    Parameters
    ----------
    plans : list[NFAPlan]
        The matcher's own plans (:func:`clone_plan`): their lists are re-ordered in place.
    adaptive : bool
        Re-order from measured rates (False: keep the compile-time order and measure nothing,
        unless ``measure_all``).
    measure_all : bool
        Measure every evaluation of every group, empty groups too (EXPLAIN with events);
        slower, for diagnosis.
    first, burst : int
        Evaluations measured in a group's first burst and in each later one.
    period : int
        Events between re-arming the groups for a burst.
    hysteresis : float
        A new order must be cheaper than the current by this fraction (0.1 = 10%).
    decay : float
        Weight kept by earlier counts at the start of each burst, in (0, 1].
    """

    def __init__(
        self,
        plans: list[NFAPlan],
        *,
        adaptive: bool = True,
        measure_all: bool = False,
        first: int = 2000,
        burst: int = 500,
        period: int = 50_000,
        hysteresis: float = 0.05,
        decay: float = 0.5,
    ) -> None:
        if first < 1 or burst < 1 or period < 1:
            raise ValueError("first, burst and period must be >= 1")
        if not 0.0 < decay <= 1.0 or not 0.0 <= hysteresis < 1.0:
            raise ValueError("decay must be in (0, 1] and hysteresis in [0, 1)")
        self.adaptive = adaptive
        self.measure_all = measure_all
        self.burst = burst
        self.period = period
        self.hysteresis = hysteresis
        self.decay = decay
        self.groups: list[ConjunctGroup] = []
        for plan in plans:
            for slot in plan.slots:
                for name in GROUPS:
                    items = getattr(slot, name)
                    if items or measure_all:
                        self._add(ConjunctGroup(plan.index, slot.index, name, items, slot.meta.get(name, [])))
            if plan.emit_general or measure_all:
                self._add(ConjunctGroup(plan.index, -1, "emit_general", plan.emit_general, plan.emit_meta))
        # only groups with a choice to make are measured in normal mode
        self.active = [g for g in self.groups if measure_all or (adaptive and len(g.items) > 1)]
        forever = 1 << 62
        for g in self.active:
            g.arm(forever if measure_all else first, 1.0)
        self.next_tick = forever if measure_all or not self.active else period

    def _add(self, group: ConjunctGroup) -> None:
        group.planner = self
        self.groups.append(group)

    def tick(self, events: int) -> int:
        """Re-arm every idle group for a burst; returns the event count of the next tick."""
        for g in self.active:
            g.arm(self.burst, self.decay)
        self.next_tick = events + self.period
        return self.next_tick

    def group(self, plan: int, slot: int, name: str) -> ConjunctGroup | None:
        """The group at (plan index, slot or -1 for emit, name), or None."""
        for g in self.groups:
            if (g.plan_index, g.slot, g.name) == (plan, slot, name):
                return g
        return None

    def reorders(self) -> int:
        """Re-orderings made so far, over all groups."""
        return sum(g.reorders for g in self.groups)

    def report(self) -> list[dict[str, Any]]:
        """Per group: where, conjuncts in evaluation order with prior and measured pass rate, counts."""
        out = []
        for g in self.groups:
            ps = g.pass_probabilities()
            s = g.stats
            out.append(
                {
                    "plan": g.plan_index,
                    "slot": g.slot,
                    "group": g.name,
                    "evaluations": round(s.calls),
                    "passed": round(s.all_passed),
                    "reorders": g.reorders,
                    "conjuncts": [
                        {
                            "text": g.metas[i].text,
                            "cost": g.metas[i].cost,
                            "estimate": g.metas[i].estimate,
                            "measured": (s.passes[i] / s.calls) if s.calls else None,
                            "blended": ps[i],
                        }
                        for i in g.order
                    ],
                }
            )
        return out
