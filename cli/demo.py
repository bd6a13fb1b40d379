"""``lace demo``: the product as users use it (docs/architecture.md section 7.13), on bundled real data.

The bundled data (``cli/demo_data``, attribution in its README.md) are two real streams:
1-minute trade bars of AIG, BAC, IBM and SPY in the week of 2013-10-07 (QuantConnect LEAN
sample data) and two weeks of 5-minute traffic readings of 40 Aarhus road segments
(CityPulse / Open Data Aarhus). The "same hour on previous days" query joins on
``hour_of_day(ts)``, a built-in function plug-in (engine/plugins).

What the demo does, all of it over HTTP as a user would (:func:`run_demo`):

1. starts ``lace serve`` as a child process on the embedded defaults (a SQLite file and a Delta
   archive in a temporary directory, 127.0.0.1 and a free port, its own admin key; see
   :mod:`cli.service_process`), and a local webhook receiver that verifies every signature
   (:mod:`cli.webhook_receiver`);
2. registers the event types, inferred from the data (``POST /event-types``);
3. posts the streams one after the other, each in event-time order (``POST /events``): its archived
   part (before :data:`SPLITS`), then registers its queries (``POST /queries``; the live-and-archived
   ones with SLLAA and ``--tolerance``) with one webhook each (``POST /webhooks``), then its live part
   in batches, then ends the stream (``POST /event-types/{name}/end``: its watermark moves to the end of
   time), which closes its last windows and SLLAA subwindows without a fake event or a wait for the
   service's idle-type rules. The bars (2013) are older than the traffic (2014): posting
   stream by stream keeps every post in time order (whether the service keeps one event-time clock
   for all types or one per type), and a query registered after its stream's archived part sees only the live part live
   (its archived side reads the rest from the service's Delta archive, through the service's Spark,
   which the service starts in the background when the first live-and-archived query is registered);
4. prints alerts as the receiver gets them (a few per query, the rest counted), waits until every
   query is idle and every alert delivered, prints a summary (alerts per query, archive requests,
   webhook deliveries, ingest-to-webhook latency p50/p99, the live posting rate, each step's time),
   stops the service (SIGTERM) and removes the temporary directory.

Ingest-to-webhook latency of an alert: its arrival at the receiver minus the wall time at which the
``POST /events`` holding its last event was sent.

The bundled data and queries are :mod:`cli.demo_streams`, the HTTP side of a run :mod:`cli.demo_client`, what is
printed :mod:`cli.demo_report`; every public name stays importable from here.
"""
from __future__ import annotations

import shutil
import signal
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from cli.app import app, fail
from cli.app import console as app_console
from cli.demo_client import QueryRun, _Demo, _post_paced
from cli.demo_report import _fmt_time, _summary, percentile
from cli.demo_streams import (
    DATA,
    DAY_US,
    HOUR_US,
    KEY,
    SPLITS,
    STREAMS,
    DemoError,
    DemoQuery,
    Stream,
    load_demo_queries,
    load_queries,
    load_stream,
    plan_streams,
    split_stream,
)
from engine.events import Event

if TYPE_CHECKING:  # rich is imported where the demo draws, not by every `lace` command
    from rich.console import Console

__all__ = [
    "ARCHIVE_BATCH",
    "DATA",
    "DAY_US",
    "HOUR_US",
    "IDLE_TIMEOUT_S",
    "KEY",
    "LIVE_BATCH",
    "SPLITS",
    "STREAMS",
    "DemoError",
    "DemoQuery",
    "QueryRun",
    "Stream",
    "demo",
    "load_demo_queries",
    "load_queries",
    "load_stream",
    "percentile",
    "plan_streams",
    "run_demo",
    "split_stream",
]

LIVE_BATCH = 1_000
"""Events per ``POST /events`` of the live part."""
ARCHIVE_BATCH = 5_000
"""Events per ``POST /events`` of the archived part."""
IDLE_TIMEOUT_S = 300.0


