"""A compiled live-and-archived query (docs/architecture.md section 7.4, "Live-and-archived queries").

:func:`compile_live_archived` compiles both sides with :func:`engine.compiler.compile_query`, the
JOIN into closures over ``(live Match, archived Match)`` and the RETURN over both sides' variables
(never ``eval``: :mod:`engine.nfa.conditions` builds the closures). Everything here is stateless.

Semantics (001 section 4; docs/semantics.md section 6):

- A **live instance** ``I`` is a match of ``P_L``; ``I.start`` is the ts of its first event. Its
  access range is ``R_A(I) = [I.start - lookback, I.start)`` (int microseconds, half-open).
- An **archived instance** ``J`` is a match of ``P_A`` over the archive. It joins ``I`` when every
  event of ``J`` lies in ``R_A(I)`` (an interval event ``[ts, ts_end)`` lies in it when it starts at or after
  ``I.start - lookback`` and *ends before* ``I.start``: ``ts_end < I.start``; an archived interval still
  running at ``I.start`` is not in the past ``I`` looks at, issue 24 item 4), the JOIN holds, and, when
  ``P_A`` has a trailing negation, its negation window ``[J.start, J.start + WITHIN]`` lies in ``R_A(I)``
  too (the archive ``I`` sees, every event before ``I.start``, must be able to confirm the negation).
- JOIN is read like WHERE: its top-level AND conjuncts, a conjunct that mentions a variable that
  ``I`` or ``J`` does not bind (an OR branch not taken, an empty Kleene star) is ignored, a
  conjunct with ``b[k]`` beyond ``b``'s length is false, and the null rules of WHERE apply.
- **Pairwise form** (RETURN aggregates no archived variable): one result per joined pair, a
  :class:`~engine.match.Match` whose ``events`` holds the variables of both sides, ``start``/``end``
  over both, ``fields`` the RETURN.
- **Grouped form** (RETURN aggregates an archived variable, e.g. ``count(c)``, ``min(c.ts)``): one
  result per live instance ``I`` that joins at least one archived instance (:attr:`grouped`,
  :meth:`LiveArchivedPlan.group`). Its ``events`` holds ``I``'s variables and, for every archived
  variable ``v``, the events bound to ``v`` in *any* joined archived instance, each event once (by
  id), in ``(ts, id)`` order; ``start``/``end`` span ``I`` and every joined instance. An aggregate
  over ``v`` runs over exactly those events: ``count(c)`` is the number of distinct events bound to
  ``c`` (the number of joined instances when each binds its own ``c`` event, as with a one-event
  archived pattern), ``first``/``last`` follow ``(ts, id)`` order, ``avg``/``sum``/``min``/``max``
  skip nulls. A plain reference to an archived variable (``c.ts``, ``c[1].ts``) is refused by the
  checks (SQL's GROUP BY rule); live variables are read as in the pairwise form. The result is
  the same whatever order the joined instances come in.

Archive keys: when a top-level JOIN conjunct ``live_expr = q.y`` equates a value of the live side
with a PARTITION BY attribute ``y`` of the archived side (both variables bound by every plan, and
``P_A`` not ``strict_contiguity``), every joining ``J`` has ``y == live_expr(I)``: an archive request
for ``I`` may then ask for that key only (:attr:`LiveArchivedPlan.key`).
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.compiler import CompiledQuery, compile_query
from engine.events import Event, attr_getter
from engine.lql.ast import (
    Aggregate,
    AttrRef,
    BoolOp,
    Compare,
    Expr,
    LiveArchivedQuery,
    PatternQuery,
    Schema,
    expr_text,
    variable_refs,
)
from engine.lql.checks import grouping_aggregates
from engine.lql.errors import QueryError
from engine.match import Match
from engine.nfa.conditions import Fn, compile_bool, compile_value
from engine.nfa.getters import fold_events

Events = dict[str, tuple[Event, ...]]
Range = tuple[int, int]
NO_KEY = object()
"""Returned by :meth:`LiveArchivedPlan.key_of` when the live instance's key value is missing (None):
the key equality can never hold, so the instance joins nothing and needs no archive request."""


def _conjuncts(expr: Expr | None) -> list[Expr]:
    if expr is None:
        return []
    if isinstance(expr, BoolOp) and expr.op == "and":
        return [c for operand in expr.operands for c in _conjuncts(operand)]
    return [expr]


def _position(ref: AttrRef) -> int:
    """Index into the variable's event tuple: 0 for a single variable or ``b[1]``, -1 for ``b[last]``."""
    idx = ref.index
    if idx is None or idx.kind == "first":
        return 0
    if idx.kind == "last":
        return -1
    if idx.kind == "at":
        return idx.at - 1
    raise QueryError.at(ref.pos, f"{ref.var}[i] is only allowed in WHERE")  # the checks reject it first


