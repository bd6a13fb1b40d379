"""``lace replay``: an event file played as a live stream against the archive it builds.

See docs/architecture.md section 7.12.

The file is read, sorted by ``(ts, id)`` and played event by event. Every event is archived before
the live side sees it, so the archive grows as the stream advances and a live instance finds every
event before its start there: in a :class:`~engine.live_archived.source.MemoryArchive`
(``backend="memory"``), or in the Delta archive at ``archive_dir`` through an
:class:`archive.writer.ArchiveWriter`, read back through Spark (``backend="spark"``). A
live-and-archived query runs with one of ALAA, LLAA, OLLAA or SLLAA; a live-only query runs like
``lace match``.
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, cast

import typer

from cli.app import (
    Algorithm,
    Backend,
    PmCapacityOption,
    PmPolicy,
    PmPolicyOption,
    PmStoreOption,
    TsUnitChoice,
    app,
    fail,
    open_out,
    parse_duration_us,
    read_text,
    silence_stdout,
    warn,
)
from cli.match import load_schema_option
from engine.detector import DEFAULT_TOLERANCE_US, make_detector
from engine.detector import compile as compile_statement
from engine.events import Event
from engine.io import EventFileError, match_line, open_event_file
from engine.live_archived.source import ArchiveSource, MemoryArchive
from engine.lql.parser import parse
from engine.match import Match
from engine.matcher import LateEventError
from engine.pm.store import PartialMatchStore


class ReplayError(ValueError):
    """A problem with the replay's inputs (one line, for ``error: ...``)."""


@dataclass(slots=True)
class ReplayOptions:
    """How to replay (see ``lace replay --help``); durations in int microseconds."""

    algorithm: str = "sllaa"
    tolerance_us: int = DEFAULT_TOLERANCE_US
    max_batch: int = 1_000
    pm_capacity: int | None = None
    pm_policy: str = "stpm"
    pm_store: PartialMatchStore | None = None
    backend: str = "spark"
    archive_dir: Path | None = None


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return "string"


def infer_event_types(events: Iterable[Event], key_attr: str | None = None) -> list[Any]:
    """Archive event types from the events themselves: each attribute typed by its values.

    ``int`` and ``float`` values together make ``float``; ``key_attr`` becomes the key of every type
    that has it.

    Raises
    ------
    ReplayError
        When an attribute mixes strings (or booleans) with numbers, or a name is not allowed.
    """
    from engine.event_type import AttrType, EventType, SchemaError

    kinds: dict[str, dict[str, str]] = {}
    for e in events:
        attrs = kinds.setdefault(e.type, {})
        for name, value in e.attrs.items():
            k = _kind(value)
            seen = attrs.get(name)
            if seen is None or seen == k:
                attrs[name] = k
            elif {seen, k} == {"int", "float"}:
                attrs[name] = "float"
            else:
                raise ReplayError(f"attribute {name!r} of type {e.type} has {seen} and {k} values (event {e.id})")
    try:
        return [
            EventType(name, cast(dict[str, AttrType], attrs), key_attr if key_attr in attrs else None)
            for name, attrs in sorted(kinds.items())
        ]
    except SchemaError as exc:
        raise ReplayError(f"cannot archive these events: {exc}") from None


def run_replay(
    query_text: str, events: Sequence[Event], options: ReplayOptions, sink: Callable[[Match], object]
) -> dict[str, Any]:
    """Replay ``events`` (sorted by ts here) through the query; every result goes to ``sink``.

    Returns
    -------
    dict
        The counters: events, late events, results, the algorithm's counters (docs/architecture.md
        section 7.7) and the live matcher's (section 7.6), and the archive writer's with Spark.

    Raises
    ------
    QueryError
        For a bad query.
    ReplayError
        For bad inputs (a non-empty archive directory, events that cannot be archived).
    """
    statement = compile_statement(query_text)
    ordered = sorted(events, key=Event.order_key)
    started = time.perf_counter()
    growing: Any = None
    source: ArchiveSource
    if options.backend == "memory":
        memory = MemoryArchive()
        source, append = memory, memory.append
    else:
        growing = _open_writer(options, ordered, statement.archive_key_attr)  # what its archive requests select by
        source, append = growing.source(), growing.append
    try:
        detector = make_detector(
            statement,
            source=source,
            algorithm=options.algorithm,
            tolerance_us=options.tolerance_us,
            max_batch=options.max_batch,
            pm_capacity=options.pm_capacity,
            pm_policy=options.pm_policy,
            pm_store=options.pm_store,
        )
        n = late = 0
        for e in ordered:
            append(e)  # archived before the live side sees it: the archive is the stream's past
            try:
                found = detector.push(e)
            except LateEventError:
                late += 1
                continue
            for m in found:
                sink(m)
            n += len(found)
        for m in detector.flush():
            sink(m)
            n += 1
    finally:
        if growing is not None:
            growing.sync()
            growing.writer.close()
    counters = detector.stats()
    stats: dict[str, Any] = {"query": statement.name}
    stats.update(counters if statement.reads_archive else {"algorithm": None, "live_matcher": counters})
    stats.update(results=n, late_events=late)
    if growing is not None:
        stats["archive"] = growing.writer.stats()
        if statement.reads_archive:
            stats["extractor_calls"] = getattr(source, "requests", None)
    stats.update(backend=options.backend, events_read=len(events), elapsed_s=round(time.perf_counter() - started, 6))
    return stats


