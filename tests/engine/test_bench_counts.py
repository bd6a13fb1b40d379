"""The published match counts of the peer benchmark (bench/README.md) through the real matcher.

Seed-42 streams of ``gen_stream.py --types 3 --keys 100 --rate 1000``; every pattern is
partitioned by key and its window inclusive. The 100k-event rows are marked slow.
"""

from __future__ import annotations

import pytest

from tests.engine.patterns import bench_events

compiler = pytest.importorskip("engine.compiler")
matcher = pytest.importorskip("engine.matcher")

P1 = "PATTERN SEQ(A a, B b, C c)"
P2 = "PATTERN SEQ(A a, B+ b[], C c)"
P3 = "PATTERN SEQ(A a, !B b, C c)"
P4 = "PATTERN SEQ(A a, B b, C c) WHERE b.price < a.price"


def lql(pattern: str, window: str, strategy: str) -> str:
    return f"{pattern}\nPARTITION BY key\nSTRATEGY {strategy}\nWITHIN {window}"


ANY = "skip_till_any_match"
NEXT = "skip_till_next_match"
# (name, pattern, window, strategy, count on 10k, count on 100k or None)
TABLE = [
    ("P1 any 1 s", P1, "1 s", ANY, 9_899, 101_009),
    ("P1 any 5 s", P1, "5 s", ANY, 188_805, None),
    ("P2 any 0.5 s", P2, "500 ms", ANY, 4_179, 39_848),
    ("P2 any 1 s", P2, "1 s", ANY, 32_882, 279_122),
    ("P3 any 1 s", P3, "1 s", ANY, 3_046, 30_894),
    ("P4 any 1 s", P4, "1 s", ANY, 5_036, 50_003),
    ("P1 next 1 s", P1, "1 s", NEXT, 2_259, 23_362),
    ("P2 next 1 s", P2, "1 s", NEXT, 2_259, 23_362),
    ("P3 next 1 s", P3, "1 s", NEXT, 1_625, 16_568),
    ("P4 next 1 s", P4, "1 s", NEXT, 1_487, 14_947),
]


@pytest.fixture(scope="module")
def stream_10k() -> list:
    return bench_events(10_000)


@pytest.fixture(scope="module")
def stream_100k() -> list:
    return bench_events(100_000)


def count(text: str, events: list, storage: str) -> int:
    m = matcher.Matcher(compiler.compile_query(text), storage=storage)
    n = 0
    keys = set()
    for e in events:
        for match in m.push(e):
            n += 1
            keys.add(match.key())
    for match in m.flush():
        n += 1
        keys.add(match.key())
    assert len(keys) == n, "duplicate matches"
    return n


def _cases_10k():
    for name, pattern, window, strategy, n10k, _ in TABLE:
        for storage in ("chain", "runs") if strategy == ANY else ("runs",):
            marks = [pytest.mark.slow] if name == "P1 any 5 s" else []
            yield pytest.param(lql(pattern, window, strategy), storage, n10k, id=f"{name}-{storage}", marks=marks)


def _cases_100k():
    for name, pattern, window, strategy, _, n100k in TABLE:
        if n100k is not None:
            yield pytest.param(lql(pattern, window, strategy), n100k, id=name)


@pytest.mark.parametrize("text,storage,expected", list(_cases_10k()))
def test_published_count_on_10k_events(stream_10k: list, text: str, storage: str, expected: int) -> None:
    assert count(text, stream_10k, storage) == expected


@pytest.mark.slow
@pytest.mark.parametrize("text,expected", list(_cases_100k()))
def test_published_count_on_100k_events(stream_100k: list, text: str, expected: int) -> None:
    assert count(text, stream_100k, "chain") == expected
