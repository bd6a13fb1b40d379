"""Live-and-archived detection: ALAA, LLAA, OLLAA and SLLAA (docs/architecture.md section 7.7; 001 section 4).

- :mod:`~engine.live_archived.plan`: compile ``LIVE ... ARCHIVED ... LOOKBACK ... JOIN`` queries;
- :mod:`~engine.live_archived.source`: the archive protocol and an in-memory archive;
- :mod:`~engine.live_archived.alaa`, :mod:`~engine.live_archived.llaa`,
  :mod:`~engine.live_archived.ollaa`, :mod:`~engine.live_archived.sllaa`: the algorithms;
- :mod:`~engine.live_archived.runner`: build one by name, replay a stream through it.

Pure Python: no Spark, no Arrow (``archive.archived_source`` adapts the Delta archive).
"""
from engine.live_archived.alaa import ALAA
from engine.live_archived.base import LiveInstance, Runner
from engine.live_archived.counters import RunCounters
from engine.live_archived.llaa import LLAA
from engine.live_archived.ollaa import OLLAA
from engine.live_archived.plan import LiveArchivedPlan, compile_live_archived
from engine.live_archived.runner import ALGORITHMS, join_instances, make_runner, replay, run_memory
from engine.live_archived.sllaa import SLLAA
from engine.live_archived.source import ArchiveSource, MemoryArchive

__all__ = [
    "ALAA",
    "ALGORITHMS",
    "LLAA",
    "OLLAA",
    "SLLAA",
    "ArchiveSource",
    "LiveArchivedPlan",
    "LiveInstance",
    "MemoryArchive",
    "RunCounters",
    "Runner",
    "compile_live_archived",
    "join_instances",
    "make_runner",
    "replay",
    "run_memory",
]
