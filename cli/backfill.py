"""``lace backfill``: a query over archived history ``[from, to)`` on Spark (docs/architecture.md section 7.11)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.app import app, console, fail, open_out, read_text


def parse_time_us(text: str) -> int:
    """``--from`` / ``--to``: epoch milliseconds, or ISO-8601 with a UTC offset -> int microseconds UTC.

    >>> parse_time_us("1000"), parse_time_us("1970-01-01T00:00:01Z")
    (1000000, 1000000)
    """
    from engine.io import parse_iso_us

    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text) * 1_000
    return parse_iso_us(text)


def parse_range_us(from_: str, to: str) -> tuple[int, int]:
    """``--from`` / ``--to`` as ``(lo, hi)`` int microseconds UTC; a one-line CLI error when either is unreadable
    or ``to`` is not after ``from``."""
    try:
        from_us = parse_time_us(from_)
    except ValueError as e:
        fail(f"--from: {e}")
    try:
        to_us = parse_time_us(to)
    except ValueError as e:
        fail(f"--to: {e}")
    if to_us <= from_us:
        fail("--to must be after --from")
    return from_us, to_us


@app.command()
def backfill(
    query: Annotated[Path, typer.Option("--query", "-q", help="LQL query file (live, or live-and-archived).")],
    archive: Annotated[Path, typer.Option("--archive", "-a", help="Archive root directory.")],
    from_: Annotated[str, typer.Option("--from", help="Start (inclusive): ISO-8601 with offset, or epoch ms.")],
    to: Annotated[str, typer.Option("--to", help="End (exclusive): ISO-8601 with offset, or epoch ms.")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write matches here (JSONL); default stdout.")] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar on stderr.")] = True,
) -> None:
    """Evaluate a query over archived history [from, to) on Spark; one JSON object per match."""
    text = read_text(query)
    from_us, to_us = parse_range_us(from_, to)
    if not archive.is_dir():
        fail(f"{archive}: no such archive directory")
    if shutil.which("java") is None:
        fail("lace backfill needs Java 17 on PATH (Spark reads the archive)")

    from archive.backfill import BackfillError, Progress, run_backfill
    from archive.spark import get_spark

    err = console(stderr=True)
    if progress:
        with err.status("starting Spark"):
            get_spark()
    bar: Any = None
    task: Any = None
    if progress:
        from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        bar = RichProgress(
            TextColumn("backfill"), BarColumn(), TextColumn("{task.percentage:>5.1f}% tasks"),
            TextColumn("{task.fields[events]:,} events"), TimeElapsedColumn(),
            console=err, transient=True,
        )
        task = bar.add_task("backfill", total=100.0, events=0)
        bar.start()

    def report(p: Progress) -> None:
        if bar is not None:
            bar.update(task, completed=p.percent, events=p.events)

    try:
        result = run_backfill(archive, text, from_us, to_us, progress=report)
    except BackfillError as e:
        fail(f"{query}: {e}" if str(e).startswith("bad query") else str(e))
    finally:
        if bar is not None:
            bar.stop()
    sink = open_out(out)
    try:
        for line in result.lines:
            sink.write(line + "\n")
        sink.flush()
    finally:
        if sink is not sys.stdout:
            sink.close()
    typer.echo(
        f"backfill {result.backfill_id}: {len(result.lines)} matches, {result.events_scanned} events scanned, "
        f"{result.elapsed_s:.1f} s" + (f"; results in {result.results_uri}" if result.results_uri else ""),
        err=True,
    )