def _open_writer(options: ReplayOptions, events: Sequence[Event], key_attr: str | None) -> Any:
    from archive.archived_source import GrowingDeltaArchive
    from archive.writer import ArchiveWriter

    root = options.archive_dir
    if root is None:
        raise ReplayError("--archive DIR is needed")
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ReplayError(f"{root}: the archive directory must be new or empty (lace replay archives the events there)")
    types = infer_event_types(events, key_attr)
    # flush by size only (a replay runs faster than real time); reads see the recent buffer anyway
    writer = ArchiveWriter(root, types=types, flush_rows=5_000, flush_age_s=3_600.0)
    return GrowingDeltaArchive(writer)


@app.command()
def replay(
    query: Annotated[Path, typer.Option("--query", "-q", help="LQL query file (live-and-archived or live-only).")],
    events: Annotated[Path, typer.Option("--events", "-e", help="Event file: CSV (id,type,ts,...) or JSONL.")],
    archive: Annotated[Path, typer.Option("--archive", "-a", help="Archive directory (new or empty; spark backend).")],
    algorithm: Annotated[Algorithm, typer.Option(help="Live-and-archived algorithm.")] = Algorithm.sllaa,
    tolerance: Annotated[
        str, typer.Option(help="Tolerated delay T_L (SLLAA subwindows, OLLAA archive refresh), e.g. '1 min'.")
    ] = "1 min",
    max_batch: Annotated[int, typer.Option(help="SLLAA: at most N live instances per subwindow.", min=1)] = 1000,
    pm_capacity: PmCapacityOption = None,
    pm_policy: PmPolicyOption = PmPolicy.stpm,
    pm_store: PmStoreOption = None,
    backend: Annotated[Backend, typer.Option(help="memory, or spark: Delta at --archive, read through Spark.")] = (
        Backend.spark
    ),
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write results here (JSONL); default stdout.")] = None,
    stats: Annotated[Path | None, typer.Option("--stats", help="Write the counters here (JSON).")] = None,
    ts_unit: Annotated[TsUnitChoice, typer.Option(help="Unit of numeric ts: auto = int ms, decimal s.")] = (
        TsUnitChoice.auto
    ),
    schema: Annotated[
        Path | None, typer.Option("--schema", help="JSON file of column types, e.g. {\"key\": \"string\"}.")
    ] = None,
) -> None:
    """Play an event file as a live stream, archiving it as it passes, and run a live-and-archived query."""
    text = read_text(query)
    if not events.is_file():
        fail(f"{events}: no such file")
    column_types = load_schema_option(schema) if schema is not None else None
    try:
        tolerance_us = parse_duration_us(tolerance)
    except ValueError as e:
        fail(f"--tolerance: {e}")
    if backend is Backend.spark and shutil.which("java") is None:
        fail("the spark backend needs Java 17 on PATH (or use --backend memory)")

    from engine.lql.errors import QueryError
    from service.db.pm_store import open_pm_store

    try:
        parse(text)
    except QueryError as e:
        fail(f"{query}:{e.line}:{e.column}: {e.reason}")
    try:
        source = open_event_file(events, ts_unit=ts_unit.value, schema=column_types)
        for message in source.warnings():
            warn(message)
        rows = list(source.events())
    except EventFileError as e:
        fail(str(e))
    except OSError as e:
        fail(f"{events}: {e.strerror or e}")
    sink = open_out(out)
    with open_pm_store((pm_store or "") if pm_capacity is not None else None, fail) as store:
        options = ReplayOptions(
            algorithm=algorithm.value,
            tolerance_us=tolerance_us,
            max_batch=max_batch,
            pm_capacity=pm_capacity,
            pm_policy=pm_policy.value,
            pm_store=store,
            backend=backend.value,
            archive_dir=archive,
        )
        try:
            counters = run_replay(text, rows, options, lambda m: sink.write(match_line(m) + "\n"))
            sink.flush()
        except (QueryError, ReplayError) as e:
            fail(str(e) if isinstance(e, ReplayError) else f"{query}:{e.line}:{e.column}: {e.reason}")
        except BrokenPipeError:
            silence_stdout()
            raise typer.Exit(0) from None
        finally:
            if sink is not sys.stdout:
                sink.close()
    if stats is not None:
        try:
            stats.write_text(json.dumps(counters, indent=1, default=str) + "\n", encoding="utf-8")
        except OSError as e:
            fail(f"{stats}: {e.strerror or e}")
