"""The ``lace`` command line (DESIGN.md section 12).

User errors (bad query, missing file, bad event row) print one ``error: ...`` line on
stderr and exit 2, never a traceback. Engine modules are imported inside the commands
that need them, so ``lace --help`` stays fast.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import time
from enum import StrEnum
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, NoReturn, TextIO

import typer

from archive.cli import archive_app
from engine.events import MICROS_PER_S
from engine.io import EventFileError, iter_event_rows, match_line

app = typer.Typer(
    name="lace",
    help="LACE: live-and-archived complex event detection.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

USAGE_ERROR = 2
MAX_LATE_REPORTS = 10  # late events reported one by one; the rest only counted
_STUB = {"allow_extra_args": True, "ignore_unknown_options": True}
_DURATION_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zµ]*)\s*\Z", re.IGNORECASE)
_UNIT_US = {
    **dict.fromkeys(("us", "µs", "micro", "micros", "microsecond", "microseconds"), 1),
    **dict.fromkeys(("ms", "milli", "millis", "millisecond", "milliseconds"), 1_000),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), MICROS_PER_S),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60 * MICROS_PER_S),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3_600 * MICROS_PER_S),
    **dict.fromkeys(("d", "day", "days"), 86_400 * MICROS_PER_S),
}


class Strategy(StrEnum):
    """Event selection strategies (DESIGN.md section 4)."""

    strict_contiguity = "strict_contiguity"
    partition_contiguity = "partition_contiguity"
    skip_till_next_match = "skip_till_next_match"
    skip_till_any_match = "skip_till_any_match"


class Storage(StrEnum):
    """Partial-match storage for skip_till_any_match: chain-partitioned or one run per partial match."""

    chain = "chain"
    runs = "runs"


class PmPolicy(StrEnum):
    """Which partial matches to spill first when over --pm-capacity (001, section 5)."""

    stpm = "stpm"
    tpm = "tpm"


class Algorithm(StrEnum):
    """Live-and-archived algorithms (DESIGN.md section 7)."""

    alaa = "alaa"
    llaa = "llaa"
    ollaa = "ollaa"
    sllaa = "sllaa"


class Backend(StrEnum):
    """Where ``lace replay`` archives the stream: in memory, or in Delta read through Spark."""

    memory = "memory"
    spark = "spark"


class Scope(StrEnum):
    """API key scopes."""

    admin = "admin"
    ingest = "ingest"
    read = "read"


class TsUnitChoice(StrEnum):
    """Unit of numeric ts values in an event file (see ``engine.io.read_events``)."""

    auto = "auto"
    ms = "ms"
    s = "s"
    us = "us"


def parse_duration_us(text: str) -> int:
    """A duration such as ``500ms``, ``30 seconds``, ``10 min``, ``2h`` or ``0`` -> int microseconds.

    >>> parse_duration_us("1.5 s"), parse_duration_us("10 min"), parse_duration_us("0")
    (1500000, 600000000, 0)
    """
    m = _DURATION_RE.match(text)
    if m is None:
        raise ValueError(f"cannot read duration {text!r} (e.g. '500ms', '30 seconds', '10 min')")
    amount, unit = m.group(1), m.group(2).lower()
    if not unit:
        if float(amount) == 0:
            return 0
        raise ValueError(f"duration {text!r} needs a unit (us, ms, s, min, h, days)")
    if unit not in _UNIT_US:
        raise ValueError(f"unknown duration unit {unit!r} in {text!r}")
    return round(float(amount) * _UNIT_US[unit])


def fail(message: str, code: int = USAGE_ERROR) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def warn(message: str) -> None:
    """Print ``warning: message`` on stderr."""
    typer.echo(f"warning: {message}", err=True)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        fail(f"{path}: no such file")
    except (OSError, UnicodeDecodeError) as e:
        fail(f"{path}: {getattr(e, 'strerror', None) or e}")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"lace {metadata.version('lace')}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """LACE: live-and-archived complex event detection."""


@app.command()
def match(
    query: Annotated[Path, typer.Option("--query", "-q", help="LQL query file.")],
    events: Annotated[Path, typer.Option("--events", "-e", help="Event file: CSV (id,type,ts,...) or JSONL.")],
    strategy: Annotated[Strategy | None, typer.Option(help="Override the query's STRATEGY.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write matches here (JSONL); default stdout.")] = None,
    stats: Annotated[bool, typer.Option("--stats", help="Print counters as JSON on stderr.")] = False,
    storage: Annotated[Storage, typer.Option(help="Partial-match storage.")] = Storage.chain,
    lateness: Annotated[str, typer.Option(help="Allowed lateness, e.g. '5 seconds'; later events are rejected.")] = "0",
    ts_unit: Annotated[TsUnitChoice, typer.Option(help="Unit of numeric ts: auto = int ms, decimal s.")] = (
        TsUnitChoice.auto
    ),
    sort: Annotated[bool, typer.Option("--sort", help="Sort the file by (ts, id) first (reads it all).")] = False,
    pm_capacity: Annotated[
        int | None, typer.Option(help="Keep at most N partial matches in memory; spill the rest.", min=1)
    ] = None,
    pm_policy: Annotated[PmPolicy, typer.Option(help="Which partial matches to spill first.")] = PmPolicy.stpm,
    pm_store: Annotated[
        str | None, typer.Option(help="SQLAlchemy URL of the partial-match store (default: a temporary SQLite file).")
    ] = None,
) -> None:
    """Run a live-only query over an event file; one JSON object per match."""
    text = _read_text(query)
    if not events.is_file():
        fail(f"{events}: no such file")
    try:
        lateness_us = parse_duration_us(lateness)
    except ValueError as e:
        fail(f"--lateness: {e}")

    from engine.compiler import compile_query
    from engine.lql.errors import QueryError
    from engine.matcher import Matcher
    from service.pm_store import open_pm_store

    try:
        compiled = compile_query(text, strategy=strategy.value if strategy else None)
    except QueryError as e:
        fail(f"{query}:{e.line}:{e.column}: {e.reason}")
    with open_pm_store((pm_store or "") if pm_capacity is not None else None, fail) as store:
        matcher = Matcher(
            compiled,
            storage=storage.value,
            allowed_lateness_us=lateness_us,
            pm_capacity=pm_capacity,
            pm_policy=pm_policy.value,
            pm_store=store,
        )
        _run_match(matcher, events, ts_unit, sort, out, stats)


def _run_match(matcher: Any, events: Path, ts_unit: TsUnitChoice, sort: bool, out: Path | None, stats: bool) -> None:
    from engine.matcher import LateEventError

    sink = _open_out(out)
    n_events = n_late = n_matches = 0
    start = time.perf_counter()
    try:
        rows = iter_event_rows(events, ts_unit=ts_unit.value)
        if sort:
            rows = iter(sorted(rows, key=lambda row: row[1].order_key()))
        for line, event in rows:
            n_events += 1
            try:
                found = matcher.push(event)
            except LateEventError as e:
                n_late += 1
                if n_late <= MAX_LATE_REPORTS:
                    warn(f"{events} line {line}: {e}")
                continue
            for m in found:
                sink.write(match_line(m) + "\n")
            n_matches += len(found)
        found = matcher.flush()
        for m in found:
            sink.write(match_line(m) + "\n")
        n_matches += len(found)
        sink.flush()
    except EventFileError as e:
        fail(str(e))
    except OSError as e:
        if isinstance(e, BrokenPipeError):
            _silence_stdout()
            raise typer.Exit(0) from None  # the reader (e.g. `head`) has enough
        fail(f"{getattr(e, 'filename', None) or events}: {e.strerror or e}")
    finally:
        if sink is not sys.stdout:
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


def _silence_stdout() -> None:
    # After a broken pipe, point stdout at /dev/null so the interpreter's final flush does not complain.
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _open_out(out: Path | None) -> TextIO:
    if out is None:
        return sys.stdout
    try:
        return open(out, "w", encoding="utf-8")
    except OSError as e:
        fail(f"{out}: {e.strerror or e}")


@app.command()
def demo(
    speed: float = typer.Option(0.0, help="event-time seconds replayed per wall second (0: as fast as possible)"),
    show: int = typer.Option(6, help="alerts printed per query; the rest are counted"),
    tolerance: float = typer.Option(
        14_400.0, help="SLLAA's tolerated delay T_L for the live-and-archived queries, event-time seconds"
    ),
) -> None:
    """The main job: archive the first part of bundled real data (Aarhus traffic, US equity bars), replay the
    rest live through live-only and live-and-archived queries, print alerts and a summary (needs Java 17)."""
    import shutil

    from service.demo import run_demo

    if speed < 0:
        fail("--speed must be >= 0")
    if tolerance < 0:
        fail("--tolerance must be >= 0")
    if shutil.which("java") is None:
        fail("lace demo needs Java 17 on PATH (Spark reads the archive); e.g. apt-get install openjdk-17-jre-headless")
    run_demo(speed=speed, show=show, tolerance_s=tolerance)


def _not_implemented(command: str) -> NoReturn:
    fail(f"lace {command} is not implemented yet")


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default LACE_HOST, 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default LACE_PORT, 8000).")] = None,
    migrate: Annotated[bool, typer.Option(help="Run the database migrations first.")] = True,
) -> None:
    """Start the REST service (uvicorn); settings from LACE_* variables (docs/operations.md)."""
    import uvicorn

    from service.app import create_app

    settings = _settings()
    if migrate:
        _upgrade(settings.sqlalchemy_url)
    uvicorn.run(
        create_app(settings),
        host=host or settings.host,
        port=settings.port if port is None else port,
        log_level=settings.log_level,
        access_log=settings.access_log,
    )


db_app = typer.Typer(help="The service database.", no_args_is_help=True)
keys_app = typer.Typer(help="API keys.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(keys_app, name="keys")
app.add_typer(archive_app, name="archive")


def _settings() -> Any:
    from pydantic import ValidationError

    from service.core.config import Settings

    try:
        return Settings()
    except ValidationError as e:
        problems = "; ".join(f"LACE_{'_'.join(map(str, err['loc'])).upper()}: {err['msg']}" for err in e.errors())
        fail(f"bad settings: {problems}")


def _upgrade(url: str) -> None:
    from service.db.migrate import upgrade

    try:
        upgrade(url)
    except Exception as e:  # a bad URL or an unreachable server: one line, no traceback
        fail(f"database migration failed ({url.split('@')[-1]}): {type(e).__name__}: {e}")


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Migrate the database (LACE_DATABASE_URL) to the newest revision."""
    from service.db.migrate import current

    settings = _settings()
    _upgrade(settings.sqlalchemy_url)
    typer.echo(f"database at revision {current(settings.sqlalchemy_url)}")