def _equality_sides(part: Expr, live_ok: frozenset[str], archived_ok: frozenset[str]) -> tuple[Expr, Expr] | None:
    """``(live side, archived side)`` of a JOIN conjunct ``x = y`` whose one side reads only variables of
    ``live_ok`` and the other only variables of ``archived_ok`` (no aggregate; the two sides' variables never share
    a name), else None."""
    if not isinstance(part, Compare) or part.op != "=":
        return None
    for live_side, other in ((part.left, part.right), (part.right, part.left)):
        lrefs, orefs = variable_refs(live_side), variable_refs(other)
        if (
            lrefs and orefs
            and all(isinstance(r, AttrRef) and r.var in live_ok for r in lrefs)
            and all(isinstance(r, AttrRef) and r.var in archived_ok for r in orefs)
        ):
            return live_side, other
    return None


def _resolver(live_vars: frozenset[str]) -> Callable[[AttrRef | Aggregate], Fn]:
    """Resolve references for ``f(live_events, archived_events, None)``; unbound or out of range -> None."""

    def resolve(ref: AttrRef | Aggregate) -> Fn:
        live = ref.var in live_vars
        var = ref.var
        if isinstance(ref, Aggregate):
            return _aggregate(ref, live)
        get = attr_getter(ref.attr)
        pos = _position(ref)

        def value(a: Events, b: Events, c: Any) -> Any:
            evs = (a if live else b).get(var, ())
            if pos >= len(evs) or (pos < 0 and not evs):
                return None
            return get(evs[pos])

        return value

    return resolve


def _aggregate(agg: Aggregate, live: bool) -> Fn:
    """RETURN aggregate over a variable's events (a single variable counts as one element)."""
    get = attr_getter(agg.attr) if agg.attr else None
    func, var = agg.func, agg.var

    if agg.plugin:  # an aggregate plug-in (issue 16)
        from engine.plugins.evaluate import group_aggregate

        fold, getp = group_aggregate(func), attr_getter(agg.attr or "")
        return lambda a, b, c: fold(map(getp, (a if live else b).get(var, ())))

    def aggregate(a: Events, b: Events, c: Any) -> Any:
        return fold_events(func, get, (a if live else b).get(var, ()))

    return aggregate


@dataclass(frozen=True, slots=True)
class JoinConjunct:
    """One top-level AND part of JOIN: ``fn(live_events, archived_events, None) -> bool``.

    ``variables``: every variable it mentions (ignored unless all are bound); ``optional``: those
    some match may leave unbound (only they need checking); ``needs``: ``(var, k)`` for every
    ``b[k]`` (false when ``b`` has fewer than k events).
    """

    fn: Fn
    variables: frozenset[str]
    needs: tuple[tuple[str, int], ...]
    expr: Expr
    optional: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class EquiJoin:
    """A JOIN conjunct ``live_expr = archived_expr`` whose sides each read one side's variables, all bound by every
    match (no aggregate, no ``b[k]``): ``live(a, b, None)`` and ``archived(a, b, None)`` evaluate them apart, so the
    live value is taken once per live instance and the archived one once per archived instance (hash-join style,
    :meth:`engine.live_archived.base.Runner.join`). It holds when both are not null and equal, as in WHERE."""

    live: Fn
    archived: Fn
    text: str


@dataclass(frozen=True, slots=True)
class KeyPlan:
    """Archive key of a live instance, from a JOIN equality ``live_expr = q.attr``.

    ``attr`` is a PARTITION BY attribute of the archived side; ``live_value(events)`` evaluates
    ``live_expr`` on the live instance's events.
    """

    attr: str
    live_value: Fn
    text: str
    live_attr: str | None = None
    expr: Expr | None = None
    """``x`` when the live side is a plain attribute ``p.x`` (OLLAA may then filter live events by it)."""


