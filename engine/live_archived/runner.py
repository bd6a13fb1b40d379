"""Build a runner by algorithm name and replay a stream through it (tests, ``lace replay``, benches); answer a batch
of completed live instances from given archived events (:func:`join_instances`, ``lace stream``'s archive join)."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from engine.events import END_OF_TIME, Event
from engine.live_archived.alaa import ALAA
from engine.live_archived.base import LiveInstance, Runner
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


def join_instances(
    plan: LiveArchivedPlan, instances: Sequence[Match], archived: Iterable[Event]
) -> list[list[Match]]:
    """The results of completed live instances, given the archived events: one SLLAA subwindow (001 section 4.3 (2))
    answered from ``archived`` instead of an archive request.

    Parameters
    ----------
    plan : LiveArchivedPlan
        The statement.
    instances : sequence of Match
        Complete matches of ``plan.live`` (live instances), in the order the live matcher emitted them.
    archived : iterable of Event
        Archived events (any order, any types: only ``plan.archived_types`` are read); they must hold every event of
        ``plan.archived_types`` (of the instance's archive key, :meth:`LiveArchivedPlan.key_of`, with a key plan) that
        ends in each instance's access range ``[start - lookback, start)``, int microseconds UTC. Events outside the
        ranges are left out, as an archive request would.

    Returns
    -------
    list of list of Match
        ``out[i]``: the results of ``instances[i]``, exactly as SLLAA, LLAA, OLLAA or ALAA emit them for it (the
        pairwise form: one per joined archived instance, by archived start; the grouped form: at most one); empty
        for an instance that joins nothing or whose key is missing. A replay (:func:`replay`) emits each instance's
        results together, instances in the live matcher's order: concatenating ``out`` gives its output.

    Examples
    --------
    >>> from engine.live_archived.plan import compile_live_archived
    >>> plan = compile_live_archived(
    ...     "LIVE PATTERN Pass p WHERE p.at = 'B' ARCHIVED PATTERN Pass q WHERE q.at = 'A' PARTITION BY car "
    ...     "LOOKBACK 20 min JOIN p.car = q.car RETURN p.car AS car")
    >>> a, b = Event(1, "Pass", 0, {"car": 7, "at": "A"}), Event(2, "Pass", 60_000_000, {"car": 7, "at": "B"})
    >>> from engine.matcher import Matcher
    >>> live = Matcher(plan.live).push(b)
    >>> [[(r.ids(), r.fields) for r in found] for found in join_instances(plan, live, [a, b])]
    [[({'p': [2], 'q': [1]}, {'car': 7})]]
    """
    if not instances:
        return []
    archive = MemoryArchive()
    archive.extend(archived)
    runner = SLLAA(plan, archive, max_batch=len(instances))
    return runner.answer_each([LiveInstance(m, END_OF_TIME, 0.0) for m in instances])
