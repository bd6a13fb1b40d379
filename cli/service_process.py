"""``lace serve`` as a child process on a data directory of its own: what ``lace demo``, the service tests and the
fault benchmarks talk to (one launcher for all of them).

The child runs ``python -m cli serve`` (the same interpreter; the ``cli`` package of ``repo``, this checkout by
default) on ``127.0.0.1`` and a free port. By default it uses the service's embedded defaults: a SQLite file and a
Delta archive under ``data_dir``, local Spark (started by the service itself, in the background, when the first
live-and-archived query is registered); ``db`` gives it another database. No ``LACE_*`` variable or ``.env`` file
of the caller reaches it; ``settings`` adds some. ``lace serve`` runs the migrations first; the admin key (all
three scopes) is made with ``LACE_BOOTSTRAP_ADMIN_KEY`` (a fresh random token). Its output goes to
``data_dir/serve.log``.

:func:`make_service` is the launcher with :data:`HARNESS_SETTINGS` (quick retries and polls against a local
receiver); :class:`Database` and :func:`scratch_database` give it a fresh SQLite file or PostgreSQL schema.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx

from cli.webhook_receiver import free_port

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
"""The directory holding the ``cli`` package: the child's working directory, so it imports this code."""
PORT_TRIES = 5
"""How many ports :meth:`ServiceProcess.start` tries when the one it chose was taken before the child bound it."""
PORT_TAKEN = "address already in use"
"""What uvicorn logs when its port is taken."""