@contextmanager
def _workdir(workdir: Path | None) -> Iterator[Path]:
    if workdir is not None:
        yield workdir
        return
    tmp = Path(tempfile.mkdtemp(prefix="lace-demo-"))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_demo(
    *,
    speed: float = 0.0,
    show: int = 6,
    tolerance_s: float = 14_400.0,
    console: Console | None = None,
    workdir: Path | None = None,
    events: list[Event] | None = None,
    splits: dict[str, int] = SPLITS,
    queries: Sequence[DemoQuery] | None = None,
    batch: int = LIVE_BATCH,
    settings: dict[str, Any] | None = None,
    idle_timeout_s: float = IDLE_TIMEOUT_S,
) -> dict[str, Any]:
    """Run the demo (module docstring): start the service, post the streams, print alerts and a summary.

    Parameters
    ----------
    speed : float
        Event-time seconds posted per wall-clock second in the live parts (0: as fast as possible).
    show : int
        Alerts printed per query (the rest are counted).
    tolerance_s : float
        SLLAA's tolerated delay ``T_L`` of the live-and-archived queries, event-time seconds.
    console : rich Console, optional
    workdir : Path, optional
        The service's data directory (default: a temporary directory, removed at the end).
    events : list of Event, optional
        The events (default :func:`load_stream`): ids unique, in (ts, id) order per type.
    splits : dict
        Per type, the time before which its events are archived up front (int microseconds UTC).
    queries : list of DemoQuery, optional
        Default :func:`load_demo_queries`.
    batch : int
        Events per ``POST /events`` of the live parts.
    settings : dict, optional
        More service settings (``LACE_*`` names without the prefix) over the embedded defaults.
    idle_timeout_s : float
        How long to wait, after the last post, for the queries to finish and the alerts to arrive.

    Returns
    -------
    dict
        ``events``, ``archived``, ``live`` (event counts); ``ended`` (the types whose streams were ended);
        ``alerts`` (per query, the service's ``GET /alerts``), ``delivered`` (per query, deliveries verified by
        the receiver),
        ``received`` (per query, the delivered alert bodies), ``archive_requests`` (per
        live-and-archived query), ``webhooks`` (receiver counts: received, verified, refused,
        redelivered), ``latency_ms`` (``p50``, ``p99``, ``n``; and per query), ``live_events_per_s``,
        ``seconds`` (wall: ``total``, ``service_start``, ``archived``, ``live``, ``finish``, ``stop``).

    Raises
    ------
    DemoError
        When the service refuses a request, stops, or does not finish within ``idle_timeout_s``.
    """
    console = console or app_console()
    t_total = time.perf_counter()
    events = load_stream() if events is None else events
    archived, live = split_stream(events, splits)
    queries = list(load_demo_queries() if queries is None else queries)
    streams = plan_streams(archived, live, queries)
    tolerance_us = round(tolerance_s * 1_000_000)
    console.print(
        f"[bold]LACE demo[/bold]: {len(events):,} real events ({', '.join(s.type for s in streams)}); "
        f"{len(queries)} queries: {', '.join(q.name for q in queries)}"
    )
    split_text = ", ".join(f"{t} before {_fmt_time(ts)}" for t, ts in splits.items())
    console.print(f"archived part: {len(archived):,} events ({split_text}); live part: {len(live):,} events")
    with _workdir(workdir) as wd:
        return _run(
            wd, console, streams, events, archived, live, queries,
            speed=speed, show=show, tolerance_s=tolerance_s, tolerance_us=tolerance_us, batch=batch,
            settings=settings, idle_timeout_s=idle_timeout_s, t_total=t_total,
        )


