"""What the NFA compiler (:mod:`engine.nfa.compiler`) produces: one :class:`NFAPlan` per linear plan, its
:class:`Slot` objects (SASE+ NFA^b states with begin/take edges), the compiled WHERE conjuncts of each slot by
group (:data:`GROUPS`), the :class:`NegSpec` of each negation and the cost model's :class:`ConjunctMeta` beside
every compiled conjunct (docs/architecture.md section 7.5; 004 for the cost model).

A compiled condition is ``fn(a, b, c)`` (:data:`engine.nfa.conditions.Fn`): the general form reads the binding
``env`` (one event per single slot, a tuple per Kleene slot), the position ``i`` of an indexed Kleene element and
the candidate event ``x``; the edge form reads the previous slot's last event and the current event. Compiled
plans hold no per-key state.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.events import Event
from engine.nfa.conditions import Fn


@dataclass(frozen=True, slots=True)
class ConjunctMeta:
    """What the cost model knows about one compiled conjunct.

    Attributes
    ----------
    text : str
        Normalized LQL text (:func:`engine.lql.ast.expr_text`), the key of ``estimates``.
    cost : int
        Evaluation cost in AST nodes (:func:`engine.nfa.conditions.expr_cost`).
    estimate : float
        Prior pass probability (from ``estimates`` or the default).
    """

    text: str
    cost: int
    estimate: float


GROUPS = ("entry_local", "entry_edge", "entry_general", "take_local", "take_edge", "take_general")
"""The conjunct lists of a :class:`Slot`, in evaluation order (entry: binding the slot's first event; take: a
further element of a Kleene slot)."""


@dataclass(slots=True)
class Conjunct:
    """A general-form condition ``fn(env, i, x)``.

    ``ivar`` is the slot indexed by ``i`` (None when the conjunct has no ``b[i]``);
    ``uses_prev`` says whether ``b[i-1]`` appears (the conjunct then applies from i = 2).
    """

    fn: Fn
    ivar: int | None = None
    uses_prev: bool = False
    needs: tuple[tuple[int, int], ...] = ()
    """(slot, k) for every ``b[k]``: the conjunct is false when ``b`` has fewer than k elements."""
    closing: bool = False
    """Set by :meth:`PlanCompiler.tree_conjuncts` for a conjunct of one Kleene variable that reads ``b[last]``
    or ``b[k]``: it holds only for the complete closure, so a tree's Kleene leaf extends sequences failing it."""

    def holds_all(self, env: Any, x: Event | None = None) -> bool:
        """True when the conjunct holds for every position of its ``i`` variable (or once)."""
        for slot, k in self.needs:
            if len(env[slot]) < k:
                return False
        if self.ivar is None:
            return bool(self.fn(env, 0, x))
        fn = self.fn
        for i in range(1 if self.uses_prev else 0, len(env[self.ivar])):
            if not fn(env, i, x):
                return False
        return True

    def holds_last(self, env: Any) -> bool:
        """True when the conjunct holds for the newest element of its ``i`` variable."""
        for slot, k in self.needs:
            if len(env[slot]) < k:
                return False
        i = len(env[self.ivar]) - 1 if self.ivar is not None else 0
        if self.uses_prev and i == 0:
            return True
        return bool(self.fn(env, i, None))


@dataclass(slots=True)
class NegSpec:
    """A negation ``!T n`` after positive slot ``after`` (trailing when ``trailing``).

    ``check_slot``: the slot whose binding checks it (the next slot, or later when its
    conjuncts mention later variables); ``edge_fns`` (``f(prev_last, next_first, x)``)
    when every conjunct has the edge form, else ``conds`` in general form;
    ``local_fns`` (``f(None, x, None)``) when the conjuncts mention only ``n``.
    """

    after: int
    types: frozenset[str]
    var: str
    trailing: bool
    check_slot: int
    conds: list[Conjunct]
    edge_fns: list[Fn] | None
    local_fns: list[Fn] | None
    k: int = -1
    """Index in the plan's middle negations (-1 for trailing ones)."""
    reads: frozenset[int] = frozenset()
    """Positive slots its conjuncts read."""
    reads_open_kleene: bool = False
    """Whether a conjunct reads a Kleene slot after the negation other than through ``[1]``: the NFA checks
    the negation when that slot holds its first element only, so a tree (which sees it complete) refuses it."""

    def qualifies_local(self, x: Event) -> bool:
        """Whether ``x`` violates the negation by itself (only for ``local_fns`` negations)."""
        assert self.local_fns is not None
        for fn in self.local_fns:
            if not fn(None, x, None):
                return False
        return True

    def violated_by(self, env: Any, x: Event) -> bool:
        """Whether candidate ``x`` satisfies every conjunct of the negation under ``env``."""
        for c in self.conds:
            if not c.holds_all(env, x):
                return False
        return True


@dataclass(slots=True)
class Slot:
    """A positive component of a plan (an NFA state with begin/take edges)."""

    index: int
    var: str
    types: frozenset[str]
    kleene: bool
    entry_local: list[Fn] = field(default_factory=list)
    entry_edge: list[Fn] = field(default_factory=list)
    entry_general: list[Conjunct] = field(default_factory=list)
    take_local: list[Fn] = field(default_factory=list)
    take_edge: list[Fn] = field(default_factory=list)
    take_general: list[Conjunct] = field(default_factory=list)
    negations: list[NegSpec] = field(default_factory=list)
    """Middle negations checked when this slot's first event is bound."""
    meta: dict[str, list[ConjunctMeta]] = field(default_factory=dict)
    """Group name (:data:`GROUPS`) -> one :class:`ConjunctMeta` per item of that list, same order."""


@dataclass(slots=True)
class NFAPlan:
    """One linear plan compiled to an NFA: slots, negations, output."""

    index: int
    slots: list[Slot]
    emit_general: list[Conjunct]
    negations: list[NegSpec]
    trailing: list[NegSpec]
    returns: list[tuple[str, Fn]]
    slot_of_type: dict[str, list[int]]
    neg_types: frozenset[str]
    layout: Any = None
    """(query variables, slot variables, slot Kleene flags): how a binding becomes ``Match.events``."""
    shareable: list[bool] = field(default_factory=list)
    """Per slot: whether runs parked at this slot with the same last bound event have identical futures
    (every condition still to be evaluated reads only that event, later bindings and the current event),
    so that skip_till_next_match and the contiguity strategies may advance them as one group
    (:mod:`engine.nfa.shared_runs`; docs/semantics.md section 4, "Runs that share work")."""
    emit_meta: list[ConjunctMeta] = field(default_factory=list)
    """One :class:`ConjunctMeta` per item of ``emit_general``, same order."""

    @property
    def final(self) -> int:
        return len(self.slots) - 1
