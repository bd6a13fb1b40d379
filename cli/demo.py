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
   in batches, then one later *sentinel* event of its type (a key that matches nothing) that closes
   its last windows and SLLAA subwindows. The bars (2013) are older than the traffic (2014): posting
   stream by stream keeps every post in time order (whether the service keeps one event-time clock
   for all types or one per type), the sentinel closes a stream's windows without waiting for the
   service's idle-type rules, and a query registered after its stream's archived part sees only the live part live
   (its archived side reads the rest from the service's Delta archive, through the service's Spark,
   which the service starts in the background when the first live-and-archived query is registered);
4. prints alerts as the receiver gets them (a few per query, the rest counted), waits until every
   query is idle and every alert delivered, prints a summary (alerts per query, archive requests,
   webhook deliveries, ingest-to-webhook latency p50/p99, the live posting rate, each step's time),
   stops the service (SIGTERM) and removes the temporary directory.

Ingest-to-webhook latency of an alert: its arrival at the receiver minus the wall time at which the
``POST /events`` holding its last event was sent.
"""
from __future__ import annotations

import heapq
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.app import app, fail
from engine.detector import Statement, is_live_archived
from engine.detector import compile as compile_statement
from engine.events import Event
from engine.io import read_events

DATA = Path(__file__).resolve().parent / "demo_data"
STREAMS = ("bars_1m.csv", "traffic_slice.csv")
HOUR_US = 3_600_000_000
DAY_US = 24 * HOUR_US
KEY = "key"
"""The partition key attribute of every demo event type."""
LIVE_BATCH = 1_000
"""Events per ``POST /events`` of the live part."""
ARCHIVE_BATCH = 5_000
"""Events per ``POST /events`` of the archived part."""
IDLE_TIMEOUT_S = 300.0


def _utc_us(year: int, month: int, day: int) -> int:
    return int(datetime(year, month, day, tzinfo=UTC).timestamp()) * 1_000_000


SPLITS: dict[str, int] = {
    "bar": _utc_us(2013, 10, 9),  # Monday and Tuesday archived; Wednesday to Friday live
    "traffic": _utc_us(2014, 8, 11),  # 2014-08-01 .. 10 archived; 11 .. 14 live
}
"""Per event type: events before this time (int microseconds UTC) are archived up front, the rest posted live."""


class DemoError(RuntimeError):
    """The demo cannot go on (the service refused a request, stopped, or did not finish in time)."""


@dataclass(frozen=True)
class DemoQuery:
    """A demo query: its name, LQL text and compiled statement."""

    name: str
    text: str
    statement: Statement

    @property
    def live_archived(self) -> bool:
        return is_live_archived(self.statement)

    @property
    def types(self) -> frozenset[str]:
        return frozenset(self.statement.stream_types)

    @property
    def window_us(self) -> int | None:
        st: Any = self.statement
        return st.live.window_us if self.live_archived else st.window_us


@dataclass
class Stream:
    """The events of one type: the archived part, the live part, and the queries registered after its archived part."""

    type: str
    archived: list[Event]
    live: list[Event]
    queries: list[DemoQuery] = field(default_factory=list)

    @property
    def first_ts(self) -> int:
        return (self.archived or self.live)[0].ts

    @property
    def last_ts(self) -> int:
        return (self.live or self.archived)[-1].ts


@dataclass
class QueryRun:
    """A registered demo query: its service id and what arrived for it."""

    query: DemoQuery
    id: int
    stream: str
    received: list[dict[str, Any]] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)
    shown: int = 0


# ---------------------------------------------------------------------------- data


def load_stream(data_dir: Path = DATA) -> list[Event]:
    """Both bundled streams merged in (ts, id) order; ids renumbered to stay unique."""
    streams = [list(read_events(data_dir / name)) for name in STREAMS]
    merged = list(heapq.merge(*streams, key=lambda e: (e.ts, e.type)))
    return [Event(i, e.type, e.ts, e.attrs) for i, e in enumerate(merged, start=1)]


def split_stream(events: list[Event], splits: dict[str, int] = SPLITS) -> tuple[list[Event], list[Event]]:
    """``(archived, live)``: each event goes to the archive when it is before its type's split time."""
    archived: list[Event] = []
    live: list[Event] = []
    for e in events:
        (archived if e.ts < splits.get(e.type, 0) else live).append(e)
    return archived, live


def load_demo_queries(data_dir: Path = DATA) -> list[DemoQuery]:
    """The demo queries (``queries/*.lql``), by file name, compiled (named by their NAME, else the file)."""
    out: list[DemoQuery] = []
    for p in sorted((data_dir / "queries").glob("*.lql")):
        text = p.read_text(encoding="utf-8")
        statement = compile_statement(text)
        out.append(DemoQuery(str(statement.name or p.stem), text, statement))
    return out


def load_queries(data_dir: Path = DATA) -> list[Statement]:
    """The demo queries compiled: a CompiledQuery (live-only) or a LiveArchivedPlan each."""
    return [q.statement for q in load_demo_queries(data_dir)]


def plan_streams(archived: list[Event], live: list[Event], queries: Sequence[DemoQuery]) -> list[Stream]:
    """The streams in posting order (by first event time), each with the queries registered after its
    archived part (a query goes with the last-posted stream of its types).

    Raises
    ------
    DemoError
        When two streams overlap in event time (posting one after the other would make events late),
        or a query reads a type the data does not have.
    """
    by_type: dict[str, Stream] = {}
    for part, events in (("archived", archived), ("live", live)):
        for e in events:
            s = by_type.get(e.type) or by_type.setdefault(e.type, Stream(e.type, [], []))
            getattr(s, part).append(e)
    streams = sorted(by_type.values(), key=lambda s: s.first_ts)
    for a, b in zip(streams, streams[1:]):
        if b.first_ts <= a.last_ts:
            raise DemoError(f"streams {a.type} and {b.type} overlap in event time; the demo posts one after the other")
    order = {s.type: i for i, s in enumerate(streams)}
    for q in queries:
        missing = sorted(q.types - set(order))
        if missing:
            raise DemoError(f"query {q.name} reads {', '.join(missing)}, which the data does not have")
        streams[max(order[t] for t in q.types)].queries.append(q)
    return streams


def sentinel(template: Event, ts: int, eid: int, keys: set[Any]) -> Event:
    """An event of ``template``'s type at ``ts`` that matches nothing: a key no event has, other values zeroed."""
    attrs: dict[str, Any] = {}
    for name, value in template.attrs.items():
        if name == KEY:
            value = "~sentinel~" if isinstance(value, str) else min(k for k in keys if isinstance(k, int | float)) - 1
        elif isinstance(value, bool):
            value = False
        elif isinstance(value, int | float):
            value = type(value)(0)
        elif isinstance(value, str):
            value = ""
        attrs[name] = value
    return Event(eid, template.type, ts, attrs)


# ---------------------------------------------------------------------------- formatting


def _fmt_time(ts_us: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts_us // 1_000_000))


def _fmt_fields(fields: dict[str, Any]) -> str:
    parts = []
    for k, v in fields.items():
        if isinstance(v, int) and not isinstance(v, bool) and v > 10**15:  # a timestamp in microseconds
            v = _fmt_time(v)
        elif isinstance(v, float):
            v = f"{v:.4g}"
        parts.append(f"{k}={v}")
    return " ".join(parts)


def _iso_us(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1_000_000)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank ``q`` quantile (0..1) of ``values``; 0.0 when empty."""
    if not values:
        return 0.0
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


# ---------------------------------------------------------------------------- the run


class _Demo:
    """One run of the demo against a started service and receiver (see :func:`run_demo`)."""

    def __init__(self, client: Any, receiver: Any, service: Any, console: Console, show: int, last_id: int) -> None:
        self.c = client
        self.receiver = receiver
        self.service = service
        self.console = console
        self.out = console
        self.show = show
        self.runs: dict[str, QueryRun] = {}
        self.posted_at: list[float] = [0.0] * (last_id + 1)
        self.posts = 0

    # ------------------------------------------------------------------ requests

    def request(self, method: str, path: str, expect: int, **kw: Any) -> Any:
        r = self.c.request(method, path, **kw)
        if r.status_code != expect:
            self.service.check()
            raise DemoError(f"{method} {path} answered {r.status_code}: {r.text[:500]}")
        return r.json() if r.content else None

    def post_events(self, events: Sequence[Event]) -> None:
        import orjson

        body = orjson.dumps([{"id": e.id, "type": e.type, "ts": e.ts // 1_000, "attrs": e.attrs} for e in events])
        at = time.time()
        doc = self.request("POST", "/events", 200, content=body, headers={"Content-Type": "application/json"})
        if doc["rejected"] or doc["query_late"] or doc.get("duplicates"):
            problems = doc["rejections"] or doc["query_late"] or [f"duplicate ids {doc['duplicates'][:3]}"]
            raise DemoError(f"the service refused events: {problems[:3]}")
        posted = self.posted_at
        for e in events:
            posted[e.id] = at
        self.posts += 1

    def register_types(self, events: Sequence[Event]) -> list[str]:
        from cli.replay import infer_event_types

        names = []
        for t in infer_event_types(events, KEY):
            body = {"name": t.name, "attributes": dict(t.attributes), "partition_key": t.key}
            self.request("POST", "/event-types", 201, json=body)
            names.append(t.name)
        return names

    def register_query(self, q: DemoQuery, stream: str, tolerance_us: int) -> QueryRun:
        body: dict[str, Any] = {"text": q.text, "name": q.name}
        if q.live_archived:
            body |= {"algorithm": "sllaa", "tolerance": f"{tolerance_us} us"}
        created = self.request("POST", "/queries", 201, json=body)
        run = QueryRun(q, created["id"], stream)
        hook = f"q{run.id}"
        wh = self.request("POST", "/webhooks", 201, json={"query_id": run.id, "url": self.receiver.hook_url(hook)})
        self.receiver.add_secret(hook, wh["secret"])
        self.runs[hook] = run
        return run

    # ------------------------------------------------------------------ alerts

    def drain(self) -> None:
        """Take the deliveries that arrived: latency, and print the first ``show`` per query."""
        q = self.receiver.arrivals
        while not q.empty():
            d = q.get_nowait()
            run = self.runs.get(d.hook)
            if run is None:
                continue
            body = d.body
            run.received.append(body)
            sent = max((self.posted_at[i] for ids in body["events"].values() for i in ids
                        if 0 <= i < len(self.posted_at)), default=0.0)
            if sent:
                run.latency_s.append(d.at_s - sent)
            if run.shown < self.show:
                run.shown += 1
                end = _fmt_time(_iso_us(body["end"]))
                self.out.print(f"[cyan]{end}[/cyan] [bold]{run.query.name}[/bold] {_fmt_fields(body['fields'])}")
            elif run.shown == self.show:
                run.shown += 1
                self.out.print(f"[dim]{run.query.name}: further alerts are counted in the summary[/dim]")

    def stats(self, run: QueryRun) -> dict[str, Any]:
        return dict(self.request("GET", f"/queries/{run.id}", 200)["stats"] or {})

    def count_alerts(self, run: QueryRun) -> int:
        n, cursor = 0, None
        while True:
            params: dict[str, Any] = {"query_id": run.id, "limit": 1000}
            if cursor:
                params["cursor"] = cursor
            page = self.request("GET", "/alerts", 200, params=params)
            n += len(page["items"])
            cursor = page["next_cursor"]
            if not cursor:
                return n

    def wait_idle(self, timeout_s: float, report: Callable[[str], None] | None = None) -> dict[str, int]:
        """Until every live-and-archived query matched what it got and answered every archive request, and
        no delivery is pending; returns the alerts per query (``GET /alerts``). ``report(text)`` gets the
        progress (archive requests in flight, live instances waiting, alerts received) on each poll.

        Raises
        ------
        DemoError
            On timeout, or when a delivery is dead-lettered.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            self.service.check()
            self.drain()
            in_flight = waiting = backlog = 0
            for run in self.runs.values():
                if run.query.live_archived:
                    la = self.stats(run)["live_archived"]
                    in_flight += la["requests_in_flight"]
                    waiting += la["pending_live_instances"]
                    backlog += la["backlog_events"]
            if report is not None:
                report(
                    f"waiting: {in_flight} archive requests in flight, {waiting} live instances before their "
                    f"subwindow closes, {backlog} events queued; {self.receiver.accepted():,} alerts received"
                )
            if not (in_flight or waiting or backlog):
                pending = self.request("GET", "/deliveries", 200, params={"status": "pending", "limit": 1})
                dead = self.request("GET", "/deliveries", 200, params={"status": "dead", "limit": 1})
                if dead["items"]:
                    raise DemoError(f"a delivery was dead-lettered: {dead['items'][0]}")
                if not pending["items"]:
                    alerts = {run.query.name: self.count_alerts(run) for run in self.runs.values()}
                    if self.receiver.accepted() >= sum(alerts.values()):
                        self.drain()
                        return alerts
            if time.monotonic() > deadline:
                raise DemoError(f"the queries were not idle with every alert delivered after {timeout_s:g} s")
            time.sleep(0.2)


def _post_paced(
    demo: _Demo, events: Sequence[Event], *, batch: int, speed: float, advance: Callable[[int], None]
) -> None:
    """Post ``events`` in batches of at most ``batch``; with ``speed`` > 0, at ``speed`` event-time seconds per wall
    second (what is due every 0.1 s); ``advance(n)`` after each post."""
    if not events:
        return
    started = time.perf_counter()
    first = events[0].ts
    i, n = 0, len(events)
    while i < n:
        if speed > 0:
            due_ts = first + (time.perf_counter() - started) * speed * 1_000_000
            j = i
            while j < n and j - i < batch and events[j].ts <= due_ts:
                j += 1
            if j == i:
                wait = (events[i].ts - first) / 1_000_000 / speed - (time.perf_counter() - started)
                demo.drain()
                time.sleep(min(max(wait, 0.0), 0.1))
                continue
        else:
            j = min(i + batch, n)
        demo.post_events(events[i:j])
        advance(j - i)
        demo.drain()
        i = j


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
        ``events``, ``archived``, ``live``, ``sentinels`` (event counts); ``alerts`` (per query, the
        service's ``GET /alerts``), ``delivered`` (per query, deliveries verified by the receiver),
        ``received`` (per query, the delivered alert bodies), ``archive_requests`` (per
        live-and-archived query), ``webhooks`` (receiver counts: received, verified, refused,
        redelivered), ``latency_ms`` (``p50``, ``p99``, ``n``; and per query), ``live_events_per_s``,
        ``seconds`` (wall: ``total``, ``service_start``, ``archived``, ``live``, ``finish``, ``stop``).

    Raises
    ------
    DemoError
        When the service refuses a request, stops, or does not finish within ``idle_timeout_s``.
    """
    console = console or Console()
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
            columns = (TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            n_sentinels = 0
            with Progress(*columns, console=console, transient=False) as progress:
                demo.out = progress.console
                for k, s in enumerate(streams):
                    task = progress.add_task(f"{s.type}: archived part", total=len(s.archived))
                    t = time.perf_counter()
                    for i in range(0, len(s.archived), ARCHIVE_BATCH):
                        part = s.archived[i : i + ARCHIVE_BATCH]
                        demo.post_events(part)
                        progress.advance(task, len(part))
                    seconds["archived"] += time.perf_counter() - t
                    for q in s.queries:
                        run = demo.register_query(q, s.type, tolerance_us)
                        kind = f"live-and-archived, SLLAA T_L = {tolerance_s:g} s" if q.live_archived else "live"
                        hook = receiver.hook_url(f"q{run.id}")
                        progress.console.print(f"registered {q.name} ({kind}), webhook {hook}")
                    task = progress.add_task(f"{s.type}: live part", total=len(s.live))
                    t = time.perf_counter()
                    _post_paced(demo, s.live, batch=batch, speed=speed, advance=partial(progress.advance, task))
                    seconds["live"] += time.perf_counter() - t
                    # a later event closes the stream's last windows and subwindows, unless the next stream does
                    windows = [q.window_us or 0 for q in queries if s.type in q.types]
                    ts = s.last_ts + tolerance_us + max(windows, default=0) + DAY_US
                    if k + 1 == len(streams) or ts < streams[k + 1].first_ts:
                        keys = {e.attrs.get(KEY) for e in s.archived + s.live}
                        demo.post_events([sentinel((s.live or s.archived)[-1], ts, last_id - k, keys)])
                        n_sentinels += 1
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
    return _summary(console, runs, stats, alerts, receiver, seconds, events, archived, live, n_sentinels, tolerance_s)


def _summary(
    console: Console, runs: list[QueryRun], stats: dict[str, dict[str, Any]], alerts: dict[str, int], receiver: Any,
    seconds: dict[str, float], events: list[Event], archived: list[Event], live: list[Event], n_sentinels: int,
    tolerance_s: float,
) -> dict[str, Any]:
    table = Table(title="summary (webhooks: verified deliveries; p50/p99: ingest-to-webhook latency)")
    for col in ("query", "kind", "alerts", "webhooks", "archive req.", "p50 ms", "p99 ms"):
        table.add_column(col, justify="left" if col in ("query", "kind") else "right", no_wrap=col in ("query", "kind"))
    requests: dict[str, int] = {}
    per_query_latency: dict[str, dict[str, float]] = {}
    for run in runs:
        name = run.query.name
        la = stats[name].get("live_archived")
        if la is not None:
            requests[name] = la["archive_requests"]
        lat = {"p50": percentile(run.latency_s, 0.5) * 1e3, "p99": percentile(run.latency_s, 0.99) * 1e3}
        per_query_latency[name] = lat
        table.add_row(
            name, "live+archived" if la is not None else "live", f"{alerts[name]:,}", f"{len(run.received):,}",
            f"{la['archive_requests']:,}" if la is not None else "-", f"{lat['p50']:,.0f}", f"{lat['p99']:,.0f}",
        )
    console.print(table)
    latencies = [x for r in runs for x in r.latency_s]
    lat_ms = {"p50": percentile(latencies, 0.5) * 1e3, "p99": percentile(latencies, 0.99) * 1e3, "n": len(latencies)}
    rc = receiver.counts
    rate = len(live) / seconds["live"] if seconds["live"] > 0 else 0.0
    console.print(
        f"events: {len(events):,} ({len(archived):,} archived part, {len(live):,} live part, {n_sentinels} sentinels), "
        f"all through POST /events; archive requests: {sum(requests.values()):,} (SLLAA, T_L = {tolerance_s:g} s)"
    )
    console.print(
        f"webhook deliveries: {rc.received:,} received, {rc.verified:,} signature-verified alerts, "
        f"{rc.refused} refused, {rc.redelivered} redelivered; ingest-to-webhook latency p50 {lat_ms['p50']:,.0f} ms, "
        f"p99 {lat_ms['p99']:,.0f} ms"
    )
    console.print(
        f"time: service start {seconds['service_start']:.1f} s, archived part {seconds['archived']:.1f} s, "
        f"live part {seconds['live']:.1f} s ({rate:,.0f} events/s), finishing {seconds['finish']:.1f} s, "
        f"stop {seconds['stop']:.1f} s, total {seconds['total']:.1f} s"
    )
    return {
        "events": len(events),
        "archived": len(archived),
        "live": len(live),
        "sentinels": n_sentinels,
        "alerts": alerts,
        "delivered": {r.query.name: len(r.received) for r in runs},
        "received": {r.query.name: r.received for r in runs},
        "archive_requests": requests,
        "webhooks": {"received": rc.received, "verified": rc.verified, "refused": rc.refused,
                     "redelivered": rc.redelivered},
        "latency_ms": {**lat_ms, "queries": per_query_latency},
        "live_events_per_s": rate,
        "seconds": seconds,
    }


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
