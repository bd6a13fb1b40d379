"""Fixtures for the service tests: a real ``lace serve`` (uvicorn subprocess on 127.0.0.1), a real
webhook receiver (an ASGI app served by uvicorn in a thread, on another port), and the two
databases: a SQLite file and PostgreSQL (127.0.0.1:5432, database ``test``, a fresh schema per run).
"""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from tests.postgres import fresh_schema

REPO = Path(__file__).resolve().parents[2]
SECRET_KEY = "test-secret-key-" + "x" * 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------- databases


@dataclass
class Database:
    kind: str
    url: str


def make_database(kind: str, tmp: Path) -> Iterator[Database]:
    """A fresh database of ``kind``: a SQLite file, or a new PostgreSQL schema dropped afterwards."""
    if kind == "sqlite":
        yield Database(kind, f"sqlite:///{tmp / 'lace.db'}")
        return
    with fresh_schema() as url:
        yield Database(kind, url)


# ---------------------------------------------------------------------------- the service


@dataclass
class Service:
    """A ``lace serve`` subprocess; ``admin`` is a key with all three scopes."""

    db: Database
    data_dir: Path
    env: dict[str, str]
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    admin: str = ""
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.data_dir / "serve.log"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cli", *args],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def start(self, timeout_s: float = 90.0) -> None:
        self.port = self.port or free_port()
        self.env["LACE_PORT"] = str(self.port)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "serve"], env=self.env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lace serve exited {self.proc.returncode}:\n{self.log_path.read_text()[-4000:]}")
            try:
                if httpx.get(self.base + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"lace serve did not become healthy:\n{self.log_path.read_text()[-4000:]}")

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def client(self, key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key or self.admin}"}
        return httpx.Client(base_url=self.base, headers=headers, timeout=30)


def make_service(db: Database, data_dir: Path, **settings: Any) -> Service:
    """Migrate, create an all-scopes key with ``lace keys create`` and return the (not started) service."""
    data_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LACE_")}
    env.update(
        LACE_DATA_DIR=str(data_dir),
        LACE_DATABASE_URL=db.url,
        LACE_SECRET_KEY=SECRET_KEY,
        LACE_ACCESS_LOG="false",
        LACE_LOG_LEVEL="warning",
        LACE_WEBHOOK_MAX_ATTEMPTS="6",
        LACE_WEBHOOK_ALLOW_LOOPBACK="true",  # the receivers listen on 127.0.0.1
        LACE_WEBHOOK_BREAKER_FAILURES="20",  # a single failing delivery dead-letters before its circuit opens
        LACE_WEBHOOK_BREAKER_PROBE_S="0.2",
        LACE_WEBHOOK_BREAKER_PROBE_MAX_S="1.0",
        LACE_WEBHOOK_BACKOFF_BASE_S="0.1",
        LACE_WEBHOOK_BACKOFF_MAX_S="1.0",
        LACE_MAX_BODY_BYTES="1000000",
        LACE_WEBHOOK_POLL_S="0.05",
        LACE_WEBHOOK_TIMEOUT_S="3",
        LACE_ARCHIVE_FLUSH_AGE_S="0.5",
        # the shared services' tests march event time an hour apart each (EventClock): allow a year ahead
        LACE_MAX_FUTURE_SKEW_S=str(365 * 86_400),
        PYTHONUNBUFFERED="1",
    )
    env.update({f"LACE_{k.upper()}": str(v) for k, v in settings.items()})
    svc = Service(db, data_dir, env)
    out = svc.cli("keys", "create", "--scope", "admin", "--scope", "read", "--scope", "ingest", "--name", "tests")
    assert out.returncode == 0, out.stderr
    svc.admin = out.stdout.strip().splitlines()[-1]
    return svc


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def database_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def service(database_kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One running service per database kind, shared by the tests that create their own types and queries."""
    yield from run_service(database_kind, tmp_path_factory.mktemp(f"svc-{database_kind}"))


def run_service(database_kind: str, tmp: Path, **settings: Any) -> Iterator[Service]:
    """A started service (``settings`` as for :func:`make_service`) on a fresh database of ``database_kind``, data
    under ``tmp``; stopped afterwards."""
    for db in make_database(database_kind, tmp):
        svc = make_service(db, tmp / "data", **settings)
        svc.start()
        try:
            yield svc
        finally:
            svc.stop()


@pytest.fixture
def fresh_db(database_kind: str, tmp_path: Path) -> Iterator[Database]:
    yield from make_database(database_kind, tmp_path)


# ---------------------------------------------------------------------------- the webhook receiver


class Receiver:
    """A webhook endpoint: records every request; answers ``status`` (settable), optionally after ``delay_s``.

    ``status_for(body) -> int | None`` overrides ``status`` per request; ``after_response(record)`` runs
    once the answer was sent (in the receiver's thread).
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.received: list[dict[str, Any]] = []
        self.status = 200
        self.delay_s = 0.0
        self.status_for: Callable[[bytes], int | None] | None = None
        self.after_response: Callable[[dict[str, Any]], None] | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return  # the sender died mid-request: nothing was delivered
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        if self.delay_s:
            import asyncio

            await asyncio.sleep(self.delay_s)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        status = (self.status_for(body) if self.status_for else None) or self.status
        record = {"headers": headers, "body": body, "at": time.time(), "status": status}
        with self._lock:
            self.received.append(record)
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})
        if self.after_response is not None:
            self.after_response(record)

    def start(self) -> None:
        config = uvicorn.Config(self, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("receiver did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = None

    def ok(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.received if 200 <= r["status"] < 300]

    def wait_for(self, n: int, timeout_s: float = 20.0) -> list[dict[str, Any]]:
        """Block until ``n`` requests were answered 2xx (or the timeout); return them."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(self.ok()) < n:
            time.sleep(0.02)
        return self.ok()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.start()
    yield r
    r.stop()


# ---------------------------------------------------------------------------- helpers


def unique(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(3)}"


def wait_until(pred: Callable[[], Any], timeout_s: float = 20.0, every_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = pred()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(every_s)


class EventClock:
    """Event time for the shared services: every test takes a span after the previous one's,
    so no test's events are late behind another's (the service's event time is global)."""

    def __init__(self) -> None:
        self._next_ms = int(time.time() * 1000)
        self._lock = threading.Lock()

    def take(self, span_ms: int = 3_600_000) -> int:
        with self._lock:
            base = max(self._next_ms, int(time.time() * 1000))
            self._next_ms = base + span_ms
            return base


CLOCK = EventClock()


@pytest.fixture
def t0() -> int:
    """A base event time (epoch ms) with an hour of room after it."""
    return CLOCK.take()
