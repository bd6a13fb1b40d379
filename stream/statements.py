"""Which statements ``lace stream`` runs on Spark, and why the others are refused up front.

It runs one live-only pattern statement (PATTERN ... WHERE ... PARTITION BY ... WITHIN ..., any RETURN, every
strategy but strict contiguity), keyed by its PARTITION BY (without one, every event has the same key: one
state-store key, no parallelism), or one live-and-archived statement (``LIVE ... ARCHIVED ... LOOKBACK ... JOIN``;
its live pattern as a live-only one, the archived side a Spark join per micro-batch, :mod:`stream.job`), over an
event file or the archive. Refused, with the reason :func:`refusal` gives:

* a live-and-archived statement with ``EMIT INTO`` (a rule graph, as below);
* INTERVAL derivation, FILTER, AGGREGATE, ``EMIT INTO`` and several statements in one run (layered rules, 003):
  a rule graph routes derived events between statements, one ordered stream, not one keyed stream per statement;
* plug-in operators (issue 16): an operator's state and derived events span keys and are not picklable per key;
* ``STRATEGY strict_contiguity``: contiguity over the whole stream (an event of any key breaks a run), which no
  per-key state can see.
"""
from __future__ import annotations

from typing import Any

from engine.compiler import CompiledQuery


def refusal(trees: list[Any], compiled: CompiledQuery | None = None) -> str | None:
    """Why the parsed statements ``trees`` (from :func:`engine.lql.parser.parse_script`) cannot run on Spark, or
    None. ``compiled``: the single pattern statement compiled (of a live-and-archived statement: its live pattern),
    for the checks that need its plans."""
    from engine.lql import ast

    if len(trees) != 1:
        return "several statements form a rule graph (layered rules), which runs in one ordered stream"
    tree = trees[0]
    if isinstance(tree, ast.LiveArchivedQuery):
        if tree.emit_into is not None:
            return "EMIT INTO derives events for other statements (a rule graph)"
        if compiled is not None:
            return _pattern_refusal(compiled)
        return None
    if isinstance(tree, ast.IntervalRule):
        return "INTERVAL derivation makes interval events for other statements (a rule graph)"
    if isinstance(tree, ast.FilterRule | ast.AggregateQuery):
        return "FILTER and AGGREGATE statements are layered rules (a rule graph)"
    if not isinstance(tree, ast.PatternQuery):
        return f"a {type(tree).__name__} is not a pattern statement"
    if tree.emit_into is not None:
        return "EMIT INTO derives events for other statements (a rule graph)"
    return None if compiled is None else _pattern_refusal(compiled)


def _pattern_refusal(compiled: CompiledQuery) -> str | None:
    """Why a compiled pattern (live-only, or a live side) cannot run per key, or None."""
    if compiled.operators:
        return "plug-in operators keep state across keys and derive events (not per-key state)"
    if compiled.strategy == "strict_contiguity":
        return "strict contiguity spans the whole stream (an event of any key breaks a run), not one key"
    return None
