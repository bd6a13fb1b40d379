"""The crash suite in CI (issue 24): a few seeded points of bench/crash.py's harness, on SQLite and PostgreSQL.

Every statement kind runs on one real ``lace serve`` (bench/crash_workload.py: a live pattern, LIVE/ARCHIVED under
SLLAA, OLLAA, LLAA and ALAA, FILTER + pattern, an EMIT INTO chain of two, AGGREGATE tumbling and sliding, INTERVAL
derivation + a query over it, an interval type with Allen relations on the live and the archived side, a FILTER on a
derived type, ``dedup``, ``PLAN tree``, a small ``pm_capacity``; three plan switches and two updates with ``state=warm``
mid-stream), each alerting one with a webhook on a receiver that checks signatures. The fault-free run (SQLite; the same
statements registered in the same order get the same ids on either database, so the same alerts) gives the expected
alerts. Every run ends each ingested type's stream with ``POST /event-types/{name}/end`` after its last batch. Per
database, one run kills the service at a few points in turn (on SQLite two of them among the end calls: a SIGTERM
between two ends, a SIGKILL right after one), restarting it each time on the same data directory and database and
posting again the request that was not acknowledged; every kind's alerts must equal the fault-free run's, by event ids
and fields, each idempotency key with one payload, every type must have ended, and the service must start every time.
``python -m bench.crash`` runs many more points.
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.crash import Fault, Outcome, Run, compare, compare_archives
from bench.crash_workload import KINDS, STATEMENTS, make_stream
from cli.service_process import scratch_database
from tests.service.conftest import make_database

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.integration]

STREAM = make_stream(seed=1)
PLANS = {
    # mid-request (after the WAL append), SIGKILL right after the second update with state=warm, SIGKILL right after
    # the resume of the paused LLAA query, archive requests in flight, SIGKILL 0.4 s after the batch of the 30-day
    # jump is answered (every SLLAA subwindow it closed in flight: issue 43), SIGKILL right after the jump (the
    # batch after it, and the plan switch posted with that batch); SIGTERM between the ends of s and f, SIGKILL right
    # after the end of alarm (iv ends after the restart); the worker processes alone killed 0.7 s after the third
    # batch after the jump (the service restarts them, no service start)
    "sqlite": [
        Fault("ingest.after_wal", 6), Fault("update", 1), Fault("resume", 3), Fault("la.request_submitted", 3),
        Fault("delay", STREAM.jump_batch, 400), Fault("jump", 1), Fault("worker", STREAM.jump_batch + 3, 700),
        Fault("sigterm", len(STREAM.batches) + 1),
        Fault("end", 2),
    ],
    # mid-plan switch (the first switch: PLAN tree running as the NFA, the choice not committed), SIGKILL right after
    # the pause of the OLLAA query (its results due recorded first), mid-delivery (after the 2xx, before the delivered
    # mark), mid-archive flush (Delta committed, WAL not deleted), SIGTERM, SIGKILL 2.3 s after a batch is answered,
    # the worker processes alone killed 1.2 s after the last batch but one
    "postgresql": [
        Fault("plan.switch.before_commit", 1), Fault("pause", 2), Fault("webhook.after_post", 80),
        Fault("archive.flush.before_wal_delete", 3), Fault("sigterm", 15), Fault("delay", 17, 2_300),
        Fault("worker", 19, 1_200),
    ],
}


@pytest.fixture(scope="session")
def fault_free(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    """The fault-free run, once per test session: a module-scoped one ran twice, as the suite runs this module once
    per database kind (``database_kind`` is session-scoped) and the run is the same for both."""
    tmp = tmp_path_factory.mktemp("crash-fault-free")
    with scratch_database("sqlite", tmp) as db:
        return Run(db, tmp / "data", STREAM, []).go()


@pytest.fixture(scope="module")
def faulty(database_kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outcome]:
    tmp = tmp_path_factory.mktemp(f"crash-{database_kind}")
    for db in make_database(database_kind, tmp):
        yield Run(db, tmp / "data", STREAM, PLANS[database_kind]).go()


def test_the_fault_free_run_is_sound(fault_free: Outcome) -> None:
    """Nothing refused, quiet at the end, every stream ended at the first call, every alerting statement alerted, the
    four algorithms agree."""
    assert not fault_free.rejected and not fault_free.not_quiet and not fault_free.unplanned, fault_free
    assert fault_free.ended == dict.fromkeys(STREAM.ends, False), fault_free.ended
    quiet = [s.name for s in STATEMENTS if s.alerts and not fault_free.alerts.get(s.name)]
    assert not quiet, f"statements without an alert: {quiet}"
    la = {name: sorted(fault_free.alerts[name]) for name in ("la_sllaa", "la_ollaa", "la_llaa", "la_alaa")}
    assert all(v == la["la_sllaa"] for v in la.values()), {k: len(v) for k, v in la.items()}


def test_the_service_starts_every_time_and_every_fault_fires(database_kind: str, faulty: Outcome) -> None:
    assert not faulty.failed_starts, faulty.failed_starts
    assert [f.split(" ")[0] for f in faulty.fired] == [str(f) for f in PLANS[database_kind]], faulty.fired
    assert not faulty.unplanned, faulty.unplanned
    assert not faulty.key_conflicts, faulty.key_conflicts
    assert not faulty.not_quiet, f"still busy: {faulty.busy}"
    assert sorted(faulty.ended) == sorted(STREAM.ends), faulty.ended  # every end acknowledged, once or again


@pytest.mark.parametrize("kind", KINDS)
def test_alerts_equal_the_fault_free_run(database_kind: str, kind: str, fault_free: Outcome, faulty: Outcome) -> None:
    diff = compare(fault_free.alerts, faulty.alerts)[kind]
    lost, duplicated, wrong = diff.counts()
    assert not diff, (
        f"{kind} on {database_kind} after {faulty.fired}: {lost} lost, {duplicated} duplicated, {wrong} wrong; "
        f"lost {diff.lost[:3]}; duplicated {diff.duplicated[:3]}; wrong {diff.wrong[:3]}; log {faulty.log}"
    )


def test_the_archive_equals_the_fault_free_run(database_kind: str, fault_free: Outcome, faulty: Outcome) -> None:
    """Every event type's archive table, the ingested and the derived (EMIT INTO) ones, holds the fault-free run's
    events, each once. A SIGKILL after a request's events reached the write-ahead log but before its derived events
    did left those out of the archive for good: the replay derived them again but took them for archived, and the
    re-posted request was a duplicate."""
    diff = compare_archives(fault_free.archived, faulty.archived)
    assert fault_free.archived.get("run"), sorted(fault_free.archived)
    assert not diff, f"on {database_kind} after {faulty.fired}: (missing, twice, unknown) events per type {diff}"
