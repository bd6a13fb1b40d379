"""Crash points: where the crash suite (``tests/crash/``, ``bench/crash.py``) kills the service on purpose.

``crash_point(name)`` marks a place in the code where a crash must lose nothing (after the WAL append, between a
Delta commit and the WAL deletion, after a webhook's 2xx and before its delivered mark, ...). It does nothing unless
the environment of the process says so, read once at import (a live-and-archived worker process, started with
``spawn``, inherits it):

- ``LACE_CRASH_AT="<name>:<n>"``: the n-th pass of this process through the point ``name`` SIGKILLs the process
  group (the service, its live-and-archived worker processes and its Spark JVM: a machine losing power), the way
  ``lace serve`` runs under the crash suite, in a group of its own. A process that does not lead its group (and
  is not a worker process whose parent does) kills only itself: a service started in its caller's group never
  kills the caller.
- ``LACE_CRASH_TRACE=<file>``: every pass appends ``<name> <pid>`` to the file (the suite counts a fault-free run's
  passes to choose ``n``).

The points are :data:`POINTS` (name -> where it kills; docs/architecture.md section 4); the code passes exactly
these names (tests/crash/test_faults.py).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading

POINTS: dict[str, str] = {
    "ingest.after_wal": "mid-request: after the WAL append, before matching",
    "ingest.before_alert_commit": "mid-request: after matching, before the alert transaction commits",
    "archive.flush.before_commit": "mid-archive flush: before the Delta commit",
    "archive.flush.before_wal_delete": "mid-archive flush: after the Delta commits, before the WAL deletion",
    "checkpoint.mid_transaction": "mid-checkpoint: inside the checkpoint transaction",
    "webhook.after_post": "mid-delivery: after the receiver's 2xx, before the delivered mark",
    "la.request_submitted": "archive requests in flight: right after a request is submitted",
    "plan.switch.before_commit": "mid-plan switch: the new plan running, before its choice commits",
    "results.import.before_commit": "mid-import of results: before the import's transaction commits",
    "results.import.after_commit": "mid-import of results: after the import's transaction commits, before the answer",
}
"""Every crash point in the code, name -> where it kills (the crash harness's table, bench/crash.py, reads it:
one list, so a point added here is one the service accepts and the harness knows)."""


def _armed(spec: str) -> tuple[str, int] | None:
    name, _, n = spec.rpartition(":")
    if not spec:
        return None
    if name not in POINTS or not n.isdigit() or int(n) < 1:
        raise ValueError(f"LACE_CRASH_AT={spec!r}: expected <point>:<n> with n >= 1, the point one of {list(POINTS)}")
    return name, int(n)


_AT = _armed(os.environ.get("LACE_CRASH_AT", ""))
_TRACE = os.environ.get("LACE_CRASH_TRACE", "")
_passes: dict[str, int] = {}
_lock = threading.Lock()


def crash_point(name: str) -> None:
    """Count a pass through ``name``; kill the process group at the armed pass (see the module docstring)."""
    if _AT is None and not _TRACE:
        return
    with _lock:
        n = _passes[name] = _passes.get(name, 0) + 1
        if _TRACE:
            with open(_TRACE, "a") as f:
                f.write(f"{name} {os.getpid()}\n")
    if _AT == (name, n):
        sys.stderr.write(f"LACE_CRASH_AT: pass {n} through {name}: SIGKILL to the process group\n")
        sys.stderr.flush()
        group = os.getpgrp()
        worker = multiprocessing.parent_process() is not None and group == os.getppid()
        if group == os.getpid() or worker:
            os.killpg(group, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