@keys_app.command("create")
def keys_create(
    scope: Annotated[list[Scope], typer.Option("--scope", "-s", help="admin, ingest or read; repeat for several.")],
    name: Annotated[str, typer.Option(help="A label for the key.")] = "cli",
) -> None:
    """Create an API key and print it once (only its SHA-256 is stored)."""
    from service.api.routes.keys import create_key
    from service.db.session import make_engine, make_session_factory

    settings = _settings()
    _upgrade(settings.sqlalchemy_url)
    engine = make_engine(settings.sqlalchemy_url)
    try:
        with make_session_factory(engine)() as session:
            _, token = create_key(session, name=name, scopes=[s.value for s in scope])
    finally:
        engine.dispose()
    typer.echo(token)


@keys_app.command("list")
def keys_list() -> None:
    """List API keys (id, prefix, scopes, name, revoked)."""
    from sqlalchemy import select

    from service.db.models import ApiKeyRow
    from service.db.session import make_engine, make_session_factory

    settings = _settings()
    engine = make_engine(settings.sqlalchemy_url)
    try:
        with make_session_factory(engine)() as session:
            for row in session.scalars(select(ApiKeyRow).order_by(ApiKeyRow.id)):
                state = "revoked" if row.revoked_at_us else "active"
                typer.echo(f"{row.id}\t{row.prefix}...\t{','.join(row.scopes)}\t{row.name}\t{state}")
    finally:
        engine.dispose()


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
    pm_capacity: Annotated[
        int | None, typer.Option(help="Keep at most N partial matches in memory; spill the rest.", min=1)
    ] = None,
    pm_policy: Annotated[PmPolicy, typer.Option(help="Which partial matches to spill first.")] = PmPolicy.stpm,
    pm_store: Annotated[
        str | None, typer.Option(help="SQLAlchemy URL of the partial-match store (default: a temporary SQLite file).")
    ] = None,
    backend: Annotated[Backend, typer.Option(help="memory, or spark: Delta at --archive, read through Spark.")] = (
        Backend.spark
    ),
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write results here (JSONL); default stdout.")] = None,
    stats: Annotated[Path | None, typer.Option("--stats", help="Write the counters here (JSON).")] = None,
    ts_unit: Annotated[TsUnitChoice, typer.Option(help="Unit of numeric ts: auto = int ms, decimal s.")] = (
        TsUnitChoice.auto
    ),
) -> None:
    """Play an event file as a live stream, archiving it as it passes, and run a live-and-archived query."""
    text = _read_text(query)
    if not events.is_file():
        fail(f"{events}: no such file")
    try:
        tolerance_us = parse_duration_us(tolerance)
    except ValueError as e:
        fail(f"--tolerance: {e}")
    if backend is Backend.spark and shutil.which("java") is None:
        fail("the spark backend needs Java 17 on PATH (or use --backend memory)")

    from engine.lql.errors import QueryError
    from engine.lql.parser import parse
    from service.pm_store import open_pm_store
    from service.replay import ReplayError, ReplayOptions, run_replay

    try:
        parse(text)
    except QueryError as e:
        fail(f"{query}:{e.line}:{e.column}: {e.reason}")
    try:
        rows = [event for _, event in iter_event_rows(events, ts_unit=ts_unit.value)]
    except EventFileError as e:
        fail(str(e))
    except OSError as e:
        fail(f"{events}: {e.strerror or e}")
    sink = _open_out(out)
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
            _silence_stdout()
            raise typer.Exit(0) from None
        finally:
            if sink is not sys.stdout:
                sink.close()
    if stats is not None:
        try:
            stats.write_text(json.dumps(counters, indent=1, default=str) + "\n", encoding="utf-8")
        except OSError as e:
            fail(f"{stats}: {e.strerror or e}")


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
    text = _read_text(query)
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
    if not archive.is_dir():
        fail(f"{archive}: no such archive directory")
    if shutil.which("java") is None:
        fail("lace backfill needs Java 17 on PATH (Spark reads the archive)")

    from rich.console import Console

    from archive.backfill import BackfillError, Progress, run_backfill
    from archive.spark import get_spark

    err = Console(stderr=True)
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
    sink = _open_out(out)
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


if __name__ == "__main__":
    app()
