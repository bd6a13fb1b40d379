"""The crash suite (issue 24): every statement kind on one real ``lace serve``, killed at seeded points, restarted on
the same data directory and database; its webhook alerts must equal a fault-free run's.

One service per run holds every statement of :mod:`bench.crash_workload` (one webhook each, on one
:class:`cli.webhook_receiver.WebhookReceiver` that checks signatures); the seeded stream is posted batch by batch,
then the harness waits until the service is quiet (no pending delivery, no live-and-archived backlog, no new alert
for 2 s). A fault-free run gives the expected alerts; each fault run kills the service at its faults:

- a crash point inside the service (:mod:`service.core.faults`, ``LACE_CRASH_AT=<point>:<n>``: the n-th pass
  SIGKILLs the service's process group, its live-and-archived workers and Spark too): ``ingest.after_wal`` and
  ``ingest.before_alert_commit`` (mid-request), ``archive.flush.before_commit`` and
  ``archive.flush.before_wal_delete`` (mid-archive flush), ``checkpoint.mid_transaction``, ``webhook.after_post``
  (mid-delivery), ``la.request_submitted`` (archive requests in flight), ``plan.switch.before_commit``;
- ``jump``: SIGKILL of the group right after the n-th batch after the 30-day event-time jump is acknowledged;
- ``end``: SIGKILL of the group right after the n-th end call (counted from 0) is acknowledged;
- ``switch``: SIGKILL of the group right after the n-th plan switch of the stream (``Stream.of_kind("switch")``,
  counted from 0) is acknowledged; ``plan.switch.before_commit`` (a crash point) kills inside one, the new plan
  running and its choice not committed;
- ``update``: SIGKILL of the group right after the n-th update (``PUT /queries/{id}?state=warm``,
  ``Stream.of_kind("update")``, counted from 0) is acknowledged;
- ``pause``, ``resume``: SIGKILL of the group right after the n-th pause or resume of a statement
  (``POST /queries/{id}/pause``, ``/resume``; ``Stream.of_kind``, counted from 0) is acknowledged;
- ``delay``: SIGKILL of the group a seeded wall-clock delay (0-3 s, ``delay_ms``) after the n-th batch is
  acknowledged, whatever the service is doing then: the kill does not wait for a steady state (issue 43: a SIGKILL
  one second after the POST that closed an SLLAA subwindow lost its result, where every named point passed);
- ``worker``: SIGKILL of the live-and-archived worker processes alone (the service's ``spawn`` children,
  :mod:`service.live.la_process`), a seeded wall-clock delay (0-3 s) after the n-th batch is acknowledged; the
  service goes on, restarts them and replays their queries from their acknowledged positions (no restart of the
  service: this fault costs no start);
- ``sigterm``: a clean stop before request n (a batch, or an end call).

The stream's batches are followed by the end of every ingested type's stream (``POST /event-types/{name}/end``), so
the end is crossed by every fault that fires after it and by restarts before it. After each fault the service is
started again on the same data directory and database (with the next fault armed), and the request that was not
acknowledged is posted again: a batch (events carry producer ids: a re-post is idempotent) or an end (an end that
took effect before the crash answers ``already_ended``). A run
fails a statement when an alert of the fault-free run is missing (lost), one arrives twice under two idempotency keys
(duplicated), or one differs in its fields or is not in the fault-free run at all (wrong); an idempotency key must
arrive with one payload; the service must start every time (failed starts). ``n`` of a crash point is drawn from
the passes the fault-free run made through it (``LACE_CRASH_TRACE``).

    python -m bench.crash --points 45 --seed 1 --db sqlite
    python -m bench.crash --points 45 --seed 1 --db postgresql --json crash.json

prints the table "Crash suite" (kind x point: lost / duplicated / wrong; failed starts per point) of
docs/benchmarks.md and the details of every failure. ``tests/crash/`` runs a few seeded points of the same harness.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.crash_workload import KINDS, STATEMENTS, TYPES, Control, Stream, make_stream
from cli.service_process import HARNESS_SETTINGS, Database, ServiceError, ServiceProcess, scratch_database
from cli.webhook_receiver import WebhookReceiver
from service.core import faults

IMPORT_POINTS = ("results.import.before_commit", "results.import.after_commit")
"""Crash points the workload does not pass (it imports no results; tests/crash/test_results_import_crash.py kills
there)."""
POINTS: dict[str, str] = {
    **{p: where for p, where in faults.POINTS.items() if p not in IMPORT_POINTS},
    "jump": "SIGKILL right after the 30-day event-time jump",
    "end": "SIGKILL right after a stream's end (POST /event-types/{name}/end) is acknowledged",
    "switch": "SIGKILL right after a plan switch (POST /queries/{id}/plan) is acknowledged",
    "update": "SIGKILL right after an update with state=warm (PUT /queries/{id}?state=warm) is acknowledged",
    "pause": "SIGKILL right after a pause (POST /queries/{id}/pause) is acknowledged",
    "resume": "SIGKILL right after a resume (POST /queries/{id}/resume) is acknowledged",
    "delay": "SIGKILL 0-3 s (seeded) after a batch is acknowledged",
    "worker": "SIGKILL of the worker processes alone 0-3 s (seeded) after a batch is acknowledged",
    "sigterm": "SIGTERM (a clean stop) between two requests",
}
"""The fault points, in the table's column order: the service's crash points (``service.core.faults.POINTS``), then
the harness's own."""
CONTROL_POINTS = ("switch", "update", "pause", "resume")
"""Harness points that kill right after the n-th :class:`bench.crash_workload.Control` of their kind."""
HARNESS_POINTS = ("jump", "end", *CONTROL_POINTS, "delay", "worker", "sigterm")
"""Points the harness makes (the others are crash points inside the service)."""
MARK = "LACE_CRASH_AT: pass"
"""What the service logs when a crash point fires (service/core/faults.py)."""

