"""The group commit of live-and-archived results (:meth:`service.live.results.Results.submit`, issue 25): the
submissions waiting while a transaction commits share the next one; one that cannot commit fails alone. Real
SQLite and PostgreSQL (migrated schema), real threads."""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.exc import IntegrityError

from cli.service_process import Database
from service.core.metrics import Metrics
from service.db.migrate import upgrade
from service.db.models import AlertRow, QueryRow
from service.db.session import make_engine, make_session_factory, transaction
from service.live.la_process import JsonMatch
from service.live.results import Results


def match(query_id: int, n: int) -> JsonMatch:
    return JsonMatch({"events": {"a": [query_id * 1_000_000 + n]}, "fields": {"n": n}, "start": n, "end": n + 1})


class Setup:
    """A migrated database with queries 1 and 2 (query 99 runs but has no row: its alerts cannot commit), a
    :class:`Results` over it, and a hook that holds the first commit until :meth:`release` (so submissions pile
    up behind a transaction, as they do when ten queries answer at once)."""

    def __init__(self, db: Database) -> None:
        upgrade(db.url)
        self.engine = make_engine(db.url)
        sessions = make_session_factory(self.engine)
        with transaction(sessions) as s:
            for qid in (1, 2):
                s.add(QueryRow(id=qid, name=f"q{qid}", text="-", state="active", types=["t"], window_us=None,
                               version=1, active_since_us=0, created_at_us=0, updated_at_us=0))
        self.commits = 0
        self.hold = threading.Event()
        self.held = threading.Event()

        @event.listens_for(self.engine, "commit")
        def _count(_conn: Any) -> None:
            self.commits += 1
            if not self.held.is_set():
                self.held.set()
                assert self.hold.wait(30)

        queries = {q: SimpleNamespace(name=f"q{q}", version=1) for q in (1, 2, 99)}
        self.results = Results(sessions=sessions, metrics=Metrics(), queries=queries, lock=threading.RLock())
        self.sessions = sessions

    def first(self) -> Future[None]:
        """A first submission, whose commit is held; returns once the committer is inside it."""
        fut = self.results.submit(1, [match(1, 0)])
        assert self.held.wait(30)
        return fut

    def alerts(self) -> dict[int, int]:
        with self.sessions() as s:
            return dict(s.execute(select(AlertRow.query_id, func.count()).group_by(AlertRow.query_id)).all())


def test_submissions_waiting_behind_a_commit_share_one_transaction(fresh_db: Database) -> None:
    """200 submissions from 8 threads while a commit is held: one more transaction takes them all; each match is
    one alert (a match submitted twice, by two submissions of one group, too); every future is done."""
    s = Setup(fresh_db)
    first = s.first()
    futures: list[Future[None]] = []
    lock = threading.Lock()

    def submit(worker: int) -> None:
        for k in range(25):
            qid = 1 + (worker % 2)
            n = 1 + worker * 100 + k
            fut = s.results.submit(qid, [match(qid, n), match(qid, n + 50)])
            with lock:
                futures.append(fut)

    threads = [threading.Thread(target=submit, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    again = s.results.submit(1, [match(1, 1)])  # worker 0's first match, in the same group
    time.sleep(0.2)
    assert s.commits == 1  # only the held one: the rest wait
    s.hold.set()
    for fut in [first, *futures, again]:
        assert fut.result(timeout=30) is None
    assert s.commits == 2
    # queries 1 and 2: workers 0,2,4,6 and 1,3,5,7, 25 submissions of 2 distinct matches each; plus the first
    assert s.alerts() == {1: 1 + 4 * 25 * 2, 2: 4 * 25 * 2}


def test_a_submission_that_cannot_commit_fails_alone(fresh_db: Database) -> None:
    """Query 99 has no row (deleted in the database, still running here): its submission fails with the
    database's error; the submissions of the same group are committed."""
    s = Setup(fresh_db)
    first = s.first()
    ok = [s.results.submit(2, [match(2, n)]) for n in range(5)]
    bad = s.results.submit(99, [match(99, 1)])
    ok.append(s.results.submit(1, [match(1, 7)]))
    s.hold.set()
    for fut in [first, *ok]:
        assert fut.result(timeout=30) is None
    with pytest.raises(IntegrityError):
        bad.result(timeout=30)
    assert s.alerts() == {1: 2, 2: 5}
