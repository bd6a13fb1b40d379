"""The runtime lock that applies deferred statement changes (service.live.applying_lock, issue 14)."""
from __future__ import annotations

import threading

from service.live.applying_lock import ApplyingLock


def test_a_change_deferred_while_the_lock_is_held_runs_in_the_holder_before_it_releases() -> None:
    lock = ApplyingLock()
    ran: list[tuple[str, str]] = []
    held, go = threading.Event(), threading.Event()

    def batch() -> None:
        with lock:
            held.set()
            go.wait(10)
            ran.append(("batch", threading.current_thread().name))

    t = threading.Thread(target=batch, name="ingest")
    t.start()
    assert held.wait(10)
    lock.defer(lambda: ran.append(("change", threading.current_thread().name)))  # returns at once
    assert ran == [] and lock.pending == 1
    go.set()
    t.join(10)
    assert ran == [("batch", "ingest"), ("change", "ingest")]  # after the batch, before anyone else
    assert lock.pending == 0


def test_a_change_deferred_on_a_free_lock_runs_at_once_in_order_and_reentrantly() -> None:
    lock = ApplyingLock()
    ran: list[int] = []

    def change(i: int) -> None:
        with lock:  # a deferred change may take the lock again (start_query does)
            ran.append(i)

    lock.defer(lambda: change(1))
    lock.defer(lambda: change(2))
    assert ran == [1, 2]
    with lock:
        lock.defer(lambda: change(3))  # the holder's own deferral: applied when it releases
        assert ran == [1, 2]
        with lock:
            pass  # an inner release does not apply it
        assert ran == [1, 2]
    assert ran == [1, 2, 3]


def test_a_failing_change_is_logged_and_the_rest_still_run(caplog) -> None:  # type: ignore[no-untyped-def]
    lock = ApplyingLock()
    ran: list[int] = []
    with lock:
        lock.defer(lambda: 1 / 0)  # type: ignore[func-returns-value]
        lock.defer(lambda: ran.append(2))
    assert ran == [2]
    assert "deferred statement change failed" in caplog.text


def test_no_deferred_change_is_lost_under_contention() -> None:
    lock = ApplyingLock()
    done: list[int] = []
    stop = threading.Event()

    def holder() -> None:
        while not stop.is_set():
            with lock:
                pass

    threads = [threading.Thread(target=holder) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(2_000):
        lock.defer(lambda i=i: done.append(i))  # type: ignore[misc]
    stop.set()
    for t in threads:
        t.join(10)
    assert lock.pending == 0
    assert done == list(range(2_000))


def test_a_change_deferred_between_the_holders_last_drain_and_its_release_still_runs() -> None:
    """The window the re-check after releasing closes: the deferrer finds the lock taken, the holder has
    already drained."""
    ran: list[str] = []

    class Racy(ApplyingLock):
        hook = False

        def drain(self) -> None:
            super().drain()
            if self.hook:
                self.hook = False
                t = threading.Thread(target=lambda: self.defer(lambda: ran.append("change")))
                t.start()
                t.join(10)  # its try of the lock failed: we hold it
                assert self.pending == 1

    lock = Racy()
    with lock:
        lock.hook = True
    assert ran == ["change"]
    assert lock.pending == 0