SETTINGS: dict[str, Any] = {
    **HARNESS_SETTINGS,
    # no type goes idle on the wall clock (a restart must not change which watermark a statement follows)
    "idle_timeout_s": 3_600,
    "archive_maintenance_interval_s": 0,
}


@dataclass(frozen=True)
class Fault:
    """``point`` and ``at``: the pass through a crash point that kills (counted from the service's start), the
    request (the batches, then the end calls: :attr:`Stream.steps`) before which ``sigterm`` stops the service, how
    many batches after the jump's ``jump`` kills it, after which end call (counted from 0) ``end`` kills it, or after
    which control of its kind (``Stream.of_kind``, from 0) ``switch``, ``update``, ``pause`` or ``resume`` kills it
    (a harness fault waiting behind an earlier one comes at the first request at or after its own)."""

    point: str
    at: int
    delay_ms: int = 0
    """``delay``: wall milliseconds from the n-th batch's answer to the SIGKILL."""

    def __str__(self) -> str:
        return f"{self.point}:{self.at}" + (f"+{self.delay_ms}ms" if self.point in ("delay", "worker") else "")


Alert = tuple[str, str, str, str]
"""What an alert says: its event ids, start, end and fields (JSON, keys sorted); alert id and times differ by run."""


@dataclass
class Outcome:
    """What one run delivered and what happened to the service on the way."""

    alerts: dict[str, list[Alert]] = field(default_factory=dict)
    """Per statement, one alert per idempotency key."""
    key_conflicts: list[str] = field(default_factory=list)
    """Idempotency keys that arrived with two different payloads."""
    starts: int = 0
    failed_starts: list[str] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)
    not_reached: list[str] = field(default_factory=list)
    unplanned: list[str] = field(default_factory=list)
    """Exits and hangs no fault asked for."""
    rejected: list[str] = field(default_factory=list)
    """Events the service refused (none in a fault-free run; a re-post's may be)."""
    ended: dict[str, bool] = field(default_factory=dict)
    """Per ingested type, ``already_ended`` of the end call that was acknowledged (True: an end posted again after
    a crash had taken effect before it)."""
    not_quiet: bool = False
    busy: str = ""
    """Why the service was last seen busy while the run waited for it to be quiet."""
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    setup_passes: dict[str, int] = field(default_factory=dict)
    """Per crash point, the passes made while the statements were registered (a traced run only)."""
    post_s: list[float] = field(default_factory=list)
    """Wall seconds of each POST /events."""
    start_s: list[float] = field(default_factory=list)
    """Wall seconds of each start, until /healthz answers."""
    """Wall seconds from the run's start to: started, set up, posted, quiet."""
    log: str = ""
    log_lines: list[str] = field(default_factory=list)
    """Errors and warnings the service logged."""
    archived: dict[str, list[int]] = field(default_factory=dict)
    """Per event type (ingested and derived), the ids of the events its archive table holds after the run, sorted
    (an id twice when it is there twice)."""


