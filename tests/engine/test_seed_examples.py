"""The seed example (a1 a2 b1 b2 a3 b3 c1 c2) through the real matcher: 14 matches, 30 with ``B+ b[]``."""

from __future__ import annotations

import pytest

from tests.engine.patterns import stream

compiler = pytest.importorskip("engine.compiler")
matcher = pytest.importorskip("engine.matcher")

SEED_STREAM = "a1 a2 b1 b2 a3 b3 c1 c2"


def matches(text: str, storage: str) -> list:
    m = matcher.Matcher(compiler.compile_query(text), storage=storage)
    out = []
    for e in stream(SEED_STREAM):
        out += m.push(e)
    return out + m.flush()


@pytest.mark.parametrize("storage", ["chain", "runs"])
def test_seed_example_seq_a_b_c_has_14_matches(storage: str) -> None:
    out = matches("PATTERN SEQ(A a, B b, C c)", storage)
    assert len(out) == 14
    assert len({m.key() for m in out}) == 14


@pytest.mark.parametrize("storage", ["chain", "runs"])
def test_seed_example_with_kleene_plus_b_has_30_matches(storage: str) -> None:
    out = matches("PATTERN SEQ(A a, B+ b[], C c)", storage)
    assert len(out) == 30
    assert len({m.key() for m in out}) == 30
    assert frozenset({("a", (1,)), ("b", (3, 4, 6)), ("c", (8,))}) in {m.key() for m in out}
