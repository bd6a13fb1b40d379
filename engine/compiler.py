"""``compile_query``: LQL text -> a stateless :class:`CompiledQuery` (DESIGN.md section 5).

The compiled query holds the NFA plans and nothing per key; per-key state lives
in :class:`engine.matcher.Matcher` (Flink CEP's NFA / NFAState split).
"""
from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from engine.events import Event
from engine.lql.ast import (
    STRATEGIES,
    BoolOp,
    Equivalence,
    PatternQuery,
    Schema,
    components,
)
from engine.lql.errors import QueryError
from engine.match import Match
from engine.nfa.compiler import NFAPlan, PlanCompiler
from engine.nfa.plans import expand


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
    """

    name: str | None
    ast: PatternQuery
    strategy: str
    window_us: int | None
    partition_by: tuple[str, ...]
    plans: list[NFAPlan]
    types: frozenset[str]
    variables: tuple[str, ...]

    @property
    def live_types(self) -> frozenset[str]:
        """The event types whose live events the query consumes (= :attr:`types`; as on a live-and-archived plan)."""
        return self.types

    @property
    def stream_types(self) -> frozenset[str]:
        """Every event type the query reads (= :attr:`types`; as on a live-and-archived plan)."""
        return self.types

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
        return Match(self.name, None, first.ts, last.ts, fields, plan.layout, env)


def compile_query(
    source: str | PatternQuery, schemas: Schema | None = None, strategy: str | None = None
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

    Returns
    -------
    CompiledQuery

    Raises
    ------
    QueryError
        With line and column, for a syntax error or a failed semantic check, or when
        ``source`` is a live-and-archived query (see ``engine.live_archived``).
    """
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
        ast = PatternQuery(
            ast.pattern, ast.where, ast.partition_by, strategy, ast.within_us, ast.returns, ast.name, ast.pos  # type: ignore[arg-type]
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
    plans = [
        PlanCompiler(ast, plan, i, fold).build(ast.within_us, returns)
        for i, plan in enumerate(expand(ast.pattern))
    ]
    if not plans:
        raise QueryError.at(ast.pattern.pos, "the pattern has no positive component")
    comps = components(ast.pattern)
    variables = tuple(dict.fromkeys(c.var for c in comps if c.kind != "neg"))
    for plan in plans:
        plan.layout = (variables, tuple(s.var for s in plan.slots), tuple(s.kleene for s in plan.slots))
    return CompiledQuery(
        name=ast.name,
        ast=ast,
        strategy=ast.strategy,
        window_us=ast.within_us,
        partition_by=partition_by,
        plans=plans,
        types=frozenset(t for c in comps for t in c.types),
        variables=variables,
    )


compile = compile_query  # noqa: A001 - the name DESIGN.md section 5 uses