def _run(
    wd: Path, console: Console, streams: list[Stream], events: list[Event], archived: list[Event],
    live: list[Event], queries: list[DemoQuery], *, speed: float, show: int, tolerance_s: float, tolerance_us: int,
    batch: int, settings: dict[str, Any] | None, idle_timeout_s: float, t_total: float,
) -> dict[str, Any]:
    from cli.service_process import ServiceProcess
    from cli.webhook_receiver import WebhookReceiver

    seconds: dict[str, float] = {"archived": 0.0, "live": 0.0}
    receiver = WebhookReceiver()
    service = ServiceProcess(wd / "service", settings)
    last_id = max(e.id for e in events) + len(streams)
    receiver.start()
    try:
        with console.status("starting lace serve (SQLite and Delta archive in a temporary directory)"):
            t = time.perf_counter()
            service.start()
            seconds["service_start"] = time.perf_counter() - t
        console.print(
            f"lace serve on {service.base} (data in {service.data_dir}) ready in {seconds['service_start']:.1f} s; "
            f"webhook receiver on 127.0.0.1:{receiver.port}"
        )
        with service.client() as client:
            demo = _Demo(client, receiver, service, console, show, last_id)
            types = demo.register_types(events)
            console.print(f"event types registered: {', '.join(types)} (inferred from the data, key {KEY!r})")
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            columns = (TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            ended: list[str] = []
            with Progress(*columns, console=console, transient=False) as progress:
                demo.out = progress.console
                for s in streams:
                    task = progress.add_task(f"{s.type}: archived part", total=len(s.archived))
                    t = time.perf_counter()
                    for i in range(0, len(s.archived), ARCHIVE_BATCH):
                        part = s.archived[i : i + ARCHIVE_BATCH]
                        demo.post_events(part)
                        progress.advance(task, len(part))
                    seconds["archived"] += time.perf_counter() - t
                    for q in s.queries:
                        run = demo.register_query(q, s.type, tolerance_us)
                        kind = f"live-and-archived, SLLAA T_L = {tolerance_s:g} s" if q.reads_archive else "live"
                        hook = receiver.hook_url(f"q{run.id}")
                        progress.console.print(f"registered {q.name} ({kind}), webhook {hook}")
                    task = progress.add_task(f"{s.type}: live part", total=len(s.live))
                    t = time.perf_counter()
                    _post_paced(demo, s.live, batch=batch, speed=speed, advance=partial(progress.advance, task))
                    seconds["live"] += time.perf_counter() - t
                    # the stream is over: ending it closes its last windows and SLLAA subwindows
                    closed = demo.end_stream(s.type)
                    ended.append(s.type)
                    progress.console.print(
                        f"ended the {s.type} stream (POST /event-types/{s.type}/end): closes "
                        f"{', '.join(closed['queries']) or 'no query'}"
                    )
                with console.status("waiting for the queries to finish and every alert to be delivered") as status:
                    t = time.perf_counter()
                    alerts = demo.wait_idle(idle_timeout_s, report=status.update)
                    seconds["finish"] = time.perf_counter() - t
            runs = list(demo.runs.values())
            stats = {r.query.name: demo.stats(r) for r in runs}
        t = time.perf_counter()
        code = service.stop()
        seconds["stop"] = time.perf_counter() - t
        if code not in (0, None, -signal.SIGTERM):  # uvicorn re-raises the SIGTERM it handled
            console.print(f"[yellow]lace serve exited with {code}[/yellow]:\n{service.log_tail(1_000)}")
    finally:
        service.stop()
        receiver.stop()
    seconds["total"] = time.perf_counter() - t_total
    return _summary(console, runs, stats, alerts, receiver, seconds, events, archived, live, ended, tolerance_s)


@app.command()
def demo(
    speed: float = typer.Option(0.0, help="event-time seconds posted per wall second (0: as fast as possible)"),
    show: int = typer.Option(6, help="alerts printed per query; the rest are counted"),
    tolerance: float = typer.Option(
        14_400.0, help="SLLAA's tolerated delay T_L for the live-and-archived queries, event-time seconds"
    ),
) -> None:
    """The main job, as a user runs it: start the service in a temporary directory, register the bundled
    real data's event types and five queries over REST, post the archived part then the live part through
    POST /events, receive the alerts on a local webhook receiver that checks their signatures, print them
    and a summary (needs Java 17: the service reads its archive with Spark)."""

    if speed < 0:
        fail("--speed must be >= 0")
    if tolerance < 0:
        fail("--tolerance must be >= 0")
    if show < 0:
        fail("--show must be >= 0")
    if shutil.which("java") is None:
        fail("lace demo needs Java 17 on PATH (Spark reads the archive); e.g. apt-get install openjdk-17-jre-headless")
    # SIGTERM unwinds like Ctrl-C: the service child is stopped and the temporary directory removed
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        run_demo(speed=speed, show=show, tolerance_s=tolerance)
    except DemoError as e:
        fail(str(e), code=1)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)