class Run:
    """One run of the stream against one service on ``db`` and ``data_dir`` with ``faults`` (in order)."""

    def __init__(
        self, db: Database, data_dir: Path, stream: Stream, faults: Iterable[Fault], *, trace: Path | None = None,
        settings: dict[str, Any] | None = None, say: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.stream = stream
        self.pending = list(faults)
        self.say = say
        self.out = Outcome()
        self.rx = WebhookReceiver()
        self.svc = ServiceProcess(data_dir, {**SETTINGS, **(settings or {})}, db=db, own_group=True)
        if trace is not None:
            self.svc.env["LACE_CRASH_TRACE"] = str(trace)
        self.marks = 0
        self.ids: dict[str, int] = {}
        """Statement name -> query id (the same in every run: registered in the same order on a fresh database)."""
        self.controlled = dict.fromkeys(CONTROL_POINTS, -1)
        """Per control kind, the last one acknowledged (its index in ``Stream.of_kind(kind)``)."""

    # ------------------------------------------------------------------ the service's life

    def _marks(self) -> int:
        try:
            return self.svc.log_path.read_text(errors="replace").count(MARK)
        except OSError:
            return 0

    def _arm(self) -> None:
        f = self.pending[0] if self.pending else None
        if f is not None and f.point not in HARNESS_POINTS:
            self.svc.env["LACE_CRASH_AT"] = str(f)
        else:
            self.svc.env.pop("LACE_CRASH_AT", None)

    def _fired(self, how: str = "") -> None:
        f = self.pending.pop(0)
        self.out.fired.append(f"{f}{how}")
        self.say(f"  fault {f}{how}")

    def _gone(self) -> None:
        """The service died or stopped answering: reap it, attribute the exit to the armed fault or not."""
        proc = self.svc.proc
        assert proc is not None
        try:
            proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - alive but not answering: a hang
            self.out.unplanned.append("the service stopped answering (killed)")
        self.svc.kill()
        marks = self._marks()
        if marks > self.marks and self.pending and self.pending[0].point not in HARNESS_POINTS:
            self._fired()
        else:
            armed = self.pending[0] if self.pending else "no fault"
            self.out.unplanned.append(f"exit {proc.returncode} with {armed} armed")
        self.marks = marks
        self.start()

    def start(self) -> None:
        """Start the service (the next fault armed); a crash point that fires while it starts (the WAL's recovery
        flush) counts as fired, any other exit as a failed start."""
        for _ in range(5):
            self._arm()
            t = time.monotonic()
            try:
                self.svc.start(timeout_s=240)
                self.out.starts += 1
                self.out.start_s.append(round(time.monotonic() - t, 1))
                return
            except ServiceError as e:
                if self.svc.proc is not None and self.svc.proc.poll() is None:
                    self.svc.kill()
                marks = self._marks()
                if marks > self.marks and self.pending and self.pending[0].point not in HARNESS_POINTS:
                    self._fired(" (while starting)")
                else:
                    self.out.failed_starts.append(str(e)[-600:])
                self.marks = marks
        raise ServiceError("lace serve did not start five times in a row")

    # ------------------------------------------------------------------ the stream

    def setup(self, c: httpx.Client) -> None:
        """Register the types, every statement and a webhook per alerting statement."""
        for t in TYPES:
            r = c.post("/event-types", json=t)
            assert r.status_code == 201, r.text
        for s in STATEMENTS:
            r = c.post("/queries", json={"text": s.text, **s.options})
            assert r.status_code == 201, f"{s.name}: {r.text}"
            self.ids[s.name] = r.json()["id"]
            if s.alerts:
                wh = c.post("/webhooks", json={"query_id": r.json()["id"], "url": self.rx.hook_url(s.name)})
                assert wh.status_code == 201, wh.text
                self.rx.add_secret(s.name, wh.json()["secret"])

    def _request(
        self, what: str, path: str, body: Any = None, *, method: str = "POST", params: dict[str, str] | None = None
    ) -> httpx.Response | None:
        """``method`` ``body`` to ``path`` (``what`` names it); None when it was not acknowledged (the service died
        meanwhile, or answered other than 200: unplanned)."""
        t = time.monotonic()
        try:
            with self.svc.client(timeout_s=120) as c:
                r = c.request(method, path, json=body, params=params)
        except httpx.HTTPError:
            return None
        finally:
            self.out.post_s.append(round(time.monotonic() - t, 3))
        if r.status_code != 200:
            self.out.unplanned.append(f"{what}: HTTP {r.status_code} {r.text[:200]}")
            return None
        return r

    def post(self, i: int) -> bool:
        """POST batch ``i``, then the controls that follow it (:class:`Control`); False when one was not acknowledged
        (the service died meanwhile: the step is posted again, batch and controls)."""
        batch = self.stream.batches[i]
        r = self._request(f"batch {i}", "/events", batch)
        if r is None:
            return False
        why = Counter(
            f"{batch[x['index']]['type']} {x['reason'].split(':')[0]}"
            for x in r.json()["rejections"] if not x["reason"].startswith("dropped by filter")
        )
        if why:
            self.out.rejected.append(f"batch {i}: {sum(why.values())} refused ({dict(why)})")
        for c in self.stream.controls:  # in the order they are posted
            if c.after != i:
                continue
            if not self.control(c):
                return False
            self.controlled[c.kind] = self.stream.of_kind(c.kind).index(c)
        return True

    def control(self, c: Control) -> bool:
        """Post control ``c`` (a plan switch, an update with ``state=warm`` to the statement's own text, a pause or a
        resume); False when it was not acknowledged."""
        path = f"/queries/{self.ids[c.statement]}"
        if c.kind == "switch":
            return self._request(f"switch {c.statement} to {c.plan}", f"{path}/plan", {"plan": c.plan}) is not None
        if c.kind in ("pause", "resume"):
            return self._request(f"{c.kind} {c.statement}", f"{path}/{c.kind}") is not None
        s = next(s for s in STATEMENTS if s.name == c.statement)
        body = {"text": s.text, **s.options}
        return self._request(f"update {s.name}", path, body, method="PUT", params={"state": "warm"}) is not None

    def end(self, name: str) -> bool:
        """POST the end of type ``name``'s stream; False when it was not acknowledged (the service died meanwhile).
        An end that took effect before a crash answers ``already_ended`` when posted again (:attr:`Outcome.ended`)."""
        r = self._request(f"end of {name}", f"/event-types/{name}/end")
        if r is None:
            return False
        self.out.ended[name] = bool(r.json()["already_ended"])
        return True

    def step(self, i: int) -> bool:
        """Request ``i`` of the run (:attr:`Stream.steps`): a batch, then the end of each type; False when it was not
        acknowledged."""
        batches = len(self.stream.batches)
        return self.post(i) if i < batches else self.end(self.stream.ends[i - batches])

    def busy(self, c: httpx.Client) -> str:
        """Why the service is not quiet: pending deliveries, or a live-and-archived query with events, live
        instances or archive requests to finish ("" when it is quiet)."""
        if c.get("/deliveries", params={"status": "pending", "limit": 1}).json()["items"]:
            return "deliveries pending"
        for q in c.get("/queries").json():
            la = (q.get("stats") or {}).get("live_archived")
            if la and (la["backlog_events"] or la["requests_in_flight"] or la["pending_live_instances"]):
                return (f"{q['name']}: {la['backlog_events']} events, {la['pending_live_instances']} live instances, "
                        f"{la['requests_in_flight']} requests")
        return ""

    def settle(self, timeout_s: float) -> None:
        """Wait until the service is quiet: not busy and no new delivery for 2 s (a fault may still fire)."""
        deadline = time.monotonic() + timeout_s
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            assert self.svc.proc is not None
            if self.svc.proc.poll() is not None:
                self._gone()
                last = -1
                continue
            try:
                with self.svc.client(timeout_s=30) as c:
                    busy = self.busy(c)
            except httpx.HTTPError:
                time.sleep(0.2)
                continue
            now, got = time.monotonic(), len(self.rx.received)
            if busy != self.out.busy:
                self.say(f"  {now - deadline + timeout_s:.1f} s: {busy or 'quiet'}")
                self.out.busy = busy
            if busy or got != last:
                last, since = got, now
            elif now - since >= 2.0:
                return
            time.sleep(0.25)
        self.out.not_quiet = True

    def go(self, settle_s: float = 300.0) -> Outcome:
        started = time.monotonic()
        self.rx.start()
        try:
            self.start()
            self.out.phases["started"] = time.monotonic() - started
            with self.svc.client() as c:
                self.setup(c)
            self.out.phases["set up"] = time.monotonic() - started
            if "LACE_CRASH_TRACE" in self.svc.env:
                self.out.setup_passes = trace_counts(Path(self.svc.env["LACE_CRASH_TRACE"]))
            i = 0
            while i < self.stream.steps:
                f = self.pending[0] if self.pending else None
                if f is not None and f.point == "sigterm" and i >= f.at:
                    code = self.svc.stop()
                    self._fired(f" (exit {code})")
                    self.marks = self._marks()
                    self.start()
                    continue
                if not self.step(i):
                    self._gone()
                    continue
                kill_after = {"jump": self.stream.jump_batch, "end": len(self.stream.batches), "delay": 0, "worker": 0}
                if f is not None and f.point == "worker" and i >= f.at:
                    time.sleep(f.delay_ms / 1_000)
                    assert self.svc.proc is not None
                    self._fired(f" ({len(kill_workers(self.svc.proc.pid))} killed)")  # the service restarts them
                elif f is not None and (
                    (f.point in kill_after and i >= kill_after[f.point] + f.at)
                    or (f.point in self.controlled and self.controlled[f.point] >= f.at)
                ):
                    time.sleep(f.delay_ms / 1_000)  # the service goes on meanwhile: workers, checkpoints, deliveries
                    self.svc.kill()
                    self._fired()
                    self.start()
                i += 1
            self.out.phases["posted"] = time.monotonic() - started
            self.settle(settle_s)
            self.out.phases["quiet"] = time.monotonic() - started
        finally:
            self.svc.stop()
            self.rx.stop()
        self.out.archived = archived_ids(self.svc.data_dir / "archive")
        self.out.not_reached = [str(f) for f in self.pending]
        self.out.alerts, self.out.key_conflicts = delivered(self.rx)
        self.out.seconds = time.monotonic() - started
        self.out.log = str(self.svc.log_path)
        text = self.svc.log_path.read_text(errors="replace")
        self.out.log_lines = [ln for ln in text.splitlines() if re.search(r"ERROR|WARNING|Traceback|LACE_CRASH", ln)]
        return self.out


def kill_workers(service_pid: int) -> list[int]:
    """SIGKILL the live-and-archived worker processes of the service ``service_pid`` (its children started by
    ``multiprocessing``'s spawn, read from /proc); their pids."""
    import os
    import signal

    killed = []
    for task in Path(f"/proc/{service_pid}/task").glob("*/children"):
        for pid in task.read_text().split():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"spawn_main" in cmd and b"resource_tracker" not in cmd:
                os.kill(int(pid), signal.SIGKILL)
                killed.append(int(pid))
    return killed


def archived_ids(root: Path) -> dict[str, list[int]]:
    """Per Delta table under ``root`` (one per event type), the ids of its events, sorted (read with delta-rs)."""
    from deltalake import DeltaTable

    out: dict[str, list[int]] = {}
    for table in sorted(root.iterdir()) if root.is_dir() else []:
        if DeltaTable.is_deltatable(str(table)):
            ids = DeltaTable(str(table)).to_pyarrow_dataset().to_table(columns=["id"]).column("id").to_pylist()
            out[table.name] = sorted(ids)
    return out


def compare_archives(want: dict[str, list[int]], got: dict[str, list[int]]) -> dict[str, tuple[int, int, int]]:
    """Per event type whose archive differs from ``want``'s: (events missing, events archived twice or more
    often than in ``want``, events ``want`` does not have)."""
    out = {}
    for t in sorted(set(want) | set(got)):
        w, g = Counter(want.get(t, [])), Counter(got.get(t, []))
        missing = sum((w - g).values())
        extra = g - w
        unknown = sum(n for i, n in extra.items() if i not in w)
        twice = sum(extra.values()) - unknown
        if missing or twice or unknown:
            out[t] = (missing, twice, unknown)
    return out


def delivered(rx: WebhookReceiver) -> tuple[dict[str, list[Alert]], list[str]]:
    """Per statement (its webhook path), what each idempotency key delivered; the keys with two payloads."""
    out: dict[str, list[Alert]] = {}
    conflicts = []
    by_key: dict[str, tuple[str, set[bytes]]] = {}
    for rec in rx.ok():
        key = rec["headers"].get("idempotency-key", "")
        by_key.setdefault(key, (rec["path"].removeprefix("/hook/"), set()))[1].add(rec["body"])
    for key, (hook, bodies) in by_key.items():
        if len(bodies) > 1:
            conflicts.append(f"{hook} {key}: {len(bodies)} payloads")
        doc = json.loads(min(bodies))
        events, fields = json.dumps(doc["events"], sort_keys=True), json.dumps(doc["fields"], sort_keys=True)
        out.setdefault(hook, []).append((events, doc["start"], doc["end"], fields))
    return out, conflicts


# ---------------------------------------------------------------------------- comparison


def identity(a: Alert) -> str:
    """What makes two alerts the same result: their event ids; a window result (no events): window and group."""
    events, start, end, fields = a
    if events != "{}":
        return events
    return f"{start} {end} {json.loads(fields).get('key')}"


@dataclass
class Diff:
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)

    def counts(self) -> tuple[int, int, int]:
        return len(self.lost), len(self.duplicated), len(self.wrong)

    def __bool__(self) -> bool:
        return bool(self.lost or self.duplicated or self.wrong)


