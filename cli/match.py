"""``lace match``: a live-only query over an event file, one JSON object per match (DESIGN.md section 12)."""
from __future__ import annotations

import contextlib
import gc
import json
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, BinaryIO

import typer

from cli.app import (
    MAX_LATE_REPORTS,
    PmCapacityOption,
    PmPolicy,
    PmPolicyOption,
    PmStoreOption,
    Storage,
    Strategy,
    TsUnitChoice,
    app,
    fail,
    parse_duration_us,
    read_text,
    silence_stdout,
    warn,
)
from engine.io import EventFileError, open_event_file


class MatchFormatChoice(StrEnum):
    """Output format of ``lace match`` (``engine.match_files``)."""

    jsonl = "jsonl"
    parquet = "parquet"


@app.command()
def match(
    query: Annotated[Path, typer.Option("--query", "-q", help="LQL query file.")],
    events: Annotated[
        Path, typer.Option("--events", "-e", help="Event file: CSV (id,type,ts,...), JSONL or Parquet.")
    ],
    strategy: Annotated[Strategy | None, typer.Option(help="Override the query's STRATEGY.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write matches here; default stdout.")] = None,
    format: Annotated[MatchFormatChoice, typer.Option("--format", help="Match output format.")] = (
        MatchFormatChoice.jsonl
    ),
    schema: Annotated[
        Path | None, typer.Option("--schema", help="JSON file of column types, e.g. {\"key\": \"string\"}.")
    ] = None,
    stats: Annotated[bool, typer.Option("--stats", help="Print counters as JSON on stderr.")] = False,
    storage: Annotated[Storage, typer.Option(help="Partial-match storage.")] = Storage.chain,
    lateness: Annotated[str, typer.Option(help="Allowed lateness, e.g. '5 seconds'; later events are rejected.")] = "0",
    ts_unit: Annotated[TsUnitChoice, typer.Option(help="Unit of numeric ts: auto = int ms, decimal s.")] = (
        TsUnitChoice.auto
    ),
    sort: Annotated[bool, typer.Option("--sort", help="Sort the file by (ts, id) first (reads it all).")] = False,
    pm_capacity: PmCapacityOption = None,
    pm_policy: PmPolicyOption = PmPolicy.stpm,
    pm_store: PmStoreOption = None,
) -> None:
    """Run a live-only query over an event file (CSV, JSONL or Parquet); one JSON object per match."""
    text = read_text(query)
    if not events.is_file():
        fail(f"{events}: no such file")
    column_types = _load_schema(schema) if schema is not None else None
    try:
        lateness_us = parse_duration_us(lateness)
    except ValueError as e:
        fail(f"--lateness: {e}")

    from engine.compiler import compile_query
    from engine.lql.errors import QueryError
    from engine.matcher import Matcher

    try:
        compiled = compile_query(text, strategy=strategy.value if strategy else None)
    except QueryError as e:
        fail(f"{query}:{e.line}:{e.column}: {e.reason}")
    store_cm: Any = contextlib.nullcontext()  # SQLAlchemy is imported only for a partial-match store
    if pm_capacity is not None:
        from service.db.pm_store import open_pm_store

        store_cm = open_pm_store(pm_store or "", fail)
    with store_cm as store:
        matcher = Matcher(
            compiled,
            storage=storage.value,
            allowed_lateness_us=lateness_us,
            pm_capacity=pm_capacity,
            pm_policy=pm_policy.value,
            pm_store=store,
        )
        _run_match(matcher, events, ts_unit, sort, out, stats, format.value, column_types)


def _load_schema(path: Path) -> dict[str, str]:
    from engine.event_files import load_schema

    try:
        return load_schema(path)
    except (ValueError, OSError) as e:
        fail(f"--schema: {e}")


def _open_out_binary(out: Path | None) -> BinaryIO:
    if out is None:
        return sys.stdout.buffer
    try:
        return open(out, "wb")
    except OSError as e:
        fail(f"{out}: {e.strerror or e}")


def _run_match(
    matcher: Any,
    events: Path,
    ts_unit: TsUnitChoice,
    sort: bool,
    out: Path | None,
    stats: bool,
    fmt: str = "jsonl",
    column_types: dict[str, str] | None = None,
) -> None:
    from engine.match_files import MatchWriter
    from engine.matcher import LateEventError

    if fmt == "parquet" and out is None:
        fail("--format parquet needs --out FILE")
    n_events = n_late = n_matches = 0
    start = time.perf_counter()
    sink = None
    try:
        source = open_event_file(events, ts_unit=ts_unit.value, schema=column_types)
        if sort:
            source.sort()
        gc.freeze()  # modules and the file's columns live to the end: keep them out of every collection
        sink = MatchWriter(_open_out_binary(out), fmt)  # type: ignore[arg-type]
        push, write = matcher.push, sink.write
        for batch in source.batches():
            for i, event in enumerate(batch, n_events):
                try:
                    found = push(event)
                except LateEventError as e:
                    n_late += 1
                    if n_late <= MAX_LATE_REPORTS:
                        warn(f"{events} {source.where(i)}: {e}")
                    continue
                if found:
                    write(found)
            n_events += len(batch)
        write(matcher.flush())
        sink.flush()
        n_matches = sink.written
    except EventFileError as e:
        fail(str(e))
    except OSError as e:
        if isinstance(e, BrokenPipeError):
            silence_stdout()
            raise typer.Exit(0) from None  # the reader (e.g. `head`) has enough
        fail(f"{getattr(e, 'filename', None) or events}: {e.strerror or e}")
    finally:
        if sink is not None and out is not None:
            sink.close()
    elapsed_s = time.perf_counter() - start

    if n_late > MAX_LATE_REPORTS:
        warn(f"{n_late - MAX_LATE_REPORTS} more late events rejected ({n_late} in all)")
    if stats:
        counters: dict[str, int | float] = dict(matcher.stats())
        counters.update(
            events_read=n_events,
            late_events=n_late,
            matches=n_matches,
            elapsed_s=round(elapsed_s, 6),
            events_per_s=round(n_events / elapsed_s, 1) if elapsed_s > 0 else 0.0,
        )
        typer.echo(json.dumps(counters), err=True)
