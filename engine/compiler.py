"""``compile_query``: LQL text -> a stateless :class:`CompiledQuery` (docs/architecture.md section 7.5).

The compiled query holds the NFA plans and nothing per key; per-key state lives
in :class:`engine.matcher.Matcher` (Flink CEP's NFA / NFAState split).
"""
from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from engine.events import Event
from engine.lql.ast import (
    STRATEGIES,
    BoolOp,
    Equivalence,
    OperatorUse,
    PatternQuery,
    Schema,
    components,
)
from engine.lql.checks import operator_uses
from engine.lql.errors import QueryError
from engine.match import Match
from engine.nfa.compiler import NFAPlan, PlanCompiler
from engine.nfa.plans import expand
from engine.nfa.tree import cost_model, left_deep, tree_supported


@dataclass(slots=True)
class CompiledQuery:
    """A compiled live pattern query: immutable, shareable between matchers.

    Attributes
    ----------
    name : str | None
        The query's NAME.
    ast : PatternQuery
        The validated syntax tree.
    strategy : str
        The selection strategy.
    window_us : int | None
        WITHIN in microseconds (None: unbounded).
    partition_by : tuple[str, ...]
        Attributes of the partition key (PARTITION BY, plus ``[attr]`` equivalences
        folded in for skip_till_any_match / skip_till_next_match).
    plans : list[NFAPlan]
        One NFA per linear plan of the pattern.
    types : frozenset[str]
        Every event type the pattern mentions (the query stream).
    variables : tuple[str, ...]
        Positive variables in pattern order (keys of ``Match.events``).
    plan_kind : str
        ``nfa`` or ``tree``: how the plans are evaluated (PLAN clause; :mod:`engine.nfa.tree`).
    trees : list
        For ``tree``: per plan, ``(shape, conjuncts)`` for :class:`engine.nfa.tree.TreeStorage`.
    """

    name: str | None
    ast: PatternQuery
    strategy: str
    window_us: int | None
    partition_by: tuple[str, ...]
    plans: list[NFAPlan]
    types: frozenset[str]
    variables: tuple[str, ...]
    operators: tuple[OperatorUse, ...] = ()
    """The operator components' operators (issue 16), run by :class:`engine.plugins.stage.OperatorStage`
    before the NFA; :attr:`types` then holds their input types too."""
    plan_kind: str = "nfa"
    trees: list[Any] = field(default_factory=list)

    kind = "live"
    """The statement kind (``queries.kind``; every statement class declares it, callers never test its class)."""
    reads_archive = False
    """Whether it reads the archive as it runs (only a live-and-archived query does)."""
    backfills = True
    """Whether a backfill (``lace backfill``, ``POST /backfills``) runs it over archived history (pattern queries,
    live-and-archived ones and INTERVAL statements; FILTER and AGGREGATE run live only)."""
    chooses_plan = True
    """Whether its plan may be chosen (``PLAN``, ``plan_trial``, a plan switch, a stored ``plan_choice``; issue 16,
    004): only a live pattern query's (the sides of a live-and-archived query run as written)."""
    emits_intervals = False
    """Whether the events it derives (EMIT INTO) are interval events (only an INTERVAL statement's are)."""
    archive_key_attr = None
    """The attribute its archive requests select by (only a live-and-archived query reads the archive)."""
    read_by_ingest = False
    """Whether the ingest path reads it while it stamps a request's events (a FILTER decides what is archived; a
    live-and-archived query's worker is offered the events at once), so that a new version cannot start while a
    request is in flight (the service's ``LiveRuntime.start_deferred``)."""
    runs_alone = True
    """Whether its detector runs over a stream by itself, without a rule graph (a live pattern query: a
    :class:`engine.matcher.Matcher`); ``lace match`` runs one such statement without EMIT INTO that way."""

    @property
    def patterns(self) -> tuple[CompiledQuery, ...]:
        """The pattern queries it matches (its partial matches are theirs; ``pm_capacity`` and the query limits
        apply to them): itself."""
        return (self,)

    @property
    def match_span_us(self) -> int | None:
        """Largest ``end - start`` of a match (and trailing-negation wait), int us; None: unbounded. A backfill
        reads this much before and after its range (:mod:`archive.backfill`)."""
        if self.window_us is not None:
            return self.window_us
        if all(len(p.slots) == 1 and not p.slots[0].kleene and not p.trailing for p in self.plans):
            return 0
        return None

    @property
    def emit_into(self) -> str | None:
        """The derived event type of ``EMIT INTO`` (None: the matches are results/alerts)."""
        return self.ast.emit_into

    @property
    def state_span_us(self) -> int | None:
        """How far before its newest event the query's state may depend on events, int microseconds: its
        :attr:`match_span_us` (WITHIN; 0 for a pattern of one event, which keeps no partial match) plus what its
        operators remember beyond it (:func:`engine.plugins.stage.operators_history_us`; 0 without operators);
        None when either is unbounded. A restart's replay begins this, plus the allowed lateness, before the
        newest archived event (issue 24).

        Raises
        ------
        PluginError
            When an operator's ``history_us()`` misbehaves.
        """
        span = self.match_span_us
        if span is None or not self.operators:
            return span
        from engine.plugins.stage import operators_history_us

        reach = operators_history_us(self.operators)
        return None if reach is None else span + reach

    @property
    def live_types(self) -> frozenset[str]:
        """The event types whose live events the query consumes (= :attr:`stream_types`; as on a live-and-archived
        plan)."""
        return self.stream_types

    @property
    def stream_types(self) -> frozenset[str]:
        """Every event type the query reads from its stream (:attr:`types` without the operators' composite types,
        which the query makes itself; as on a live-and-archived plan)."""
        if not self.operators:
            return self.types
        return self.types - {use.derived_type for use in self.operators}

    def key_of(self, event: Event) -> Hashable:
        """The partition key of ``event``: None without PARTITION BY, the value of one attribute, or a tuple."""
        pb = self.partition_by
        if not pb:
            return None
        if len(pb) == 1:
            return event.get(pb[0])
        return tuple(event.get(a) for a in pb)

    def make_match(self, plan: NFAPlan, env: tuple[Any, ...]) -> Match:
        """Build the :class:`Match` of a complete binding ``env`` (one entry per slot of ``plan``)."""
        first = env[0][0] if plan.slots[0].kleene else env[0]
        last = env[-1][-1] if plan.slots[-1].kleene else env[-1]
        fields = {alias: fn(env, 0, None) for alias, fn in plan.returns} if plan.returns else None
        return Match(self.name, None, first.ts, last.ts_end, fields, plan.layout, env)


