"""``lace demo``: real data through the live matcher, alerts as they happen, then a summary.

The bundled data (``service/demo_data``, attribution in its README.md) are two real streams:
1-minute trade bars of AIG, BAC, IBM and SPY in the week of 2013-10-07 (QuantConnect LEAN
sample data) and two weeks of 5-minute traffic readings of 40 Aarhus road segments
(CityPulse / Open Data Aarhus). They are replayed as one live stream in event-time order
through the demo queries in ``service/demo_data/queries``.

This is the live-only part of the main job (DESIGN.md section 13); archiving the first part
of the data and the live-and-archived queries join it when the archive and SLLAA land.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from engine.compiler import CompiledQuery, compile_query
from engine.events import Event
from engine.io import read_events
from engine.match import Match
from engine.matcher import Matcher

DATA = Path(__file__).resolve().parent / "demo_data"
STREAMS = ("bars_1m.csv", "traffic_slice.csv")


@dataclass
class QueryRun:
    """One demo query, its matcher and what it found."""

    query: CompiledQuery
    matcher: Matcher
    alerts: int = 0
    shown: int = 0
    examples: list[Match] = field(default_factory=list)


def load_stream(data_dir: Path = DATA) -> list[Event]:
    """Both bundled streams merged in (ts, id) order; ids renumbered to stay unique."""
    streams = [list(read_events(data_dir / name)) for name in STREAMS]
    merged = list(heapq.merge(*streams, key=lambda e: (e.ts, e.type)))
    return [Event(i, e.type, e.ts, e.attrs) for i, e in enumerate(merged, start=1)]


def load_queries(data_dir: Path = DATA) -> list[CompiledQuery]:
    """The demo queries (``*.lql``), compiled."""
    return [compile_query(p.read_text()) for p in sorted((data_dir / "queries").glob("*.lql"))]


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


def run_demo(*, speed: float = 0.0, show: int = 6, console: Console | None = None) -> dict[str, Any]:
    """Replay the bundled streams through the demo queries; print alerts and a summary.

    Parameters
    ----------
    speed : float
        Event-time seconds replayed per wall-clock second (0: as fast as possible).
    show : int
        Alerts printed per query (the rest are counted).
    console : rich Console, optional

    Returns
    -------
    dict
        ``events``, ``alerts`` (per query name), ``seconds`` (wall).
    """
    console = console or Console()
    t0 = time.perf_counter()
    events = load_stream()
    runs = [QueryRun(q, Matcher(q)) for q in load_queries()]
    console.print(
        f"[bold]LACE demo[/bold]: {len(events):,} real events "
        f"({', '.join(STREAMS)}) through {len(runs)} queries: {', '.join(str(r.query.name) for r in runs)}"
    )
    first_ts = events[0].ts if events else 0
    columns = (TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("events", total=len(events))
        for i, e in enumerate(events):
            if speed > 0:
                due = t0 + (e.ts - first_ts) / 1_000_000 / speed
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(min(wait, 1.0))
            for run in runs:
                if e.type in run.query.types:
                    _report(run, run.matcher.push(e), progress.console, show)
            if i % 2000 == 0:
                progress.update(task, completed=i + 1)
        for run in runs:
            _report(run, run.matcher.flush(), progress.console, show)
        progress.update(task, completed=len(events))
    seconds = time.perf_counter() - t0
    table = Table(title="summary")
    for col in ("query", "alerts", "partial matches created", "peak live"):
        table.add_column(col, justify="right" if col != "query" else "left")
    for run in runs:
        st = run.matcher.stats()
        table.add_row(str(run.query.name), f"{run.alerts:,}", f"{st['created']:,}", f"{st['peak_live']:,}")
    console.print(table)
    console.print(f"{len(events):,} events in {seconds:.1f} s ({len(events) / seconds:,.0f} events/s)")
    return {"events": len(events), "alerts": {str(r.query.name): r.alerts for r in runs}, "seconds": seconds}


def _report(run: QueryRun, matches: list[Match], console: Console, show: int) -> None:
    for m in matches:
        run.alerts += 1
        if run.shown < show:
            run.shown += 1
            console.print(f"[cyan]{_fmt_time(m.end)}[/cyan] [bold]{run.query.name}[/bold] {_fmt_fields(m.fields)}")
        elif run.shown == show:
            run.shown += 1
            console.print(f"[dim]{run.query.name}: further alerts are counted in the summary[/dim]")
