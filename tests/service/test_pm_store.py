"""The SQL partial-match store on real SQLite and PostgreSQL: same contract, same results."""
from __future__ import annotations

import uuid

import pytest

from engine.compiler import compile_query
from engine.matcher import Matcher
from engine.pm.store import SpilledBatch
from service.db.pm_store import SqlPartialMatchStore
from tests.postgres import fresh_schema


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = SqlPartialMatchStore(f"sqlite:///{tmp_path / 'pms.sqlite'}")
        yield s
        s.close()
        return
    # a schema of its own: the public schema of `test` may hold another checkout's migrations
    with fresh_schema("lace_pms_") as url:
        s = SqlPartialMatchStore(url)
        yield s
        s.close()


@pytest.mark.integration
def test_write_take_expire_clear_round_trip(store):
    q = f"q-{uuid.uuid4()}"
    store.write([
        SpilledBatch(q, 0, "1", 0, 2, 100, b'{"v":1}'),
        SpilledBatch(q, 0, "1", 0, 1, 300, b"xy"),
        SpilledBatch(q, 0, "2", 1, 5, 200, b"abc"),
    ])
    gone = store.delete_expired(q, 150)
    assert [(b.key, b.count, b.nbytes) for b in gone] == [("1", 2, 7)]
    taken = store.take(q, 0, "1", 0)
    assert [(b.count, b.max_ts, b.payload) for b in taken] == [(1, 300, b"xy")]
    assert store.take(q, 0, "1", 0) == []  # taking deletes
    store.clear(q)
    assert store.take(q, 0, "2", 1) == []


@pytest.mark.integration
@pytest.mark.parametrize("storage", ["chain", "runs"])
def test_spilling_to_sql_changes_no_result(store, bench_10k, storage):
    q = compile_query("PATTERN SEQ(A a, B+ b[], C c) WHERE b[i].price > b[i-1].price PARTITION BY key WITHIN 1 s")
    events = bench_10k[:2000]
    plain = Matcher(q, storage=storage)
    expected = [m.key() for e in events for m in plain.push(e)] + [m.key() for m in plain.flush()]
    m = Matcher(q, storage=storage, pm_capacity=10, pm_policy="tpm", pm_store=store)
    got = [x.key() for e in events for x in m.push(e)] + [x.key() for x in m.flush()]
    assert sorted(map(sorted, got)) == sorted(map(sorted, expected))
    assert m.stats()["misses"] > 0


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("storage", ["chain", "runs"])
def test_spilling_to_sql_gives_the_published_counts(store, bench_10k, storage):
    q = compile_query("PATTERN SEQ(A a, B+ b[], C c) PARTITION BY key WITHIN 500 ms")
    m = Matcher(q, storage=storage, pm_capacity=20, pm_policy="stpm", pm_store=store)
    n = sum(len(m.push(e)) for e in bench_10k) + len(m.flush())
    assert n == 4_179
    s = m.stats()
    assert s["spilled"] > 0 and s["misses"] > 0 and s["reloaded"] > 0