def compile_query(
    source: str | PatternQuery,
    schemas: Schema | None = None,
    strategy: str | None = None,
    *,
    push_down: bool = True,
    estimates: Mapping[str, float] | None = None,
    order: str = "cost",
    rates: Mapping[str, float] | None = None,
) -> CompiledQuery:
    """Compile LQL text (or an already parsed live query) for live matching.

    Parameters
    ----------
    source : str | PatternQuery
        The query text, or its syntax tree from :func:`engine.lql.parser.parse`.
    schemas : dict, optional
        Event type -> {attribute -> type}; when given, the query is type-checked against it.
    strategy : str, optional
        Overrides the query's STRATEGY (``lace match --strategy``).
    push_down : bool
        Evaluate each WHERE conjunct at the earliest NFA edge that binds its variables (004's
        Strategy 2, the default); False evaluates every positive conjunct on the complete match
        (only for skip_till_any_match, where it keeps the result; meant to measure push-down).
    estimates : mapping, optional
        Pass probability per conjunct, keyed by its normalized LQL text
        (:func:`engine.lql.ast.expr_text`, e.g. ``"t.size >= 10000"``), e.g. from archive
        statistics; orders each edge's conjuncts by ascending ``cost / (1 - p)``.
    order : {"cost", "declared"}
        ``declared`` keeps the WHERE order on every edge (for benchmarks).
    rates : mapping, optional
        Events per second per type and key, for the plan choice of ``PLAN auto`` / ``PLAN tree``
        (without them ``PLAN auto`` keeps the NFA and ``PLAN tree`` assumes equal rates).

    Returns
    -------
    CompiledQuery

    Raises
    ------
    QueryError
        With line and column, for a syntax error or a failed semantic check, or when
        ``source`` is a live-and-archived query (see ``engine.live_archived``).
    ValueError
        For an unknown ``order``, an estimate outside [0, 1], or ``push_down=False`` under
        a strategy other than skip_till_any_match.
    """
    if order not in ("cost", "declared"):
        raise ValueError(f"order must be 'cost' or 'declared', not {order!r}")
    for text, p in (estimates or {}).items():
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"estimate for {text!r} must be a probability in [0, 1], got {p!r}")
    if isinstance(source, str):
        from engine.lql.parser import parse

        ast = parse(source, schemas)
    else:
        ast = source
    if not isinstance(ast, PatternQuery):
        raise QueryError.at(
            getattr(ast, "pos", None),
            "a live-and-archived query (LIVE ... ARCHIVED ...) needs `lace replay`, not a live-only matcher",
        )
    if strategy is not None:
        strategy = strategy.lower().replace("-", "_")
        if strategy not in STRATEGIES:
            raise QueryError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
        ast = replace(ast, strategy=strategy)  # type: ignore[arg-type]
    if not push_down and ast.strategy != "skip_till_any_match":
        raise ValueError(
            f"push_down=False keeps the result only under skip_till_any_match, not {ast.strategy}"
        )
    fold = ast.strategy in ("skip_till_any_match", "skip_till_next_match")
    equivalences: list[str] = []
    if isinstance(ast.where, Equivalence):
        equivalences.append(ast.where.attr)
    elif isinstance(ast.where, BoolOp) and ast.where.op == "and":
        equivalences.extend(p.attr for p in ast.where.operands if isinstance(p, Equivalence))
    folded = tuple(dict.fromkeys(equivalences)) if fold else ()
    partition_by = tuple(dict.fromkeys(ast.partition_by + folded))
    returns = [(item.alias, item.expr) for item in ast.returns]
    compilers = [
        PlanCompiler(ast, plan, i, fold, push_down=push_down, estimates=estimates, order=order)
        for i, plan in enumerate(expand(ast.pattern))
    ]
    plans = [c.build(ast.within_us, returns) for c in compilers]
    if not plans:
        raise QueryError.at(ast.pattern.pos, "the pattern has no positive component")
    comps = components(ast.pattern)
    variables = tuple(dict.fromkeys(c.var for c in comps if c.kind != "neg"))
    for plan in plans:
        plan.layout = (variables, tuple(s.var for s in plan.slots), tuple(s.kleene for s in plan.slots))
    plan_kind, trees = choose_plan(ast, plans, compilers, push_down, rates)
    return CompiledQuery(
        plan_kind=plan_kind,
        trees=trees,
        name=ast.name,
        ast=ast,
        strategy=ast.strategy,
        window_us=ast.within_us,
        partition_by=partition_by,
        plans=plans,
        types=frozenset(t for c in comps for t in c.types)
        | frozenset(t for use in operator_uses(ast.pattern) for t in use.input_types),
        variables=variables,
        operators=tuple(operator_uses(ast.pattern)),
    )