def compare(want: dict[str, list[Alert]], got: dict[str, list[Alert]]) -> dict[str, Diff]:
    """Per kind: the alerts of ``want`` missing from ``got``, those ``got`` has twice, and those that differ in
    their fields or are not in ``want``."""
    out = {k: Diff() for k in KINDS}
    for s in STATEMENTS:
        if not s.alerts:
            continue
        d = out[s.kind]
        expected = {identity(a): a for a in want.get(s.name, [])}
        seen = Counter(identity(a) for a in got.get(s.name, []))
        d.duplicated += [f"{s.name} {k} x{n}" for k, n in seen.items() if n > 1]
        d.lost += [f"{s.name} {k}" for k in expected if k not in seen]
        for a in got.get(s.name, []):
            k = identity(a)
            if k not in expected:
                d.wrong += [f"{s.name} {k} not in the fault-free run: {a[3]}"]
            elif expected[k] != a:
                d.wrong += [f"{s.name} {k}: {a[1:]} instead of {expected[k][1:]}"]
    return out


# ---------------------------------------------------------------------------- the table


def trace_counts(path: Path) -> dict[str, int]:
    """Per crash point, the most passes one process made through it (the fault-free run's trace)."""
    per: Counter[tuple[str, str]] = Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            name, _, pid = line.partition(" ")
            per[(name, pid)] += 1
    best: dict[str, int] = {}
    for (name, _), n in per.items():
        best[name] = max(best.get(name, 0), n)
    return best


