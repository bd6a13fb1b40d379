"""``lace serve`` as a child process on a data directory of its own (what ``lace demo`` talks to).

The child runs ``python -m cli serve`` (the same interpreter, the same ``cli`` package) on
``127.0.0.1`` and a free port with the service's embedded defaults: a SQLite file and a Delta archive
under ``data_dir``, local Spark (started by the service itself, in the background, when the first
live-and-archived query is registered). No ``LACE_*`` variable or ``.env`` file of the caller reaches it;
``settings`` adds some. ``lace serve`` runs the migrations first; the admin key is made with
``LACE_BOOTSTRAP_ADMIN_KEY`` (a fresh random token). Its output goes to ``data_dir/serve.log``.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import httpx

from cli.webhook_receiver import free_port

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
"""The directory holding the ``cli`` package: the child's working directory, so it imports this code."""


class ServiceError(RuntimeError):
    """The service did not start, or stopped; the message ends with the tail of its log."""


class ServiceProcess:
    """A ``lace serve`` child process.

    Parameters
    ----------
    data_dir : Path
        ``LACE_DATA_DIR`` (created when missing).
    settings : dict, optional
        More ``LACE_*`` settings, by their name without the prefix (``{"archive_flush_rows": 2000}``).
    """

    def __init__(self, data_dir: Path, settings: dict[str, Any] | None = None) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.key = secrets.token_urlsafe(32)
        self.log_path = data_dir / "serve.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("LACE_")}
        env.update(
            LACE_ENV_FILE=str(data_dir / "no.env"),  # no .env of the working directory
            LACE_DATA_DIR=str(data_dir),
            LACE_HOST="127.0.0.1",
            LACE_PORT=str(self.port),
            LACE_BOOTSTRAP_ADMIN_KEY=self.key,
            LACE_LOG_LEVEL="warning",
            LACE_ACCESS_LOG="false",
            LACE_WEBHOOK_ALLOW_LOOPBACK="true",  # the demo's receiver listens on 127.0.0.1
            PYTHONUNBUFFERED="1",
        )
        env.update({f"LACE_{k.upper()}": str(v) for k, v in (settings or {}).items()})
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 3_000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def start(self, timeout_s: float = 120.0) -> None:
        """Start the child and wait until ``/healthz`` answers 200.

        Raises
        ------
        ServiceError
            When the child exits or is not healthy within ``timeout_s`` (it is stopped then).
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "serve"],
            env=self.env,
            cwd=PACKAGE_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServiceError(f"lace serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.base_url + "/healthz", timeout=1.0).status_code == 200:
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

    def client(self, timeout_s: float = 60.0) -> httpx.Client:
        """An HTTP client with the admin key."""
        return httpx.Client(
            base_url=self.base_url, headers={"Authorization": f"Bearer {self.key}"}, timeout=timeout_s
        )

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
                    self.proc.kill()
                    self.proc.wait()
            code = self.proc.returncode
        if self._log is not None:
            self._log.close()
            self._log = None
        return code
