"""``lace demo``: the main job (DESIGN.md section 13) on bundled real data.

The bundled data (``cli/demo_data``, attribution in its README.md) are two real streams:
1-minute trade bars of AIG, BAC, IBM and SPY in the week of 2013-10-07 (QuantConnect LEAN
sample data) and two weeks of 5-minute traffic readings of 40 Aarhus road segments
(CityPulse / Open Data Aarhus). ``hour`` (the UTC hour of day) is added to every event as it is
read (LQL has no modulo; the "same hour on previous days" query joins on it).

The demo creates a Delta archive in a temporary directory, loads the first part of each stream
(before :data:`SPLITS`) into it, then replays the rest as a live stream in event-time order:
every live event is archived as it passes (like ``lace replay``) and offered to the demo queries
of ``cli/demo_data/queries``: live-only ones run on a :class:`~engine.matcher.Matcher`,
live-and-archived ones (``LIVE ... ARCHIVED ... LOOKBACK``) with SLLAA over the Delta archive,
read through Spark. Alerts are printed as they are found, then a summary.
"""
from __future__ import annotations

import heapq
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.app import app, fail
from engine.compiler import CompiledQuery, compile_query
from engine.events import Event
from engine.io import read_events
from engine.live_archived.plan import LiveArchivedPlan, compile_live_archived
from engine.lql.ast import LiveArchivedQuery
from engine.lql.parser import parse
from engine.match import Match
from engine.matcher import LateEventError, Matcher

DATA = Path(__file__).resolve().parent / "demo_data"
STREAMS = ("bars_1m.csv", "traffic_slice.csv")
HOUR_US = 3_600_000_000


def _utc_us(year: int, month: int, day: int) -> int:
    return int(datetime(year, month, day, tzinfo=UTC).timestamp()) * 1_000_000


SPLITS: dict[str, int] = {
    "bar": _utc_us(2013, 10, 9),  # Monday and Tuesday archived; Wednesday to Friday live
    "traffic": _utc_us(2014, 8, 11),  # 2014-08-01 .. 10 archived; 11 .. 14 live
}
"""Per event type: events before this time (int microseconds UTC) are archived up front, the rest replayed live."""

DemoQuery = CompiledQuery | LiveArchivedPlan


@dataclass
class QueryRun:
    """One demo query, what runs it (a Matcher or an SLLAA runner) and what it found."""

    query: DemoQuery
    matcher: Any
    source: Any = None  # the SparkArchiveSource of a live-and-archived query
    alerts: int = 0
    shown: int = 0
    examples: list[Match] = field(default_factory=list)

    @property
    def live_archived(self) -> bool:
        return isinstance(self.query, LiveArchivedPlan)

    def wants(self, event: Event) -> bool:
        types = self.query.live_types if isinstance(self.query, LiveArchivedPlan) else self.query.types
        return event.type in types


