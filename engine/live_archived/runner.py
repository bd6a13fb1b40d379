"""Build a runner by algorithm name and replay a stream through it (tests, ``lace replay``, benches)."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from engine.events import Event
from engine.live_archived.alaa import ALAA
from engine.live_archived.base import Runner
from engine.live_archived.llaa import LLAA
from engine.live_archived.ollaa import OLLAA
from engine.live_archived.plan import LiveArchivedPlan
from engine.live_archived.sllaa import SLLAA
from engine.live_archived.source import ArchiveSource, MemoryArchive
from engine.match import Match
from engine.matcher import LateEventError
from engine.options import Algorithm

ALGORITHMS: dict[str, type[Runner]] = {
    Algorithm.alaa: ALAA, Algorithm.llaa: LLAA, Algorithm.ollaa: OLLAA, Algorithm.sllaa: SLLAA
}


def make_runner(
    algorithm: str,
    plan: LiveArchivedPlan,
    source: ArchiveSource,
    *,
    tolerance_us: int = 0,
    max_batch: int | None = None,
    window_us: int | None = None,
    **options: Any,
) -> Runner:
    """A runner of ``algorithm`` (``alaa``, ``llaa``, ``ollaa`` or ``sllaa``).

    ``tolerance_us`` (``T_L``) is used by SLLAA (subwindows) and OLLAA (archive refresh);
    ``max_batch`` by SLLAA; ``window_us`` (``W_L``) by ALAA; other ``options`` go to the runner
    (``pm_capacity``, ``pm_policy``, ``pm_store``, ``clock``, and OLLAA's own).

    Raises
    ------
    ValueError
        For an unknown algorithm.
    """
    name = algorithm.lower()
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; expected one of {', '.join(ALGORITHMS)}")
    if name == "sllaa":
        if max_batch is not None:
            options["max_batch"] = max_batch
        return SLLAA(plan, source, tolerance_us=tolerance_us, **options)
    if name == "ollaa":
        return OLLAA(plan, source, tolerance_us=tolerance_us, **options)
    if name == "alaa":
        return ALAA(plan, source, window_us=window_us, **options)
    return LLAA(plan, source, **options)


def replay(
    events: Iterable[Event], runner: Runner, archive: Callable[[Event], None] | None = None
) -> Iterator[Match]:
    """Play ``events`` (in ts order) as the live stream, archiving each one before the runner sees it.

    ``archive(event)`` appends to the archive the runner's source reads (e.g.
    :meth:`MemoryArchive.append`). Late events (behind the live watermark) are skipped; the live
    matcher counts them. Yields results as they are emitted, then those of :meth:`Runner.flush`.
    """
    for event in events:
        if archive is not None:
            archive(event)
        try:
            found = runner.push(event)
        except LateEventError:
            continue
        yield from found
    yield from runner.flush()


def run_memory(
    plan: LiveArchivedPlan, algorithm: str, events: Iterable[Event], **options: Any
) -> tuple[list[Match], Runner]:
    """Replay ``events`` through ``algorithm`` over a fresh :class:`MemoryArchive`; return results and runner.

    Examples
    --------
    >>> from engine.live_archived.plan import compile_live_archived
    >>> plan = compile_live_archived(
    ...     "LIVE PATTERN Pass p WHERE p.at = 'B' ARCHIVED PATTERN Pass q WHERE q.at = 'A' PARTITION BY car "
    ...     "LOOKBACK 20 min JOIN p.car = q.car RETURN p.car AS car")
    >>> evs = [Event(1, "Pass", 0, {"car": 7, "at": "A"}), Event(2, "Pass", 60_000_000, {"car": 7, "at": "B"})]
    >>> results, runner = run_memory(plan, "sllaa", evs, tolerance_us=0)
    >>> [(r.ids(), r.fields) for r in results], runner.counters.archive_requests
    ([({'p': [2], 'q': [1]}, {'car': 7})], 1)
    """
    archive = MemoryArchive()
    runner = make_runner(algorithm, plan, archive, **options)
    return list(replay(events, runner, archive.append)), runner