def draw(
    rng: random.Random, point: str, passes: dict[str, int], stream: Stream, setup: dict[str, int] | None = None
) -> Fault:
    """A seeded fault at ``point``: a pass the fault-free run made after the statements were registered (``setup``:
    the passes before, plus one for a checkpoint timer that runs later; the harness does not register again after
    a crash), a request (a batch or an end call), or a batch after the jump."""
    if point == "sigterm":
        return Fault(point, rng.randrange(1, stream.steps))
    if point == "jump":
        return Fault(point, rng.randrange(0, 3))
    if point == "end":
        return Fault(point, rng.randrange(0, len(stream.ends)))
    if point in ("delay", "worker"):
        return Fault(point, rng.randrange(0, len(stream.batches)), rng.randrange(0, 3_001))
    if point in CONTROL_POINTS:
        return Fault(point, rng.randrange(0, max(1, len(stream.of_kind(point)))))
    lo = (setup or {}).get(point, 0) + 2 if (setup or {}).get(point) else 1
    return Fault(point, rng.randint(lo, max(lo, passes.get(point, 1))))


def one_run(kind: str, tmp: Path, stream: Stream, faults: list[Fault], **kw: Any) -> Outcome:
    """A run on a fresh database of ``kind`` (SQLite under ``tmp``, or a new PostgreSQL schema)."""
    tmp.mkdir(parents=True, exist_ok=True)
    with scratch_database(kind, tmp) as db:
        return Run(db, tmp / "data", stream, faults, **kw).go()


