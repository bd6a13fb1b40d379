"""Partial-match storage: chain vs one run per partial match, the stats counters, bad storage names."""
from __future__ import annotations

import pytest

from engine.compiler import compile_query
from engine.matcher import Matcher
from tests.engine.helpers import STORAGES, labels, matcher, stream

KLEENE = "PATTERN SEQ(A a, B+ b[], C c) WITHIN 1 min"
# 4 a's, 7 b's, 2 c's: every a with every non-empty subset of the b's and either c
OVERLAPPING = " ".join([*(f"a{i}" for i in range(1, 5)), *(f"b{i}" for i in range(5, 12)), "c12", "c13"])
N_MATCHES = 4 * (2**7 - 1) * 2


def run_with_stats(query: str, spec: str, storage: str):
    m = matcher(query, storage=storage)
    out = []
    for e in stream(spec):
        out += m.push(e)
    peak_before_flush = m.stats()
    out += m.flush()
    return labels(out), peak_before_flush, m.stats()


def test_both_storages_find_the_same_matches():
    chain, _, chain_stats = run_with_stats(KLEENE, OVERLAPPING, "chain")
    runs, _, runs_stats = run_with_stats(KLEENE, OVERLAPPING, "runs")
    assert chain == runs
    assert len(chain) == len(set(chain)) == N_MATCHES
    assert chain_stats["emitted"] == runs_stats["emitted"] == N_MATCHES


def test_runs_hold_one_run_per_partial_match():
    _, _, stats = run_with_stats(KLEENE, OVERLAPPING, "runs")
    # before the first C: each a with each subset of the 7 b's (the empty one included)
    assert stats["peak_live"] == 4 * 2**7
    assert stats["copied"] > 0
    assert stats["created"] >= stats["peak_live"]


def test_chain_storage_creates_fewer_partial_matches_and_copies_none():
    _, _, chain = run_with_stats(KLEENE, OVERLAPPING, "chain")
    _, _, runs = run_with_stats(KLEENE, OVERLAPPING, "runs")
    assert chain["copied"] == 0
    assert chain["created"] < runs["created"]
    assert chain["peak_live"] < runs["peak_live"]
    # chains share prefixes: at most one node per stored A or B event
    assert chain["created"] <= 4 + 7


@pytest.mark.parametrize("storage", STORAGES)
def test_counters_after_flush(storage):
    _, before, after = run_with_stats(KLEENE + " PARTITION BY k", OVERLAPPING + " x14 a15{k=1}", storage)
    assert before["events"] == after["events"] == 14
    assert after["ignored"] == 1
    assert before["keys"] == 2
    assert after["live_partial_matches"] == after["live"] == 0
    assert after["keys"] == 0
    assert after["late"] == 0


@pytest.mark.parametrize("strategy", ["skip_till_next_match", "strict_contiguity", "partition_contiguity"])
def test_storage_does_not_matter_for_other_strategies(strategy):
    q = KLEENE + f" STRATEGY {strategy}"
    chain, _, chain_stats = run_with_stats(q, OVERLAPPING, "chain")
    runs, _, runs_stats = run_with_stats(q, OVERLAPPING, "runs")
    assert chain == runs
    assert chain_stats == runs_stats


def test_unknown_storage_is_rejected():
    q = compile_query(KLEENE)
    with pytest.raises(ValueError, match="storage"):
        Matcher(q, storage="heap")  # type: ignore[arg-type]
