"""Compile a validated pattern query into NFA plans (docs/architecture.md section 7.5).

Each linear plan (:mod:`engine.nfa.plans`) becomes a :class:`NFAPlan`: one
:class:`Slot` per positive component (SASE+ NFA^b states: *begin* binds the
first event of a component, *take* appends to a Kleene component, *proceed*
moves on, *ignore* skips), negations between slots, and WHERE conjuncts pushed
down to the earliest edge where all their variables are bound:

- ``entry_local``  conditions on the event alone (Flink's SimpleCondition),
- ``entry_edge``   conditions on the event and the previous slot's last event,
- ``entry_general`` everything else evaluable when the slot is bound (IterativeCondition),
- ``take_*``       the same for a further element of a Kleene slot,
- ``emit_general`` conditions on ``b[last]``/``b[k]`` of a final Kleene slot.

Within a group, conjuncts are ordered by ascending ``cost / (1 - p)`` (004's
Strategy 1 when costs are equal): ``cost`` is the number of AST nodes, ``p`` the
pass probability from ``estimates`` (LQL text of the conjunct -> probability,
e.g. from archive statistics) or a default (:func:`engine.nfa.conditions.default_pass`).
:mod:`engine.nfa.conjunct_order` re-orders them at run time from measured rates.
``order="declared"`` keeps the WHERE order; ``push_down=False`` evaluates every
positive conjunct on the complete match (``emit_general``) instead of at the
earliest edge (004's Strategy 2 off), for skip_till_any_match only.
Each group's :class:`ConjunctMeta` list (``Slot.meta``, ``NFAPlan.emit_meta``)
runs parallel to it. The compiled plans hold no per-key state.

The compiled plans' classes are :mod:`engine.nfa.compiled_plan`, and the getters of bound events' values
:mod:`engine.nfa.getters`; their names stay importable from here.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from engine.events import attr_getter
from engine.lql.ast import (
    Aggregate,
    AttrRef,
    BoolOp,
    Compare,
    Component,
    Equivalence,
    Expr,
    Index,
    PatternQuery,
    expr_text,
    variable_refs,
)
from engine.lql.errors import QueryError
from engine.lql.relations import by_conjuncts
from engine.nfa.compiled_plan import GROUPS, Conjunct, ConjunctMeta, NegSpec, NFAPlan, Slot
from engine.nfa.conditions import SAME, Fn, compile_bool, compile_value, default_pass, expr_cost, order_rank
from engine.nfa.getters import _aggregate, pick_attr
from engine.nfa.plans import Plan

__all__ = ["GROUPS", "Conjunct", "ConjunctMeta", "NFAPlan", "NegSpec", "PlanCompiler", "Slot", "pick_attr"]


class _NotEdge(Exception):
    """A reference the edge form cannot resolve: the conjunct is general."""


class PlanCompiler:
    """Builds one :class:`NFAPlan` from a linear plan and the query's conjuncts."""

    def __init__(
        self,
        query: PatternQuery,
        plan: Plan,
        index: int,
        fold_equivalence: bool,
        *,
        push_down: bool = True,
        estimates: Mapping[str, float] | None = None,
        order: str = "cost",
    ) -> None:
        self.push_down = push_down
        self.estimates = estimates or {}
        self.order = order
        self.query = query
        self.plan = plan
        self.index = index
        self.fold_equivalence = fold_equivalence
        self.pos_slot: dict[str, int] = {}
        self.neg_after: dict[str, int] = {}
        self.placed: list[tuple[Expr, str, int]] = []
        """Positive conjuncts and where they are evaluated: ("entry" | "take" | "emit", slot)."""
        self.positives: list[Component] = []
        for comp in plan:
            if comp.kind == "neg":
                self.neg_after[comp.var] = len(self.positives) - 1
            else:
                self.pos_slot[comp.var] = len(self.positives)
                self.positives.append(comp)

    # ------------------------------------------------------------------ resolvers

    def _general(self, ref: AttrRef | Aggregate) -> Fn:
        if ref.var in self.neg_after:
            get = attr_getter(ref.attr or "")
            return lambda env, i, x: get(x)
        slot = self.pos_slot.get(ref.var)
        if slot is None:  # a variable this plan does not bind (OR branch not taken, empty Kleene star)
            empty = 0 if isinstance(ref, Aggregate) and ref.func == "count" else None
            return lambda env, i, x: empty
        if isinstance(ref, Aggregate):
            return _aggregate(ref, slot, self.positives[slot].is_kleene)
        get = attr_getter(ref.attr)
        idx = ref.index
        if idx is None:
            return lambda env, i, x: get(env[slot])
        if idx.kind == "i":
            return lambda env, i, x: get(env[slot][i])
        if idx.kind == "prev":
            return lambda env, i, x: get(env[slot][i - 1])
        if idx.kind == "first":
            return lambda env, i, x: get(env[slot][0])
        if idx.kind == "last":
            return lambda env, i, x: get(env[slot][-1])
        k = idx.at

        def at(env: Any, i: int, x: Any) -> Any:
            seq = env[slot]
            return get(seq[k - 1]) if len(seq) >= k else None

        return at

    def _edge_resolver(self, cur: int, mode: str) -> Callable[[AttrRef | Aggregate], Fn]:
        """Resolver of the edge form ``f(prev, event, x)`` for slot ``cur``.

        mode ``entry``: event = first element of ``cur``, prev = last event of ``cur - 1``;
        ``take``: event = b[i], prev = b[i-1]; ``neg``: prev = last of ``cur``,
        event = first of ``cur + 1``, x = the negated candidate.
        """

        def resolve(ref: AttrRef | Aggregate) -> Fn:
            if isinstance(ref, Aggregate):
                raise _NotEdge
            kind = ref.index.kind if ref.index else None
            if ref.var in self.neg_after:
                if mode == "neg":
                    return pick_attr(2, ref.attr)
                raise _NotEdge
            slot = self.pos_slot.get(ref.var)
            kleene = slot is not None and self.positives[slot].is_kleene
            if mode == "entry":
                if slot == cur and kind in (None, "i", "first"):
                    return pick_attr(1, ref.attr)
                if slot == cur - 1 and (not kleene or kind == "last"):
                    return pick_attr(0, ref.attr)
            elif mode == "take":
                if slot == cur and kind == "i":
                    return pick_attr(1, ref.attr)
                if slot == cur and kind == "prev":
                    return pick_attr(0, ref.attr)
            else:
                if slot == cur and (not kleene or kind == "last"):
                    return pick_attr(0, ref.attr)
                if slot == cur + 1 and (not kleene or kind == "first"):
                    return pick_attr(1, ref.attr)
            raise _NotEdge

        return resolve

    # ------------------------------------------------------------------ conjuncts

    def _conjuncts(self) -> list[Expr]:
        where = self.query.where
        parts: list[Expr] = []
        if where is not None:
            parts = list(where.operands) if isinstance(where, BoolOp) and where.op == "and" else [where]
        for extra in by_conjuncts(self.query.pattern, self.plan):  # SEQ(...) BY rel (issue 15), per plan
            parts.extend(extra.operands if isinstance(extra, BoolOp) and extra.op == "and" else [extra])
        out: list[Expr] = []
        for part in parts:
            if isinstance(part, Equivalence):
                if not self.fold_equivalence:
                    out.extend(self._equivalence(part))
                continue
            variables = {r.var for r in variable_refs(part)}
            if all(v in self.pos_slot or v in self.neg_after for v in variables):
                out.append(part)
        if self.order != "declared":
            out.sort(key=lambda e: order_rank(expr_cost(e), self.meta(e).estimate))
        return out

    def meta(self, expr: Expr) -> ConjunctMeta:
        """The cost model's view of ``expr``: text, AST-node cost, prior pass probability."""
        text = expr_text(expr)
        estimate = self.estimates.get(text)
        return ConjunctMeta(text, expr_cost(expr), float(estimate) if estimate is not None else default_pass(expr))

    def tree_conjuncts(self) -> list[tuple[frozenset[int], Conjunct, ConjunctMeta]]:
        """Every positive conjunct in general form with the slots it reads (all slots for a constant one),
        for tree plans (:mod:`engine.nfa.tree`); conjuncts of a negated variable are the plan's
        :class:`NegSpec` instead. A conjunct of one Kleene variable that reads ``b[last]`` or ``b[k]`` is
        marked ``closing``."""
        out = []
        every = frozenset(range(len(self.positives)))
        for expr in self._conjuncts():
            if any(r.var in self.neg_after for r in variable_refs(expr)):
                continue
            slots = frozenset(self.pos_slot[r.var] for r in variable_refs(expr) if r.var in self.pos_slot)
            conjunct = self._general_conjunct(expr)
            conjunct.closing = len(slots) == 1 and self._point(expr)[0] == "close"
            out.append((slots or every, conjunct, self.meta(expr)))
        return out

    def negation_estimates(self) -> list[tuple[float, float]]:
        """Per middle negation (in plan order): the prior pass probability of its conjuncts that read only
        the negated variable, and of the others (products of :meth:`meta` estimates), for the tree cost model."""
        out = []
        for comp in self.plan:
            if comp.kind != "neg" or self.neg_after[comp.var] == len(self.positives) - 1:
                continue
            local = cross = 1.0
            for expr in self._conjuncts():
                refs = {r.var for r in variable_refs(expr)}
                if comp.var in refs:
                    if refs == {comp.var}:
                        local *= self.meta(expr).estimate
                    else:
                        cross *= self.meta(expr).estimate
            out.append((local, cross))
        return out

    def _equivalence(self, eq: Equivalence) -> list[Expr]:
        """``[attr]`` as equalities between neighbours (transitively: all equal)."""

        def ref(comp: Component, kind: str | None) -> AttrRef:
            return AttrRef(comp.var, eq.attr, Index(kind) if comp.is_kleene and kind else None, eq.pos)  # type: ignore[arg-type]

        out: list[Expr] = []
        for s, comp in enumerate(self.positives):
            if comp.is_kleene:
                out.append(Compare(SAME, ref(comp, "i"), ref(comp, "prev"), eq.pos))  # type: ignore[arg-type]
            if s > 0:
                out.append(Compare(SAME, ref(comp, "first"), ref(self.positives[s - 1], "last"), eq.pos))  # type: ignore[arg-type]
        for comp in self.plan:
            if comp.kind == "neg":
                prev = self.positives[self.neg_after[comp.var]]
                out.append(Compare(SAME, AttrRef(comp.var, eq.attr, None, eq.pos), ref(prev, "last"), eq.pos))  # type: ignore[arg-type]
        return out

    def _point(self, expr: Expr) -> tuple[str, int]:
        """Where a positive conjunct is evaluated: ("bind"|"each"|"close", slot)."""
        refs = [r for r in variable_refs(expr) if r.var in self.pos_slot]
        jmax = max(self.pos_slot[r.var] for r in refs) if refs else 0
        kinds = {
            r.index.kind if isinstance(r, AttrRef) and r.index else None for r in refs if self.pos_slot[r.var] == jmax
        }
        if not self.positives[jmax].is_kleene:
            return ("bind", jmax)
        if kinds & {"last", "at"}:
            return ("close", jmax)
        if kinds & {"i", "prev"}:
            return ("each", jmax)
        return ("bind", jmax)

    def _general_conjunct(self, expr: Expr) -> Conjunct:
        ivar = None
        uses_prev = False
        needs = set()
        for r in variable_refs(expr):
            if isinstance(r, AttrRef) and r.index and r.var in self.pos_slot:
                if r.index.kind in ("i", "prev"):
                    ivar = self.pos_slot[r.var]
                    uses_prev = uses_prev or r.index.kind == "prev"
                elif r.index.kind == "at":
                    needs.add((self.pos_slot[r.var], r.index.at))
        return Conjunct(compile_bool(expr, self._general), ivar, uses_prev, tuple(sorted(needs)))

    def _edge_or_none(self, expr: Expr, cur: int, mode: str) -> Fn | None:
        try:
            return compile_bool(expr, self._edge_resolver(cur, mode))
        except _NotEdge:
            return None

    # ------------------------------------------------------------------ build

    def build(self, window_us: int | None, returns: list[tuple[str, Expr]]) -> NFAPlan:
        slots = [
            Slot(i, c.var, frozenset(c.types), c.is_kleene) for i, c in enumerate(self.positives)
        ]
        emit_general: list[Conjunct] = []
        emit_meta: list[ConjunctMeta] = []
        neg_conj: dict[str, list[Expr]] = {v: [] for v in self.neg_after}
        for expr in self._conjuncts():
            negs = {r.var for r in variable_refs(expr) if r.var in self.neg_after}
            if len(negs) > 1:
                raise QueryError.at(getattr(expr, "pos", None), "a condition may mention at most one negated variable")
            if negs:
                neg_conj[negs.pop()].append(expr)
                continue
            if not self.push_down:
                emit_general.append(self._general_conjunct(expr))
                emit_meta.append(self.meta(expr))
                self.placed.append((expr, "emit", len(slots) - 1))
                continue
            kind, s = self._point(expr)
            if kind == "close":
                if s == len(slots) - 1:
                    emit_general.append(self._general_conjunct(expr))
                    self.placed.append((expr, "emit", s))
                    emit_meta.append(self.meta(expr))
                    continue
                kind, s = "close-next", s + 1
            self._place(slots[s], expr, kind)
        negations: list[NegSpec] = []
        trailing: list[NegSpec] = []
        for comp in self.plan:
            if comp.kind != "neg":
                continue
            spec = self._negation(comp, neg_conj[comp.var], len(slots))
            if spec.trailing:
                if window_us is None:
                    raise QueryError.at(comp.pos, "a trailing negation needs WITHIN")
                trailing.append(spec)
            else:
                spec.k = len(negations)
                negations.append(spec)
                slots[spec.check_slot].negations.append(spec)
        slot_of_type: dict[str, list[int]] = {}
        for slot in slots:
            for t in slot.types:
                slot_of_type.setdefault(t, []).append(slot.index)
        neg_types = frozenset(t for n in negations + trailing for t in n.types)
        compiled_returns = [(alias, compile_value(expr, self._general)) for alias, expr in returns]
        shareable = [self._shareable(j, negations, neg_conj) for j in range(len(slots))]
        return NFAPlan(
            self.index,
            slots,
            emit_general,
            negations,
            trailing,
            compiled_returns,
            slot_of_type,
            neg_types,
            shareable=shareable,
            emit_meta=emit_meta,
        )

    def _shareable(self, j: int, negations: list[NegSpec], neg_conj: dict[str, list[Expr]]) -> bool:
        """Whether runs parked at slot ``j`` with the same last bound event have identical futures.

        The conditions still to be evaluated for such a run are: the take conjuncts of slot ``j``,
        the entry and take conjuncts of later slots, the emit conjuncts of a final Kleene slot and the
        middle negations checked after slot ``j``. Each may read the current event, events bound
        after slot ``j``, negation candidates, slot ``j``'s last event (a single variable, ``b[last]``,
        and ``b[i-1]`` / ``b[i]`` in slot ``j``'s own take conjuncts) and nothing else: not
        ``b[1]``, ``b[k]``, an aggregate over ``b`` or an earlier variable, which differ between runs.
        A negation checked later must lie after slot ``j`` (its gap starts at slot ``j``'s last event
        or later). WITHIN, trailing negations and RETURN are evaluated per run (per start) anyway.
        """
        for expr, where, s in self.placed:
            future = s > j or (s == j and where in ("take", "emit"))
            if future and not self._reads_only_shared(expr, j, where == "take" and s == j):
                return False
        for spec in negations:
            if spec.check_slot <= j:
                continue
            if spec.after < j:
                return False
            if not all(self._reads_only_shared(e, j, False) for e in neg_conj[spec.var]):
                return False
        return True

    def _reads_only_shared(self, expr: Expr, j: int, take_of_j: bool) -> bool:
        """Whether ``expr`` reads, of slots ``<= j``, only slot ``j``'s last bound event."""
        for r in variable_refs(expr):
            s = self.pos_slot.get(r.var)
            if s is None or s > j:
                continue  # a negated or unbound variable, or a later binding: shared
            if s < j or isinstance(r, Aggregate):
                return False
            if not self.positives[j].is_kleene:
                continue
            kind = r.index.kind if r.index else None
            if kind == "last" or (take_of_j and kind in ("i", "prev")):
                continue
            return False
        return True

    def _place(self, slot: Slot, expr: Expr, kind: str) -> None:
        """Push a positive conjunct down to its slot's local, edge or general group."""
        refs = [r for r in variable_refs(expr) if r.var in self.pos_slot]
        only_current = all(self.pos_slot[r.var] == slot.index for r in refs)
        if kind == "each":
            # first element: b[i-1] conjuncts do not apply; others evaluate with i = 1
            uses_prev = any(isinstance(r, AttrRef) and r.index and r.index.kind == "prev" for r in refs)
            if not uses_prev:
                self._add_entry(slot, expr, only_current)
            self.placed.append((expr, "take", slot.index))
            fn = self._edge_or_none(expr, slot.index, "take")
            uses_only_i = all(
                self.pos_slot[r.var] == slot.index and isinstance(r, AttrRef) and r.index and r.index.kind == "i"
                for r in refs
            )
            if fn is None:
                _add(slot, "take_general", self._general_conjunct(expr), self.meta(expr))
            elif uses_only_i:
                _add(slot, "take_local", fn, self.meta(expr))
            else:
                _add(slot, "take_edge", fn, self.meta(expr))
            return
        self._add_entry(slot, expr, only_current and kind != "close-next")

    def _add_entry(self, slot: Slot, expr: Expr, only_current: bool) -> None:
        self.placed.append((expr, "entry", slot.index))
        fn = self._edge_or_none(expr, slot.index, "entry")
        if fn is None:
            _add(slot, "entry_general", self._general_conjunct(expr), self.meta(expr))
        elif only_current:
            _add(slot, "entry_local", fn, self.meta(expr))
        else:
            _add(slot, "entry_edge", fn, self.meta(expr))

    def _negation(self, comp: Component, conjuncts: list[Expr], n_slots: int) -> NegSpec:
        after = self.neg_after[comp.var]
        trailing = after == n_slots - 1
        later = [self.pos_slot[r.var] for e in conjuncts for r in variable_refs(e) if r.var in self.pos_slot]
        check_slot = max([after + 1] + later) if not trailing else after
        conds = [self._general_conjunct(e) for e in conjuncts]
        edge_fns: list[Fn] | None = None
        local_fns: list[Fn] | None = None
        if not trailing and check_slot == after + 1:
            fns = [self._edge_or_none(e, after, "neg") for e in conjuncts]
            if all(f is not None for f in fns):
                edge_fns = [f for f in fns if f is not None]
        if all(r.var == comp.var for e in conjuncts for r in variable_refs(e)):
            resolve_x = lambda ref: pick_attr(1, ref.attr)  # noqa: E731 - x passed as the event argument
            local_fns = [compile_bool(e, resolve_x) for e in conjuncts]
        refs = [r for e in conjuncts for r in variable_refs(e) if r.var in self.pos_slot]
        open_kleene = any(
            self.pos_slot[r.var] > after
            and self.positives[self.pos_slot[r.var]].is_kleene
            and not (isinstance(r, AttrRef) and r.index is not None and r.index.kind == "first")
            for r in refs
        )
        return NegSpec(
            after, frozenset(comp.types), comp.var, trailing, check_slot, conds, edge_fns, local_fns,
            reads=frozenset(self.pos_slot[r.var] for r in refs), reads_open_kleene=open_kleene,
        )


def _add(slot: Slot, group: str, item: Any, meta: ConjunctMeta) -> None:
    """Append a compiled conjunct to one of ``slot``'s groups and its metadata beside it."""
    getattr(slot, group).append(item)
    slot.meta.setdefault(group, []).append(meta)