def mandatory_vars(query: CompiledQuery) -> frozenset[str]:
    """Variables bound to at least one event by every match (in every linear plan, not a Kleene star)."""
    sets = [frozenset(slot.var for slot in plan.slots) for plan in query.plans]
    return frozenset.intersection(*sets) if sets else frozenset()


def live_span_us(query: CompiledQuery) -> int | None:
    """Largest ``I.end - I.start`` (and trailing-negation wait) of a live instance, int us; None: unbounded
    (what the query declares, :attr:`CompiledQuery.match_span_us`)."""
    return query.match_span_us


class LiveArchivedPlan:
    """A compiled live-and-archived query: both sides, the JOIN, the RETURN, the archive key.

    Attributes
    ----------
    name : str | None
    live, archived : CompiledQuery
        ``P_L`` and ``P_A``.
    lookback_us : int
        ``LOOKBACK``, int microseconds.
    key : KeyPlan | None
        How to get a live instance's archive key (None: requests cover every key).
    archived_deadline_us : int | None
        ``P_A``'s WITHIN when it has a trailing negation (see the module docstring), else None.
    live_span_us : int | None
        See :func:`live_span_us`.
    variables : tuple[str, ...]
        Live variables then archived variables (keys of a result's ``events``).
    grouped : bool
        RETURN aggregates an archived variable: one result per live instance (:meth:`group`),
        not one per joined pair (:meth:`result`). See the module docstring.
    """

    kind = "live_archived"
    """The statement kind (``queries.kind``)."""
    reads_archive = True
    """It reads the archive as it runs: the service runs it on a live-and-archived worker with an archive source."""
    backfills = True
    """A backfill runs it: both sides on Spark, then the join (:mod:`archive.backfill`)."""
    chooses_plan = False
    """Its sides run as written (no plan trial or switch)."""
    emits_intervals = False
    """Its derived events (EMIT INTO) are point events."""
    read_by_ingest = True
    """The ingest path offers its worker each request's events as it stamps them."""
    runs_alone = False
    """It needs an archive source and a worker."""

    @property
    def patterns(self) -> tuple[CompiledQuery, ...]:
        """The pattern queries it matches: its live and archived sides (``pm_capacity`` and the query limits
        apply to both)."""
        return (self.live, self.archived)

    @property
    def window_us(self) -> int | None:
        """Its live side's WITHIN, int us (None: unbounded): what the service records as its window (the
        archived side's is ``archived.window_us``)."""
        return self.live.window_us

    @property
    def match_span_us(self) -> int | None:
        """Largest ``I.end - I.start`` of a live instance, int us (:attr:`live_span_us`)."""
        return self.live_span_us

    @property
    def archive_key_attr(self) -> str | None:
        """The archived side's attribute its archive requests select by (:attr:`key`; None: every key); ``lace
        replay`` partitions its archive by it."""
        return None if self.key is None else self.key.attr

    def __init__(self, query: LiveArchivedQuery, schemas: Schema | None = None, *, key_hint: str | None = None) -> None:
        self.ast = query
        self.name = query.name
        self.emit_into = query.emit_into
        self.live = compile_query(_named(query.live, query.name), schemas)
        self.archived = compile_query(_named(query.archived, query.name), schemas)
        self.lookback_us = query.lookback_us
        self.live_vars = frozenset(self.live.variables)
        self.variables = self.live.variables + self.archived.variables
        resolve = _resolver(self.live_vars)
        self.join: list[JoinConjunct] = []
        for part in _conjuncts(query.join):
            refs = variable_refs(part)
            needs = tuple(
                sorted(
                    {(r.var, r.index.at) for r in refs if isinstance(r, AttrRef) and r.index and r.index.kind == "at"}
                )
            )
            self.join.append(JoinConjunct(compile_bool(part, resolve), frozenset(r.var for r in refs), needs, part))
        self.returns: list[tuple[str, Fn]] = [(item.alias, compile_value(item.expr, resolve)) for item in query.returns]
        self.grouped = bool(grouping_aggregates(query.returns, frozenset(self.archived.variables)))
        has_trailing = any(p.trailing for p in self.archived.plans)
        self.archived_deadline_us = self.archived.window_us if has_trailing else None
        self.live_span_us = live_span_us(self.live)
        self.state_span_us = self.live_span_us
        """The detector contract's restart horizon (docs/architecture.md section 4): its live span; the service
        adds its tolerance ``T_L`` and the live instances still waiting for the archive."""
        self.key = self._key_plan(query.join, resolve, key_hint)
        bound = mandatory_vars(self.live) | mandatory_vars(self.archived)
        self.join = [
            JoinConjunct(c.fn, c.variables, c.needs, c.expr, c.variables - bound) for c in self.join
        ]
        # with a key plan every candidate shares the instance's key: its equality need not be re-checked
        self.join_same_key = [c for c in self.join if self.key is None or c.expr is not self.key.expr]
        self.join_equi, self.join_rest = self._split_equi(self.join_same_key, resolve)
        """With a key plan: the equalities of :attr:`join_same_key` evaluated apart (:class:`EquiJoin`), and its
        other conjuncts (:meth:`joins` with ``equi_checked``)."""
        self.archived_types = tuple(sorted(self.archived.types))
        self.live_types = frozenset(self.live.types)
        self.stream_types = frozenset(self.live.types | self.archived.types)

    # ---------------------------------------------------------------- keys

    def _split_equi(
        self, conjuncts: list[JoinConjunct], resolve: Callable[[AttrRef | Aggregate], Fn]
    ) -> tuple[list[EquiJoin], list[JoinConjunct]]:
        live_ok, archived_ok = mandatory_vars(self.live), mandatory_vars(self.archived)
        equi: list[EquiJoin] = []
        rest: list[JoinConjunct] = []
        for c in conjuncts:
            sides = None if c.needs else _equality_sides(c.expr, live_ok, archived_ok)
            if sides is None:
                rest.append(c)
            else:
                equi.append(EquiJoin(compile_value(sides[0], resolve), compile_value(sides[1], resolve),
                                     expr_text(c.expr)))
        return equi, rest

    def _key_plan(
        self, join: Expr | None, resolve: Callable[[AttrRef | Aggregate], Fn], hint: str | None
    ) -> KeyPlan | None:
        if self.archived.strategy == "strict_contiguity" or not self.archived.partition_by:
            return None
        live_ok, archived_ok = mandatory_vars(self.live), mandatory_vars(self.archived)
        found: list[KeyPlan] = []
        for part in _conjuncts(join):
            sides = _equality_sides(part, live_ok, archived_ok)
            if sides is None:
                continue
            live_side, other = sides
            if not (isinstance(other, AttrRef) and other.attr in self.archived.partition_by):
                continue
            live_attr = live_side.attr if isinstance(live_side, AttrRef) else None
            found.append(KeyPlan(other.attr, compile_value(live_side, resolve), expr_text(part), live_attr, part))
        if not found:
            return None
        return next((k for k in found if k.attr == hint), found[0])

    def key_of(self, inst: Match) -> Hashable:
        """The archive key of live instance ``inst`` (None without a key plan, :data:`NO_KEY` when missing)."""
        if self.key is None:
            return None
        value = self.key.live_value(inst.events, {}, None)
        return NO_KEY if value is None else value

    def archived_key(self, j: Match) -> Hashable:
        """The key attribute's value of archived instance ``j`` (None without a key plan)."""
        if self.key is None:
            return None
        e = j.first_event()
        return None if e is None else e.get(self.key.attr)

    # ---------------------------------------------------------------- ranges and the join

    def access_range(self, inst: Match) -> Range:
        """``R_A(I) = [I.start - lookback, I.start)``, int microseconds."""
        return (inst.start - self.lookback_us, inst.start)

    def qualifies(self, i_start: int, j: Match) -> bool:
        """Whether archived instance ``j`` lies in the access range of a live instance starting at ``i_start``.

        ``j`` lies in ``[i_start - lookback, i_start)`` when it starts (its first ``ts``) at or after
        ``i_start - lookback`` and ends (its last ``ts_end``; ``ts`` of a point event) before ``i_start``:
        an archived interval that ends at or after ``I.start`` is *not* in the range, however early it
        started (docs/semantics.md section 6). With a trailing negation, also
        ``j.start + WITHIN < i_start``. Times are int microseconds.
        """
        if j.start < i_start - self.lookback_us or j.end >= i_start:
            return False
        deadline = self.archived_deadline_us
        return deadline is None or j.start + deadline < i_start

    def joins(self, inst: Match, j: Match, *, same_key: bool = False, equi_checked: bool = False) -> bool:
        """The JOIN condition on the pair (see the module docstring).

        ``same_key``: the caller guarantees ``key_of(inst) == archived_key(j)`` (it took ``j`` from
        ``inst``'s key), so the key equality is skipped. ``equi_checked`` (with ``same_key``): the caller checked
        :attr:`join_equi` too, only :attr:`join_rest` is left.
        """
        conjuncts = (self.join_rest if equi_checked else self.join_same_key) if same_key else self.join
        if not conjuncts:
            return True
        a, b = inst.events, j.events
        for c in conjuncts:
            if c.optional and any(not (a.get(v) or b.get(v)) for v in c.optional):
                continue  # mentions a variable this pair does not bind: ignored, as in WHERE
            if c.needs and any(len(a.get(v) or b.get(v, ())) < k for v, k in c.needs):
                return False
            if not c.fn(a, b, None):
                return False
        return True

    def result(self, inst: Match, j: Match) -> Match:
        """The complex event of a joined pair: both sides' variables, RETURN fields (the pairwise form)."""
        a, b = inst.events, j.events
        fields = {alias: fn(a, b, None) for alias, fn in self.returns}
        return Match(self.name, {**a, **b}, min(inst.start, j.start), max(inst.end, j.end), fields)

    def group(self, inst: Match, joined: Sequence[Match]) -> Match:
        """The complex event of live instance ``inst`` and every archived instance joined with it (grouped form).

        See the module docstring: each archived variable's events over all of ``joined``, once each,
        in ``(ts, id)`` order; ``start``/``end`` over ``inst`` and ``joined``; the RETURN's archived
        aggregates over those events. The order of ``joined`` does not matter.

        Raises
        ------
        ValueError
            When ``joined`` is empty (a live instance that joins nothing has no result).
        """
        if not joined:
            raise ValueError("a grouped result needs at least one joined archived instance")
        merged: dict[str, dict[int, Event]] = {v: {} for v in self.archived.variables}
        for j in joined:
            for var, evs in j.events.items():
                bucket = merged.setdefault(var, {})
                for e in evs:
                    bucket.setdefault(e.id, e)
        b: Events = {var: tuple(sorted(evs.values(), key=Event.order_key)) for var, evs in merged.items()}
        a = inst.events
        fields = {alias: fn(a, b, None) for alias, fn in self.returns}
        start = min(inst.start, min(j.start for j in joined))
        end = max(inst.end, max(j.end for j in joined))
        return Match(self.name, {**a, **b}, start, end, fields)


