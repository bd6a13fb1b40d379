"""API models of ``POST /queries/explain`` (the plan and cost model of :mod:`engine.nfa.explain`)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.schemas.common import json_int_type
from service.schemas.resources import ArchiveSlice, QueryText

MAX_EXPLAIN_EVENTS = 100_000
"""Events a ``POST /queries/explain`` body may carry."""
MAX_TRIAL_EVENTS = 2_000_000
"""Archived events a plan trial (``using_archive``) may read."""


class ExplainRequest(BaseModel):
    """A live-only query to explain; with ``events`` it also runs over them and reports measured counts."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "text": "PATTERN SEQ(quote q, trade t) WHERE t.size >= 10000 AND t.price < q.bid_price\n"
                    "PARTITION BY key WITHIN 1 s",
                    "estimates": {"t.size >= 10000": 0.0024},
                    "rates": {"quote": 3000, "trade": 900},
                    "keys": 30,
                }
            ]
        },
    )

    text: QueryText
    events: list[dict[str, Any]] | None = Field(
        None,
        max_length=MAX_EXPLAIN_EVENTS,
        description="A sample stream (objects as in POST /events, of registered types); not ingested.",
    )
    estimates: dict[str, float] | None = Field(
        None, description="Pass probability in [0, 1] per conjunct, keyed by its LQL text (e.g. from the archive)."
    )
    rates: dict[str, float] | None = Field(None, description="Events per second per type, when no events are given.")
    keys: json_int_type(1, 1 << 40) = Field(1, description="Partition keys, when no events are given.")  # type: ignore[valid-type]
    push_down: bool = Field(True, description="Push conjuncts down to the earliest NFA edge (false: all at the end).")
    using_archive: ArchiveSlice | None = Field(
        None,
        description="Run the candidate plans over the archived events of [from, to) (read through Spark, at most "
        f"{MAX_TRIAL_EVENTS:,} events) and pick the one with the least measured CPU time; the plan shown is then "
        "compiled with the pass probabilities measured there (see trial).",
    )


class ExplainConjunct(BaseModel):
    group: str = Field(description="entry_local, entry_edge, entry_general, take_*, or emit_general")
    text: str
    cost: int = Field(description="AST nodes")
    pass_estimate: float
    evaluations: int | None = None
    measured_pass: float | None = None


class NodeEstimate(BaseModel):
    input_rate: float = Field(description="Num_j: events or (partial match, event) pairs per second")
    pass_probability: float
    cost_per_input: float = Field(description="C_j in AST-node evaluations (004, formula 9)")
    cost: float = Field(description="Num_j * C_j per second (004, formula 10)")
    input: float | None = Field(None, description="Predicted count over the given events")
    output: float | None = None


class NodeMeasured(BaseModel):
    input: int
    output: int
    pass_probability: float | None = None


class ExplainNode(BaseModel):
    slot: int
    var: str
    types: list[str]
    kleene: bool
    conjuncts: list[ExplainConjunct] = Field(description="In evaluation order")
    negations: list[str]
    estimate: NodeEstimate
    measured: NodeMeasured | None = None


class ExplainPlan(BaseModel):
    index: int
    components: list[str]
    nodes: list[ExplainNode]
    total_cost: float
    tree: str | None = Field(None, description="The tree plan's shape, e.g. (a (b c)), when plan_kind is tree")


class ExplainStream(BaseModel):
    rates: dict[str, float]
    keys: int
    duration_s: float | None = None
    source: str = Field(description="events, rates or default")


class TrialCandidate(BaseModel):
    name: str = Field(description="nfa/declared, nfa/cost or tree")
    plan_kind: str
    order: str = Field(description="declared (WHERE order) or cost (ascending cost / (1 - p))")
    tree: str | None = None
    runs: int
    cpu_s: float = Field(description="CPU seconds of the best run over the slice")
    events_per_s: float | None = None
    matches: int


class PlanTrial(BaseModel):
    """Candidate plans measured over an archive slice (``using_archive``)."""

    model_config = ConfigDict(populate_by_name=True)

    from_: str = Field(alias="from")
    to: str
    events: int = Field(description="Archived events of the query's types in the slice")
    keys: int = Field(description="Partition keys seen in the slice")
    estimates: dict[str, float] = Field(description="Pass probability per conjunct, measured over the slice")
    rates: dict[str, float] = Field(description="Events per second per type and partition key over the slice")
    candidates: list[TrialCandidate]
    chosen: str | None = Field(description="The candidate with the least measured CPU time")


class ExplainResult(BaseModel):
    """The plans of a live query with the cost model's estimates (and measured counts with events)."""

    name: str | None = None
    strategy: str
    plan_kind: str = Field("nfa", description="nfa or tree (the PLAN clause)")
    window_us: int | None = None
    stream: ExplainStream
    plans: list[ExplainPlan]
    measured_matches: int | None = None
    trial: PlanTrial | None = Field(None, description="With using_archive: the candidate plans measured there")