PG_URL = os.environ.get("LACE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
"""The PostgreSQL that :func:`scratch_database` makes schemas in (``LACE_TEST_PG_URL``; trust authentication)."""

HARNESS_SETTINGS: dict[str, Any] = {
    "webhook_max_attempts": 6,
    "webhook_breaker_failures": 20,  # a single failing delivery dead-letters before its circuit opens
    "webhook_breaker_probe_s": 0.2,
    "webhook_breaker_probe_max_s": 1.0,
    "webhook_backoff_base_s": 0.1,
    "webhook_backoff_max_s": 1.0,
    "max_body_bytes": 1_000_000,
    "webhook_timeout_s": 3,
    "archive_flush_age_s": 0.5,
    # the shared services' tests march event time an hour apart each (EventClock): allow a year ahead
    "max_future_skew_s": 365 * 86_400,
}
"""Settings for short runs against a local receiver: retries, polls and flushes in fractions of a second."""


class ServiceError(RuntimeError):
    """The service did not start, or stopped; the message ends with the tail of its log."""


@dataclass
class Database:
    """A database for the service: ``kind`` is ``sqlite`` or ``postgresql``, ``url`` its SQLAlchemy URL."""

    kind: str
    url: str


@contextmanager
def scratch_database(
    kind: str, tmp: Path, pg_url: str = PG_URL, *, prefix: str = "lace_test_"
) -> Iterator[Database]:
    """A fresh database of ``kind``: a SQLite file under ``tmp``, or a new schema ``<prefix><8 hex digits>`` of the
    PostgreSQL at ``pg_url`` (its URL sets ``search_path``), dropped afterwards."""
    if kind == "sqlite":
        yield Database(kind, f"sqlite:///{tmp / 'lace.db'}")
        return
    if kind != "postgresql":
        raise ValueError(f"unknown database kind {kind!r} (sqlite or postgresql)")
    import psycopg

    plain = pg_url.replace("postgresql+psycopg", "postgresql")
    schema = prefix + secrets.token_hex(4)
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield Database(kind, f"{pg_url}?options=-csearch_path%3D{schema}")
    finally:
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


class ServiceProcess:
    """A ``lace serve`` child process (see the module docstring).

    Parameters
    ----------
    data_dir : Path
        ``LACE_DATA_DIR`` (created when missing).
    settings : dict, optional
        More ``LACE_*`` settings, by their name without the prefix (``{"archive_flush_rows": 2000}``).
    db : Database, optional
        The database (default: the embedded SQLite file under ``data_dir``).
    repo : Path
        The checkout whose ``cli`` package runs (default: this one).
    own_group : bool
        Start the child in a process group of its own (with its live-and-archived workers and Spark), so that
        :meth:`kill` kills all of them at once, as a crash would, and a ``LACE_CRASH_AT`` point
        (:mod:`service.core.faults`) kills nothing else.

    Attributes
    ----------
    admin : str
        An API key with the scopes ``admin``, ``ingest`` and ``read``.
    """

    def __init__(
        self,
        data_dir: Path,
        settings: dict[str, Any] | None = None,
        *,
        db: Database | None = None,
        repo: Path = PACKAGE_ROOT,
        own_group: bool = False,
    ) -> None:
        self.data_dir = data_dir
        self.db = db or Database("sqlite", f"sqlite:///{data_dir / 'lace.db'}")
        self.repo = repo
        self.own_group = own_group
        self.port = free_port()
        self.admin = secrets.token_urlsafe(32)
        self.log_path = data_dir / "serve.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("LACE_")}
        env.update(
            LACE_ENV_FILE=str(data_dir / "no.env"),  # no .env of the working directory
            LACE_DATA_DIR=str(data_dir),
            LACE_HOST="127.0.0.1",
            LACE_PORT=str(self.port),
            LACE_BOOTSTRAP_ADMIN_KEY=self.admin,
            LACE_LOG_LEVEL="warning",
            LACE_ACCESS_LOG="false",
            LACE_WEBHOOK_ALLOW_LOOPBACK="true",  # the receivers listen on 127.0.0.1
            PYTHONUNBUFFERED="1",
        )
        if db is not None:
            env["LACE_DATABASE_URL"] = db.url
        env.update({f"LACE_{k.upper()}": str(v) for k, v in (settings or {}).items()})
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def base(self) -> str:
        """The service's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 3_000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def cli(self, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run ``lace ARGS`` with the service's settings (``keys create``, ``db upgrade``, ...)."""
        return subprocess.run(
            [sys.executable, "-m", "cli", *args], env=self.env, cwd=self.repo, capture_output=True, text=True,
            timeout=timeout_s,
        )

    def start(self, timeout_s: float = 120.0) -> None:
        """Start the child and wait until ``/healthz`` answers 200. When its port was taken meanwhile (it was free
        when chosen; another program's connection or server may have got it since), it starts again on a new
        one, up to :data:`PORT_TRIES` times.

        Raises
        ------
        ServiceError
            When the child exits or is not healthy within ``timeout_s`` (it is stopped then).
        """
        for attempt in range(PORT_TRIES):
            logged = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                self._start_once(timeout_s)
                return
            except ServiceError:
                if PORT_TAKEN not in self._logged_since(logged) or attempt == PORT_TRIES - 1:
                    raise
            self.port = free_port()
            self.env["LACE_PORT"] = str(self.port)

    def _logged_since(self, offset: int) -> str:
        """What the log holds after byte ``offset``."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _start_once(self, timeout_s: float) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._log is None:
            self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "serve"],
            env=self.env,
            cwd=self.repo,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            process_group=0 if self.own_group else None,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServiceError(f"lace serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.base + "/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise ServiceError(f"lace serve was not healthy after {timeout_s:g} s:\n{self.log_tail()}")

    def check(self) -> None:
        """Raise :class:`ServiceError` when the child has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise ServiceError(f"lace serve exited with {self.proc.returncode}:\n{self.log_tail()}")

    def client(self, key: str | None = None, timeout_s: float = 60.0) -> httpx.Client:
        """An HTTP client with ``key`` (default: the admin key)."""
        headers = {"Authorization": f"Bearer {key or self.admin}"}
        return httpx.Client(base_url=self.base, headers=headers, timeout=timeout_s)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush. The whole process group when the child has its own (``own_group``)."""
        assert self.proc is not None
        if self.own_group:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM (a clean shutdown: the dispatcher stops, the archive flushes, Spark stops); SIGKILL after
        ``timeout_s``. Returns the exit code (None when it was not started)."""
        code = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    self.kill()
            code = self.proc.returncode
        if self._log is not None:
            self._log.close()
            self._log = None
        return code


def make_service(db: Database, data_dir: Path, *, repo: Path = PACKAGE_ROOT, **settings: Any) -> ServiceProcess:
    """A (not started) service on ``db`` with :data:`HARNESS_SETTINGS` and ``settings`` (``repo``: the checkout
    whose service runs, see :class:`ServiceProcess`)."""
    return ServiceProcess(data_dir, {**HARNESS_SETTINGS, **settings}, db=db, repo=repo)


# ---------------------------------------------------------------------------- helpers of the harnesses


def unique(prefix: str) -> str:
    """``prefix`` and 6 random hex digits: a name no other test or run uses."""
    return f"{prefix}_{secrets.token_hex(3)}"


def wait_until(pred: Callable[[], Any], timeout_s: float = 20.0, every_s: float = 0.05) -> Any:
    """Call ``pred`` until it returns something true or ``timeout_s`` passed; return its last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = pred()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(every_s)


class EventClock:
    """Event time for producers sharing a service: every caller takes a span after the previous one's, so no
    one's events are late behind another's (the service's event time is global)."""

    def __init__(self) -> None:
        self._next_ms = int(time.time() * 1000)
        self._lock = threading.Lock()

    def take(self, span_ms: int = 3_600_000) -> int:
        """The start (epoch ms, not before now) of a span of ``span_ms`` that no earlier caller got."""
        with self._lock:
            base = max(self._next_ms, int(time.time() * 1000))
            self._next_ms = base + span_ms
            return base


CLOCK = EventClock()
"""The process's one clock (the tests' shared services use it)."""