def _named(side: PatternQuery, name: str | None) -> PatternQuery:
    return PatternQuery(
        side.pattern, side.where, side.partition_by, side.strategy, side.within_us, side.returns, name, side.pos
    )


def compile_live_archived(
    source: str | LiveArchivedQuery, schemas: Schema | None = None, *, key_hint: str | None = None
) -> LiveArchivedPlan:
    """Compile LQL text (or a parsed ``LIVE ... ARCHIVED ...`` query) for the algorithms of 001 section 4.

    Parameters
    ----------
    source : str | LiveArchivedQuery
    schemas : dict, optional
        Event type -> {attribute -> type}, for the type checks.
    key_hint : str, optional
        Prefer this archived PARTITION BY attribute as the archive key when the JOIN equates several
        (e.g. the attribute the archive is keyed by).

    Raises
    ------
    QueryError
        With line and column, for a bad query or a live-only query.
    """
    if isinstance(source, str):
        from engine.lql.parser import parse

        query = parse(source, schemas)
    else:
        query = source
    if not isinstance(query, LiveArchivedQuery):
        raise QueryError.at(getattr(query, "pos", None), "not a live-and-archived query (LIVE ... ARCHIVED ...)")
    return LiveArchivedPlan(query, schemas, key_hint=key_hint)


def merge_ranges(ranges: Sequence[Range]) -> list[Range]:
    """Sorted disjoint half-open intervals covering ``ranges`` (touching ones merge, empty ones drop).

    >>> merge_ranges([(5, 9), (0, 3), (3, 4), (8, 12), (20, 20)])
    [(0, 4), (5, 12)]
    """
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if hi <= lo:
            continue
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


__all__ = [
    "NO_KEY",
    "JoinConjunct",
    "KeyPlan",
    "LiveArchivedPlan",
    "compile_live_archived",
    "live_span_us",
    "mandatory_vars",
    "merge_ranges",
]
