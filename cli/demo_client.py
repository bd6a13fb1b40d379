"""The HTTP side of ``lace demo`` (:mod:`cli.demo`; docs/architecture.md section 7.13): one run against a started
service and webhook receiver, as a user would drive it (``POST /event-types``, ``/queries``, ``/webhooks``,
``/events``; ``GET /queries/{id}``, ``/alerts``, ``/deliveries``), the alerts taken from the receiver with their
ingest-to-webhook latency (arrival minus the wall time at which the ``POST /events`` holding the alert's last
event was sent), and the wait until every query is idle and every alert delivered. Event times go out as epoch
milliseconds; inside they are int microseconds UTC. A refused request raises :class:`~cli.demo_streams.DemoError`.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cli.demo_report import _fmt_fields, _fmt_time, _iso_us
from cli.demo_streams import KEY, DemoError, DemoQuery
from engine.events import Event

if TYPE_CHECKING:  # rich is imported where the demo draws, not by every `lace` command
    from rich.console import Console


@dataclass
class QueryRun:
    """A registered demo query: its service id and what arrived for it."""

    query: DemoQuery
    id: int
    stream: str
    received: list[dict[str, Any]] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)
    shown: int = 0


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

    def end_stream(self, type_name: str) -> dict[str, Any]:
        """``POST /event-types/{type_name}/end``: the stream is over, its last windows and subwindows close; returns
        the answer (``queries`` closed, ``end_ts``, ...).

        Raises
        ------
        DemoError
            When the service refuses it.
        """
        return dict(self.request("POST", f"/event-types/{type_name}/end", 200))

    def register_types(self, events: Sequence[Event]) -> list[str]:
        from cli.replay import infer_event_types

        names = []
        for t in infer_event_types(events, KEY):
            body = {"name": t.name, "attributes": dict(t.attributes), "partition_key": t.partition_key}
            self.request("POST", "/event-types", 201, json=body)
            names.append(t.name)
        return names

    def register_query(self, q: DemoQuery, stream: str, tolerance_us: int) -> QueryRun:
        body: dict[str, Any] = {"text": q.text, "name": q.name}
        if q.reads_archive:
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
                if run.query.reads_archive:
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