def table(
    rows: dict[str, dict[str, list[int]]], starts: dict[str, int], runs: dict[str, int],
    archive: dict[str, list[int]] | None = None,
) -> str:
    """Markdown: one row per kind, one column per point; a cell is ``lost/duplicated/wrong`` summed over its runs.
    Then failed starts, and the archive: events ``missing/twice/unknown`` against the fault-free run's, summed over
    every event type (ingested and derived) and the point's runs."""
    points = [p for p in POINTS if runs.get(p)]
    head = "| kind | " + " | ".join(f"{p} ({runs[p]})" for p in points) + " |"
    lines = [head, "|" + " --- |" * (len(points) + 1)]
    for k in KINDS:
        cells = ["/".join(str(x) for x in rows[k].get(p, [0, 0, 0])) for p in points]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines.append("| failed starts | " + " | ".join(str(starts.get(p, 0)) for p in points) + " |")
    if archive is not None:
        cells = ["/".join(str(x) for x in archive.get(p, [0, 0, 0])) for p in points]
        lines.append("| archive (missing/twice/unknown events) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a SIGTERM stops the run's service on the way out
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=45, help="fault runs (one fault each, the points in turn)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--seconds", type=int, default=600, help="event-time seconds of the stream")
    ap.add_argument("--only", default="", help="comma-separated points (default: all of them, in turn)")
    ap.add_argument("--json", type=Path, help="write every run's outcome here")
    ap.add_argument("--keep", type=Path, help="the runs' data directories and logs go here (default: a temporary one)")
    args = ap.parse_args(argv)
    stream = make_stream(args.seed, args.seconds)
    rng = random.Random(args.seed)
    points = args.only.split(",") if args.only else list(POINTS)
    base = args.keep or Path(tempfile.mkdtemp(prefix="lace-crash-"))
    print(f"stream: {stream.events} events in {len(stream.batches)} batches, the jump before batch "
          f"{stream.jump_batch}, then the end of {stream.ends}; runs under {base}", flush=True)
    trace = base / "trace.txt"
    clean = one_run(args.db, base / "clean", stream, [], trace=trace)
    passes = trace_counts(trace)
    print(f"fault-free run: {clean.seconds:.0f} s, alerts { {k: len(v) for k, v in sorted(clean.alerts.items())} }, "
          f"passes {passes}, refused {clean.rejected}", flush=True)
    again = one_run(args.db, base / "clean2", stream, [])
    nondet: dict[str, Any] = {k: d.counts() for k, d in compare(clean.alerts, again.alerts).items() if d}
    nondet.update({f"archive {t}": c for t, c in compare_archives(clean.archived, again.archived).items()})
    la = [sorted(clean.alerts.get(f"la_{a}", [])) for a in ("sllaa", "ollaa", "llaa", "alaa")]
    print(f"second fault-free run: {again.seconds:.0f} s, differs in {nondet or 'nothing'}; the four algorithms "
          f"agree: {all(x == la[0] for x in la)}", flush=True)
    rows: dict[str, dict[str, list[int]]] = {k: {} for k in KINDS}
    failed_starts: Counter[str] = Counter()
    archive_cells: dict[str, list[int]] = {}
    runs: Counter[str] = Counter()
    records = []
    for n in range(args.points):
        point = points[n % len(points)]
        fault = draw(rng, point, passes, stream, clean.setup_passes)
        got = one_run(args.db, base / f"run{n}", stream, [fault])
        runs[point] += 1
        failed_starts[point] += len(got.failed_starts)
        diffs = compare(clean.alerts, got.alerts)
        for k, d in diffs.items():
            cell = rows[k].setdefault(point, [0, 0, 0])
            for j, x in enumerate(d.counts()):
                cell[j] += x
        bad: dict[str, Any] = {k: d.counts() for k, d in diffs.items() if d}
        archive = compare_archives(clean.archived, got.archived)
        cell = archive_cells.setdefault(point, [0, 0, 0])
        for counts in archive.values():
            cell[:] = [a + b for a, b in zip(cell, counts, strict=True)]
        bad.update({f"archive {t}": c for t, c in archive.items()})
        print(f"run {n}: {fault}, {got.seconds:.0f} s, fired {got.fired}, not reached {got.not_reached}, failed "
              f"starts {len(got.failed_starts)}, key conflicts {len(got.key_conflicts)}, unplanned {got.unplanned}, "
              f"ended (already_ended) {got.ended}: {bad or 'all equal'}", flush=True)
        records.append({"run": n, "fault": str(fault), "outcome": {**vars(got), "alerts": None, "archived": None},
                        "diffs": {k: vars(d) for k, d in diffs.items() if d}, "archive": archive})
    only = f" --only {args.only}" if args.only else ""
    print(f"\nCrash suite: `python -m bench.crash --points {args.points} --seed {args.seed} --db {args.db}{only}`, "
          f"{platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}; a cell is "
          "lost/duplicated/wrong alerts summed over the point's runs (in parentheses)\n")
    print(table(rows, failed_starts, runs, archive_cells))
    if args.json:
        doc = {"clean": {**vars(clean), "alerts": {k: len(v) for k, v in clean.alerts.items()},
                         "archived": {k: len(v) for k, v in clean.archived.items()}},
               "nondeterministic": nondet, "runs": records}
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
