"""The oracle against hand-computed cases of docs/semantics.md and the published peer benchmark counts.

If these fail, the property test against the matcher means nothing.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.events import MICROS_PER_S
from tests.engine.oracle import enumerate_matches, expand
from tests.engine.patterns import (
    all_,
    and_,
    any_,
    arith,
    bench_events,
    cmp,
    equiv,
    neg,
    not_,
    or_,
    plus,
    query,
    ref,
    secs,
    seq,
    single,
    star,
    stream,
)

SEED_STREAM = "a1 a2 b1 b2 a3 b3 c1 c2"


def count(q, events, strategy=None) -> int:
    return len(enumerate_matches(q, events, strategy))


def keys(q, events, strategy=None) -> set:
    """Matches as sorted tuples of (var, ids) for readable assertions."""
    return {tuple(sorted(k)) for k in enumerate_matches(q, events, strategy)}


def ids(**groups) -> tuple:
    return tuple(sorted((v, tuple(i) if isinstance(i, (list, tuple)) else (i,)) for v, i in groups.items()))


# --------------------------------------------------------------------------- the seed example


def test_seed_example_single_b_gives_14_matches():
    assert count(query(seq(single("A", "a"), single("B", "b"), single("C", "c"))), stream(SEED_STREAM)) == 14


def test_seed_example_kleene_plus_b_gives_30_matches():
    assert count(query(seq(single("A", "a"), plus("B", "b"), single("C", "c"))), stream(SEED_STREAM)) == 30


def test_kleene_star_adds_the_plan_without_the_component():
    # 30 with B+ plus the 6 (a, c) pairs of the plan that skips b
    assert count(query(seq(single("A", "a"), star("B", "b"), single("C", "c"))), stream(SEED_STREAM)) == 36


def test_match_identity_lists_every_kleene_element():
    q = query(seq(single("A", "a"), plus("B", "b"), single("C", "c")))
    got = keys(q, stream("a1 b1 b2 c1"))
    assert got == {ids(a=1, b=[2], c=4), ids(a=1, b=[3], c=4), ids(a=1, b=[2, 3], c=4)}


# --------------------------------------------------------------------------- plans


def test_expansion_of_and_or_star():
    a, b, c = single("A", "a"), single("B", "b"), single("C", "c")
    assert len(expand(and_(a, b, c))) == 6
    assert len(expand(seq(a, or_(b, c)))) == 2
    assert len(expand(seq(star("A", "a"), star("B", "b")))) == 4
    assert len(expand(and_(seq(a, b), c))) == 3  # c before, between, after a-b


def test_or_takes_either_branch_and_ignores_conjuncts_of_the_other():
    q = query(seq(single("A", "a"), or_(single("B", "b"), single("C", "c"))))
    assert keys(q, stream("a1 b1 c1")) == {ids(a=1, b=2), ids(a=1, c=3)}
    q2 = query(q.pattern, cmp(">", ref("b"), 100))
    assert keys(q2, stream("a1 b1 c1")) == {ids(a=1, c=3)}


def test_and_matches_in_any_order():
    q = query(and_(single("A", "a"), single("B", "b")))
    assert keys(q, stream("a1 b1 a2")) == {ids(a=1, b=2), ids(a=3, b=2)}


def test_and_of_sequences_keeps_each_part_in_order():
    q = query(and_(seq(single("A", "a"), single("B", "b")), single("C", "c")))
    # a b c, a c b, c a b are interleavings; b a is not
    assert count(q, stream("c1 a1 c2 b1 c3")) == 3
    assert count(q, stream("b1 a1 c1")) == 0


def test_star_alone_after_a_single():
    q = query(seq(single("A", "a"), star("B", "b")))
    assert keys(q, stream("a1 b1 b2")) == {ids(a=1), ids(a=1, b=[2]), ids(a=1, b=[3]), ids(a=1, b=[2, 3])}


def test_any_type_alternative():
    q = query(seq(single("AB", "v"), single("C", "c")), cmp("=", ref("v", "type"), "B"))
    assert keys(q, stream("a1 b1 c1")) == {ids(v=2, c=3)}


# --------------------------------------------------------------------------- window, ties


def test_window_is_inclusive():
    q = query(seq(single("A", "a"), single("B", "b"), single("C", "c")), within_s=2)
    assert count(q, stream("a1 b1 c1")) == 1  # c.ts - a.ts == 2 s
    q2 = query(q.pattern, within_us=2 * MICROS_PER_S - 1)
    assert count(q2, stream("a1 b1 c1")) == 0


def test_equal_timestamps_are_ordered_by_id():
    q = query(seq(single("A", "a"), single("B", "b")))
    assert count(q, stream("a1@0 b1@0")) == 1
    assert count(q, stream("b1@0 a1@0")) == 0


# --------------------------------------------------------------------------- WHERE


KLEENE = seq(single("A", "a"), plus("B", "b"), single("C", "c"))
# x of b1, b2, b3 = 1, 2, 1
KLEENE_STREAM: dict[str, dict] = dict(a1={"x": 1}, b1={"x": 1}, b2={"x": 2}, b3={"x": 1}, c1={"x": 0})


def kleene_count(where) -> int:
    return count(query(KLEENE, where), stream("a1 b1 b2 b3 c1", KLEENE_STREAM))


def test_iterative_condition_b_i_against_b_i_minus_1_starts_at_i_2():
    # strictly increasing subsequences of x = 1, 2, 1: {b1} {b2} {b3} {b1 b2}
    assert kleene_count(cmp(">", ref("b", "x", "i"), ref("b", "x", "i-1"))) == 4


def test_iterative_condition_b_i_alone_holds_for_every_element():
    assert kleene_count(cmp(">=", ref("b", "x", "i"), 2)) == 1  # {b2}
    assert kleene_count(cmp("<=", ref("b", "x", "i"), ref("a"))) == 3  # subsets of {b1, b3}


def test_first_and_last_element():
    # first and last x == 1: {b1} {b3} {b1 b3} {b1 b2 b3}
    assert kleene_count(all_(cmp("=", ref("b", "x", "1"), 1), cmp("=", ref("b", "x", "last"), 1))) == 4


def test_b_k_beyond_the_length_makes_the_conjunct_false_even_under_not():
    assert kleene_count(cmp(">=", ref("b", "x", "3"), 0)) == 1  # only {b1 b2 b3}
    assert kleene_count(not_(cmp(">", ref("b", "x", "3"), 5))) == 1


def test_missing_attribute_comparison_is_false_and_its_negation_true():
    q = query(seq(single("A", "a"), single("B", "b")), cmp(">", ref("a", "y"), 1))
    assert count(q, stream("a1 b1")) == 0
    assert count(query(q.pattern, cmp("!=", ref("a", "y"), 1)), stream("a1 b1")) == 0
    assert count(query(q.pattern, not_(cmp(">", ref("a", "y"), 1))), stream("a1 b1")) == 1


def test_division_by_zero_makes_the_comparison_false():
    pat = seq(single("A", "a"), single("B", "b"))
    s = stream("a1 b1", a1={"x": 3}, b1={"x": 0})
    assert count(query(pat, cmp("<", arith("/", ref("a"), ref("b")), 1)), s) == 0
    assert count(query(pat, cmp(">", arith("/", ref("a"), ref("b")), 1)), s) == 0
    assert count(query(pat, not_(cmp(">", arith("/", ref("a"), ref("b")), 1))), s) == 1
    s2 = stream("a1 b1", a1={"x": 3}, b1={"x": 2})
    assert count(query(pat, cmp("=", arith("/", ref("a"), ref("b")), 1.5)), s2) == 1  # true division


def test_string_against_number_is_false_except_not_equal():
    pat = seq(single("A", "a"), single("B", "b"))
    s = stream("a1 b1", a1={"x": 3})
    for op, expected in (("=", 0), ("<", 0), (">=", 0), ("!=", 1)):
        assert count(query(pat, cmp(op, ref("a"), "3")), s) == expected, op


def test_timestamp_difference_against_a_duration():
    pat = seq(single("A", "a"), single("B", "b"))
    s = stream("a1 a2 b1")  # ts 0, 1, 2 s
    where = cmp("<=", arith("-", ref("b", "ts"), ref("a", "ts")), secs(1))
    assert keys(query(pat, where), s) == {ids(a=2, b=3)}


def test_or_and_not_inside_a_conjunct():
    pat = seq(single("A", "a"), single("B", "b"))
    s = stream("a1 a2 b1", a1={"x": 1}, a2={"x": 4}, b1={"x": 2})
    where = any_(cmp("<", ref("a"), 2), cmp(">", ref("a"), 3))
    assert count(query(pat, where), s) == 2
    assert count(query(pat, not_(where)), s) == 0


def test_equivalence_attribute_acts_as_a_partition():
    pat = seq(single("A", "a"), single("B", "b"))
    s = stream("a1 b1 b2", a1={"k": 0}, b1={"k": 1}, b2={"k": 0})
    assert keys(query(pat, equiv("k")), s) == {ids(a=1, b=3)}


def test_equivalence_does_not_change_the_partition_of_partition_contiguity():
    pat = seq(single("A", "a"), single("B", "b"))
    s = stream("a1 b1 b2", a1={"k": 0}, b1={"k": 1}, b2={"k": 0})
    assert count(query(pat, equiv("k"), strategy="partition_contiguity"), s) == 0  # b1 is in between
    assert count(query(pat, equiv("k"), partition_by=("k",), strategy="partition_contiguity"), s) == 1


def test_equivalence_also_restricts_the_negated_events():
    pat = seq(single("A", "a"), neg("C", "n"), single("B", "b"))
    s = stream("a1 c1 b1", a1={"k": 0}, c1={"k": 1}, b1={"k": 0})
    assert count(query(pat, equiv("k")), s) == 1
    assert count(query(pat), s) == 0


# --------------------------------------------------------------------------- negation


def test_middle_negation():
    q = query(seq(single("A", "a"), neg("B", "n"), single("C", "c")))
    assert keys(q, stream("a1 b1 c1 a2 c2")) == {ids(a=4, c=5)}


def test_negation_conjuncts_choose_the_negating_events():
    pat = seq(single("A", "a"), neg("B", "n"), single("C", "c"))
    s = stream("a1 b1 c1 a2 c2", b1={"x": 1})
    assert count(query(pat, cmp(">", ref("n"), 3)), s) == 3  # b1 does not negate
    assert count(query(pat, cmp("<", ref("n"), 3)), s) == 1


def test_negation_only_looks_at_the_same_partition():
    q = query(seq(single("A", "a"), neg("B", "n"), single("C", "c")), partition_by=("k",))
    s = stream("a1 b1 c1", a1={"k": 0}, b1={"k": 1}, c1={"k": 0})
    assert count(q, s) == 1


def test_negation_after_a_kleene_component_starts_after_its_last_element():
    q = query(seq(single("A", "a"), plus("B", "b"), neg("C", "n"), single("D", "d")))
    # b = {b1}: c1 lies between b1 and d1; b = {b2} or {b1 b2}: nothing between
    assert count(q, stream("a1 b1 c1 b2 d1")) == 2


def test_trailing_negation_checks_up_to_first_ts_plus_window():
    pat = seq(single("A", "a"), single("B", "b"), neg("C", "n"))
    assert count(query(pat, within_s=2), stream("a1@0 b1@1 c1@2")) == 0  # c1 at the deadline negates
    assert count(query(pat, within_s=2), stream("a1@0 b1@1 c1@2.5")) == 1  # c1 after the deadline
    assert count(query(pat, within_s=2), stream("a1@0 c1@0.5 b1@1")) == 1  # c1 before b1


def test_plan_starting_with_a_negation_is_dropped():
    # SEQ(B* b[], !C n, D d): the plan without b starts with the negation
    q = query(seq(star("B", "b"), neg("C", "n"), single("D", "d")))
    assert keys(q, stream("d1 b1 d2")) == {ids(b=2, d=3)}


# --------------------------------------------------------------------------- contiguity


def test_strict_contiguity_needs_consecutive_query_stream_events():
    q = query(seq(single("A", "a"), single("B", "b")), strategy="strict_contiguity")
    assert keys(q, stream("a1 a2 b1")) == {ids(a=2, b=3)}
    assert count(q, stream("a1 d1 b1")) == 1  # D is not in the query stream
    q_d = query(seq(single("A", "a"), neg("D", "n"), single("B", "b")), strategy="strict_contiguity")
    assert count(q_d, stream("a1 d1 b1")) == 0


def test_strict_contiguity_across_partitions():
    pat = seq(single("A", "a"), single("B", "b"))
    s = stream("a1 a2 b1", a1={"k": 0}, a2={"k": 1}, b1={"k": 0})
    assert count(query(pat, partition_by=("k",), strategy="strict_contiguity"), s) == 0
    assert keys(query(pat, partition_by=("k",), strategy="partition_contiguity"), s) == {ids(a=1, b=3)}


def test_strict_contiguity_with_kleene():
    q = query(seq(single("A", "a"), plus("B", "b"), single("C", "c")), strategy="strict_contiguity")
    assert keys(q, stream("a1 b1 b2 c1")) == {ids(a=1, b=[2, 3], c=4)}


def test_contiguity_keeps_trailing_negation():
    pat = seq(single("A", "a"), single("B", "b"), neg("C", "n"))
    q = query(pat, within_s=5, strategy="strict_contiguity")
    assert count(q, stream("a1 b1 a2 c1")) == 0
    assert count(q, stream("a1 b1 a2")) == 1


# --------------------------------------------------------------------------- skip_till_next_match

P1 = seq(single("A", "a"), single("B", "b"), single("C", "c"))
P2 = seq(single("A", "a"), plus("B", "b"), single("C", "c"))
P3 = seq(single("A", "a"), neg("B", "b"), single("C", "c"))
P4_WHERE = cmp("<", ref("b", "price"), ref("a", "price"))
NEXT = "skip_till_next_match"


def test_next_match_p1_first_b_then_first_c():
    got = keys(query(P1, strategy=NEXT), stream(SEED_STREAM))
    assert got == {ids(a=1, b=3, c=7), ids(a=2, b=3, c=7), ids(a=5, b=6, c=7)}


def test_next_match_p2_takes_every_b_up_to_the_first_c():
    got = keys(query(P2, strategy=NEXT), stream(SEED_STREAM))
    assert got == {ids(a=1, b=[3, 4, 6], c=7), ids(a=2, b=[3, 4, 6], c=7), ids(a=5, b=[6], c=7)}


def test_next_match_p3_run_dies_on_a_b_before_the_first_c():
    assert count(query(P3, strategy=NEXT), stream(SEED_STREAM)) == 0
    assert keys(query(P3, strategy=NEXT), stream("a1 c1 b1 a2 c2 c3")) == {ids(a=1, c=2), ids(a=4, c=5)}


def test_next_match_p4_skips_bs_that_fail_the_predicate():
    s = stream("a1 b1 b2 c1 c2", a1={"price": 10}, b1={"price": 12}, b2={"price": 8})
    assert keys(query(P1, P4_WHERE, strategy=NEXT), s) == {ids(a=1, b=3, c=4)}


def test_next_match_branches_when_take_and_proceed_both_apply():
    q = query(seq(single("A", "a"), plus("B", "b"), single("B", "c")), strategy=NEXT)
    # b1: proceed into b; b2: take (b=[b1 b2]) and proceed (c=b2, emits); b3: take / proceed again
    assert keys(q, stream("a1 b1 b2 b3")) == {
        ids(a=1, b=[2], c=3),
        ids(a=1, b=[2, 3], c=4),
    }


def test_next_match_final_kleene_emits_on_every_take():
    q = query(seq(single("A", "a"), plus("B", "b")), strategy=NEXT)
    assert keys(q, stream("a1 b1 c1 b2")) == {ids(a=1, b=[2]), ids(a=1, b=[2, 4])}


def test_next_match_window_kills_runs():
    q = query(P1, strategy=NEXT, within_s=2)
    assert count(q, stream("a1@0 b1@1 c1@3 b2@3.5 c2@4")) == 0
    assert count(q, stream("a1@0 b1@1 c1@2")) == 1


def test_next_match_kleene_condition_filters_takes():
    q = query(P2, cmp(">", ref("b", "x", "i"), ref("b", "x", "i-1")), strategy=NEXT)
    s = stream("a1 b1 b2 b3 c1", b1={"x": 1}, b2={"x": 0}, b3={"x": 2})
    assert keys(q, s) == {ids(a=1, b=[2, 4], c=5)}


def test_next_match_b_last_is_checked_when_leaving_the_kleene():
    q = query(P2, cmp(">", ref("b", "x", "last"), 1), strategy=NEXT)
    s = stream("a1 b1 b2 c1 b3 c2", b1={"x": 2}, b2={"x": 0}, b3={"x": 5})
    # at c1 b[last] = b2 (x 0): proceed fails, c1 skipped; b3 taken; c2 proceeds
    assert keys(q, s) == {ids(a=1, b=[2, 3, 5], c=6)}


# --------------------------------------------------------------------------- the peer benchmark counts


@pytest.fixture(scope="module")
def bench10k():
    return bench_events(10_000)


BENCH_CASES = [
    ("P1 any 1 s", query(P1, partition_by=("key",), within_s=1), 9_899),
    ("P3 any 1 s", query(P3, partition_by=("key",), within_s=1), 3_046),
    ("P4 any 1 s", query(P1, P4_WHERE, partition_by=("key",), within_s=1), 5_036),
    ("P2 any 0.5 s", query(P2, partition_by=("key",), within_s=0.5), 4_179),
    ("P2 any 1 s", query(P2, partition_by=("key",), within_s=1), 32_882),
    ("P1 next 1 s", query(P1, partition_by=("key",), within_s=1, strategy=NEXT), 2_259),
    ("P2 next 1 s", query(P2, partition_by=("key",), within_s=1, strategy=NEXT), 2_259),
    ("P3 next 1 s", query(P3, partition_by=("key",), within_s=1, strategy=NEXT), 1_625),
    ("P4 next 1 s", query(P1, P4_WHERE, partition_by=("key",), within_s=1, strategy=NEXT), 1_487),
]


GEN_STREAM = Path(__file__).resolve().parents[2] / "bench" / "gen_stream.py"  # verbatim copy of the shared one


@pytest.mark.skipif(not GEN_STREAM.exists(), reason="bench/gen_stream.py not available")
def test_bench_events_equal_gen_stream_output():
    out = subprocess.run(
        [
            sys.executable,
            str(GEN_STREAM),
            "--n",
            "2000",
            "--types",
            "3",
            "--keys",
            "100",
            "--rate",
            "1000",
            "--seed",
            "42",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()[1:]
    rows = [line.split(",") for line in out]
    expected = [
        (k + 1, t, round(float(ts) * 1000) * 1000, int(key), float(p)) for k, (t, key, ts, p) in enumerate(rows)
    ]
    got = [(e.id, e.type, e.ts, e.attrs["key"], e.attrs["price"]) for e in bench_events(2000)]
    assert got == expected


@pytest.mark.parametrize("name,q,expected", BENCH_CASES, ids=[c[0] for c in BENCH_CASES])
def test_oracle_reproduces_published_bench_counts_10k(bench10k, name, q, expected):
    t0 = time.perf_counter()
    assert count(q, bench10k) == expected
    assert time.perf_counter() - t0 < 60


@pytest.mark.slow
def test_oracle_reproduces_published_p1_5s_count_10k(bench10k):
    assert count(query(P1, partition_by=("key",), within_s=5), bench10k) == 188_805
