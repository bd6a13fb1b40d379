"""The service process's garbage-collector policy: full collections that do not stall ingest and the API.

CPython's cyclic collector walks every tracked object in a full (generation 2) collection while it
holds the GIL, so every thread stops. With thousands of statements the service tracks millions of
objects (a compiled statement alone is ~135: AST nodes, positions, predicate closures and their cells),
and full collections took 0.1-0.74 s each, every ~10 s while ingest grew the heap: those pauses were
the tail of `PUT /queries` and of ingest-to-webhook latency (docs/benchmarks.md, "Rules in the
service"). The policy (:class:`GcPolicy`):

- at start-up, once the stored queries are running, ``gc.freeze()``: those objects are never walked
  again (no collection first: start-up leaves little garbage, and a full collection there would cost
  every test that starts the app);
- after every full collection its survivors are frozen too, so the next one walks only what was
  allocated since;
- every ``gc_thaw_s`` seconds everything is unfrozen and collected once (one full pause), so cyclic
  garbage among frozen objects (a replaced or deleted statement's matcher) is reclaimed; until then it
  stays in memory.

Non-cyclic garbage is freed by reference counting at once, frozen or not.
"""
from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Any

log = logging.getLogger(__name__)


class GcPolicy:
    """Freeze what survives full collections; thaw and collect every ``thaw_every_s`` seconds.

    ``thaw_every_s`` <= 0 leaves CPython's collector as it is (:meth:`install` does nothing).
    Install once per process (the service's lifespan); :meth:`uninstall` unfreezes everything.
    """

    def __init__(self, thaw_every_s: float) -> None:
        self.thaw_every_s = thaw_every_s
        self.frozen_after_full = 0  # full collections whose survivors were frozen
        self.thaws = 0
        self._installed = False
        self._thawing = False
        self._last_thaw = time.monotonic()
        self._lock = threading.Lock()

    def install(self) -> None:
        """Freeze what exists now, then the survivors of each full collection."""
        if self.thaw_every_s <= 0 or self._installed:
            return
        gc.freeze()
        gc.callbacks.append(self._after_collection)
        self._installed = True
        self._last_thaw = time.monotonic()

    def uninstall(self) -> None:
        """Stop freezing and unfreeze everything (the process's collector is CPython's again)."""
        if not self._installed:
            return
        try:
            gc.callbacks.remove(self._after_collection)
        except ValueError:
            pass
        gc.unfreeze()
        self._installed = False

    def maybe_thaw(self) -> bool:
        """Unfreeze, collect everything once and freeze again, when ``thaw_every_s`` has passed since the
        last time (call it periodically, from any thread). Returns whether it did."""
        if not self._installed or time.monotonic() - self._last_thaw < self.thaw_every_s:
            return False
        with self._lock:
            started = time.perf_counter()
            self._thawing = True
            try:
                gc.unfreeze()
                found = gc.collect()
                gc.freeze()
            finally:
                self._thawing = False
            self._last_thaw = time.monotonic()
            self.thaws += 1
        log.info("gc: thawed and collected %d unreachable objects in %.0f ms", found,
                 (time.perf_counter() - started) * 1000)
        return True

    def _after_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info.get("generation") == 2 and not self._thawing:
            gc.freeze()
            self.frozen_after_full += 1