# ---- plans (issue 16): PLAN auto | nfa | tree


TREE_GAIN = 0.5
"""``PLAN auto`` takes a tree when the model puts its cost below this fraction of the linear NFA's."""


def choose_plan(
    ast: PatternQuery,
    plans: list[NFAPlan],
    compilers: list[PlanCompiler],
    push_down: bool,
    rates: Mapping[str, float] | None,
) -> tuple[str, list[Any]]:
    """``("nfa", [])`` or ``("tree", [(shape, conjuncts) per plan])`` for the query's PLAN clause.

    Raises
    ------
    QueryError
        ``PLAN tree`` under a strategy other than skip_till_any_match, or for a pattern a tree cannot
        evaluate (a trailing negation, a negation condition on a later Kleene variable:
        :func:`engine.nfa.tree.tree_supported`), at the PLAN clause.
    ValueError
        ``PLAN tree`` with ``push_down=False`` (a tree always pushes conjuncts down).
    """
    wanted = ast.plan
    if wanted == "nfa":
        return "nfa", []
    any_match = ast.strategy == "skip_till_any_match"
    if wanted == "tree":
        if not any_match:
            raise QueryError.at(
                ast.plan_pos,
                f"PLAN tree keeps the matches only under skip_till_any_match, not {ast.strategy}; use PLAN nfa",
            )
        for p in plans:
            reason = tree_supported(p)
            if reason is not None:
                raise QueryError.at(ast.plan_pos, f"PLAN tree cannot evaluate {reason}; use PLAN nfa")
        if not push_down:
            raise ValueError("PLAN tree always pushes conjuncts down; push_down=False needs PLAN nfa")
    elif not any_match or not push_down or rates is None or any(tree_supported(p) for p in plans):
        return "nfa", []
    window_s = ast.within_us / 1e6 if ast.within_us is not None else 60.0
    trees = []
    gain = False
    for p, c in zip(plans, compilers):
        conj = c.tree_conjuncts()
        model = cost_model(
            p, [(comps, cj, meta.estimate) for comps, cj, meta in conj], rates or {}, window_s, c.negation_estimates()
        )
        shape = model.best()
        if model.cost(shape) < TREE_GAIN * model.cost(left_deep(len(p.slots))):
            gain = True
        trees.append((shape, [(comps, conjunct) for comps, conjunct, _ in conj]))
    if wanted == "auto" and not gain:
        return "nfa", []
    return "tree", trees


compile = compile_query  # noqa: A001 - the name docs/architecture.md section 7.5 uses