def load_stream(data_dir: Path = DATA) -> list[Event]:
    """Both bundled streams merged in (ts, id) order; ids renumbered to stay unique; ``hour`` added."""
    streams = [list(read_events(data_dir / name)) for name in STREAMS]
    merged = list(heapq.merge(*streams, key=lambda e: (e.ts, e.type)))
    return [Event(i, e.type, e.ts, {**e.attrs, "hour": (e.ts // HOUR_US) % 24}) for i, e in enumerate(merged, start=1)]


def split_stream(events: list[Event], splits: dict[str, int] = SPLITS) -> tuple[list[Event], list[Event]]:
    """``(archived, live)``: each event goes to the archive when it is before its type's split time."""
    archived: list[Event] = []
    live: list[Event] = []
    for e in events:
        (archived if e.ts < splits.get(e.type, 0) else live).append(e)
    return archived, live


def load_queries(data_dir: Path = DATA) -> list[DemoQuery]:
    """The demo queries (``*.lql``), compiled: live-only ones to a CompiledQuery, live-and-archived to a plan."""
    out: list[DemoQuery] = []
    for p in sorted((data_dir / "queries").glob("*.lql")):
        text = p.read_text()
        ast = parse(text)
        out.append(compile_live_archived(ast) if isinstance(ast, LiveArchivedQuery) else compile_query(text))
    return out


def _fmt_time(ts_us: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts_us // 1_000_000))


def _fmt_fields(fields: dict[str, Any]) -> str:
    parts = []
    for k, v in fields.items():
        if isinstance(v, int) and v > 10**15:  # a timestamp in microseconds
            v = _fmt_time(v)
        elif isinstance(v, float):
            v = f"{v:.4g}"
        parts.append(f"{k}={v}")
    return " ".join(parts)


def run_demo(
    *,
    speed: float = 0.0,
    show: int = 6,
    tolerance_s: float = 14_400.0,
    console: Console | None = None,
    workdir: Path | None = None,
    spark: Any = None,
) -> dict[str, Any]:
    """Archive the first part of the bundled streams, replay the rest live; print alerts and a summary.

    Parameters
    ----------
    speed : float
        Event-time seconds replayed per wall-clock second (0: as fast as possible).
    show : int
        Alerts printed per query (the rest are counted).
    tolerance_s : float
        SLLAA's tolerated delay ``T_L`` for the live-and-archived queries, seconds of event time.
    console : rich Console, optional
    workdir : Path, optional
        Where the stores go (default: a temporary directory, removed at the end).
    spark : SparkSession, optional
        Default: :func:`archive.spark.get_spark` (started here, settings from ``LACE_SPARK_*``).

    Returns
    -------
    dict
        ``events``, ``archived`` and ``live`` (event counts), ``loaded`` (events in the Delta
        tables before the live replay), ``alerts`` and ``archive_requests``
        (per query name), ``archive`` (the writer's counters), ``seconds`` (wall: ``total``,
        ``spark_start``, ``load``, ``replay``).
    """
    console = console or Console()
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="lace-demo-") as tmp:
            return run_demo(speed=speed, show=show, tolerance_s=tolerance_s, console=console,
                            workdir=Path(tmp), spark=spark)
    from archive.archived_source import GrowingDeltaArchive
    from archive.spark import get_spark
    from archive.writer import ArchiveWriter
    from cli.replay import infer_event_types
    from engine.live_archived.runner import make_runner

    t0 = time.perf_counter()
    events = load_stream()
    archived, live = split_stream(events)
    queries = load_queries()
    console.print(
        f"[bold]LACE demo[/bold]: {len(events):,} real events ({', '.join(STREAMS)}); "
        f"{len(queries)} queries: {', '.join(str(q.name) for q in queries)}"
    )
    splits = ", ".join(f"{t} before {_fmt_time(ts)}" for t, ts in SPLITS.items())
    console.print(f"stores in {workdir}; archive: {len(archived):,} events ({splits}); live: {len(live):,} events")

    with console.status("starting Spark"):
        t = time.perf_counter()
        session = spark if spark is not None else get_spark()
        spark_s = time.perf_counter() - t
    console.print(f"Spark ready in {spark_s:.1f} s")

    t = time.perf_counter()
    root = workdir / "archive"
    writer = ArchiveWriter(root, types=infer_event_types(events, "key"), flush_rows=50_000, flush_age_s=3_600.0)
    with console.status(f"archiving {len(archived):,} events"):
        writer.append(archived)
        writer.flush()
    loaded = writer.counters["flushed"]
    load_s = time.perf_counter() - t
    console.print(f"archived {len(archived):,} events into Delta tables in {load_s:.1f} s")

    archive = GrowingDeltaArchive(writer)
    tolerance_us = int(tolerance_s * 1_000_000)
    runs: list[QueryRun] = []
    for q in queries:
        if isinstance(q, LiveArchivedPlan):
            source = archive.source(spark=session)
            runs.append(QueryRun(q, make_runner("sllaa", q, source, tolerance_us=tolerance_us), source))
        else:
            runs.append(QueryRun(q, Matcher(q)))

    t = time.perf_counter()
    late = 0
    first_ts = live[0].ts if live else 0
    columns = (TextColumn("replaying live"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task("events", total=len(live))
            out = progress.console
            for i, e in enumerate(live):
                if speed > 0:
                    wait = t + (e.ts - first_ts) / 1_000_000 / speed - time.perf_counter()
                    if wait > 0:
                        time.sleep(min(wait, 1.0))
                archive.append(e)
                for run in runs:
                    if run.wants(e):
                        try:
                            _report(run, run.matcher.push(e), out, show)
                        except LateEventError:
                            late += 1
                if i % 2000 == 0:
                    for run in runs:  # time passes for every query, whatever the event's type
                        if run.live_archived:
                            _report(run, run.matcher.advance(e.ts - 1), out, show)
                    progress.update(task, completed=i + 1)
            for run in runs:
                _report(run, run.matcher.flush(), out, show)
            progress.update(task, completed=len(live))
    finally:
        archive.sync()
        wstats = writer.stats()
        writer.close()
    replay_s = time.perf_counter() - t
    total_s = time.perf_counter() - t0

    table = Table(title="summary")
    for col in ("query", "kind", "alerts", "archive requests", "archived events read", "live partial matches"):
        table.add_column(col, justify="left" if col in ("query", "kind") else "right", no_wrap=col in ("query", "kind"))
    requests: dict[str, int] = {}
    for run in runs:
        st = run.matcher.stats()
        name = str(run.query.name)
        if run.live_archived:
            requests[name] = st["archive_requests"]
            table.add_row(name, "live+archived", f"{run.alerts:,}", f"{st['archive_requests']:,}",
                          f"{st['archived_events_scanned']:,}", f"{st['live_matcher']['created']:,}")
        else:
            table.add_row(name, "live", f"{run.alerts:,}", "-", "-", f"{st['created']:,}")
    console.print(table)
    console.print(
        f"events: {len(events):,} ({len(archived):,} archived up front, {len(live):,} live, {late} late); "
        f"archive requests: {sum(requests.values()):,} (SLLAA, T_L = {tolerance_s:g} s)"
    )
    console.print(
        f"time: Spark start {spark_s:.1f} s, archive load {load_s:.1f} s, live replay {replay_s:.1f} s "
        f"({len(live) / max(replay_s, 1e-9):,.0f} events/s), total {total_s:.1f} s"
    )
    return {
        "events": len(events),
        "archived": len(archived),
        "loaded": loaded,
        "live": len(live),
        "alerts": {str(r.query.name): r.alerts for r in runs},
        "archive_requests": requests,
        "archive": wstats,
        "seconds": {"total": total_s, "spark_start": spark_s, "load": load_s, "replay": replay_s},
    }


def _report(run: QueryRun, matches: list[Match], console: Console, show: int) -> None:
    for m in matches:
        run.alerts += 1
        if run.shown < show:
            run.shown += 1
            console.print(f"[cyan]{_fmt_time(m.end)}[/cyan] [bold]{run.query.name}[/bold] {_fmt_fields(m.fields)}")
        elif run.shown == show:
            run.shown += 1
            console.print(f"[dim]{run.query.name}: further alerts are counted in the summary[/dim]")


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

    if speed < 0:
        fail("--speed must be >= 0")
    if tolerance < 0:
        fail("--tolerance must be >= 0")
    if shutil.which("java") is None:
        fail("lace demo needs Java 17 on PATH (Spark reads the archive); e.g. apt-get install openjdk-17-jre-headless")
    run_demo(speed=speed, show=show, tolerance_s=tolerance)
