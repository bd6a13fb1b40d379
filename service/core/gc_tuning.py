"""The garbage collector's thresholds for LACE's long-running processes (issue 25).

A live-and-archived query process keeps a large heap that lives long (the archived memo's events and matches, up to
~100,000 events with their matches: :mod:`engine.live_archived.memo`; the live matcher's partial matches) and
allocates short-lived objects at a high rate (every live event, every archive request's rows). With CPython's default
thresholds (700, 10, 10) a young collection runs every 700 allocations and, through the older generations, the full
heap is traversed often: in a replay of the Aarhus slice through SLLAA and LLAA (134,770 events, ``pm_capacity``
100,000) the collector took ~12 % of the CPU (7.46-7.50 s with the defaults, 6.62 s with it off, 6.66 s with
:data:`GC_THRESHOLDS` at 10,000). Cycles are still collected, only less often: the young generation holds up to
100,000 objects between collections instead of 700, and the older ones keep their default ratios.

Issue 43: a worker of the pool hosts ten such queries, and at 10,000 its young collections alone took 11.7 s of the
collector's 16.8 s (455 young collections of 26 ms each: a young object costs ~2.6 us to collect, the matches and
events of an archive answer referring to many others) over ``bench.service --live-archived --queries 10``; at
100,000, 3.9 s of 4.9 s (23 young collections: most young objects are freed by reference counting before one
runs). Measured with a ``gc.callbacks`` probe in the worker (wall seconds inside the collector), same run length.
"""
from __future__ import annotations

import gc

GC_THRESHOLDS = (100_000, 10, 10)
"""``gc.set_threshold`` arguments: allocations between young collections, then the default ratios."""


def tune() -> None:
    """Set :data:`GC_THRESHOLDS` for this process (a query process calls it as it starts)."""
    gc.set_threshold(*GC_THRESHOLDS)
