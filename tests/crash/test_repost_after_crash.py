"""A request posted again after a SIGKILL that came after its write-ahead log and before its answer: what it took
is acknowledged as a duplicate, what a FILTER dropped is judged as it was the first time.

The FILTER case is the crash suite's (``FILTER + pattern``, seeds 31 and 32): the restart's last watermark advance,
driven by another type far ahead, made the filter forget the kept event the dropped one duplicates; posted again,
the dropped event was kept and archived, and the next true event was dropped as its duplicate.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.service_process import CLOCK, HARNESS_SETTINGS, ServiceProcess
from tests.service.conftest import make_database

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@contextmanager
def crashed_and_restarted(
    database_kind: str, tmp: Path, types: dict[str, Any], statements: list[str], before: list[dict[str, Any]],
    crashed: list[dict[str, Any]],
) -> Iterator[httpx.Client]:
    """A service with ``types`` (name -> lateness ms) of attributes ``key`` and ``v`` and ``statements``, given
    ``before`` in one request, then ``crashed``, which SIGKILLs it after the write-ahead log; a client of the
    service started again."""
    for db in make_database(database_kind, tmp):
        settings = {**HARNESS_SETTINGS, "crash_at": "ingest.after_wal:2"}
        svc = ServiceProcess(tmp / "data", settings, db=db, own_group=True)
        svc.start()
        try:
            with svc.client() as c:
                for name, lateness_ms in types.items():
                    body = {"name": name, "attributes": {"key": "int", "v": "int"}, "allowed_lateness_ms": lateness_ms}
                    assert c.post("/event-types", json=body).status_code == 201
                for text in statements:
                    assert c.post("/queries", json={"text": text}).status_code == 201, text
                assert c.post("/events", json=before).json()["accepted"] == len(before)
                with pytest.raises(httpx.TransportError):  # the service dies before its answer
                    c.post("/events", json=crashed)
            assert svc.proc is not None and svc.proc.wait(timeout=30) != 0
            svc.stop()
            svc.env.pop("LACE_CRASH_AT")
            svc.start()
            with svc.client() as c:
                yield c
        finally:
            svc.stop()


def test_a_dropped_event_posted_again_after_a_crash_is_dropped_again(database_kind: str, tmp_path: Path) -> None:
    t0 = CLOCK.take()
    kept = {"id": 1, "type": "f", "ts": t0, "attrs": {"key": 1, "v": 20}}
    crashed = [
        {"id": 2, "type": "f", "ts": t0 + 30_000, "attrs": {"key": 1, "v": 20}},  # a duplicate of 1: dropped
        {"id": 3, "type": "g", "ts": t0 + 600_000, "attrs": {"key": 1, "v": 0}},  # another type 10 min ahead
    ]
    statements = [
        "NAME clean FILTER f x DROP DUPLICATE key, v WITHIN 30 s",
        "NAME rise PATTERN SEQ(f a, f b) WHERE b.v > a.v PARTITION BY key WITHIN 5 min",
        "NAME big PATTERN g x WHERE x.v > 100",
    ]
    with crashed_and_restarted(
        database_kind, tmp_path, {"f": 120_000, "g": 120_000}, statements, [kept], crashed
    ) as c:
        again = c.post("/events", json=crashed).json()
        assert again["accepted"] == 0 and again["duplicates"] == [3], again
        assert "duplicate of (key, v) within 30 s" in again["rejections"][0]["reason"], again
        after = {"id": 4, "type": "f", "ts": t0 + 50_000, "attrs": {"key": 1, "v": 20}}  # 50 s after 1: kept
        assert c.post("/events", json=[after]).json()["accepted"] == 1


def test_an_event_no_statement_reads_posted_again_after_a_crash_is_a_duplicate(
    database_kind: str, tmp_path: Path
) -> None:
    """The producer ids the ingest remembers (``LACE_DEDUP_WINDOW``) come back from the archive, of every ingested
    type: the restart's replay reads only the types its statements read, from the earliest position they need, and
    events of the crashed request were taken twice (archived twice)."""
    t0 = CLOCK.take()
    first = [{"id": 1, "type": "unread", "ts": t0, "attrs": {"key": 1, "v": 1}}]
    crashed = [{"id": 2, "type": "unread", "ts": t0 + 1_000, "attrs": {"key": 1, "v": 2}},
               {"id": 3, "type": "read", "ts": t0 + 1_000, "attrs": {"key": 1, "v": 3}}]
    with crashed_and_restarted(
        database_kind, tmp_path, {"read": 0, "unread": 0}, ["NAME hi PATTERN read x WHERE x.v > 100"], first, crashed
    ) as c:
        again = c.post("/events", json=first + crashed).json()
        assert again["accepted"] == 0 and sorted(again["duplicates"]) == [1, 2, 3], again
        changed = c.post("/events", json=[{**first[0], "attrs": {"key": 1, "v": 9}}])
        assert changed.status_code == 409, changed.text
