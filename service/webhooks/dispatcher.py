"""The webhook dispatcher: an asyncio task that drains the outbox with httpx.

Each loop: lease the due deliveries, send each (at most ``webhook_concurrency`` at once),
and record the outcomes in one transaction. A 2xx answer delivers; anything else (or no
answer within ``webhook_timeout_s``) schedules a retry after ``min(max, base * 2^(n-1))``
seconds with full jitter (a uniform draw in ``[d/2, d]``); attempt ``webhook_max_attempts``
failing dead-letters the delivery. Ingest wakes the loop when it commits deliveries; it
also polls every ``webhook_poll_s`` for retries.

Every attempt of a delivery carries the same ``Idempotency-Key`` and body; the signature
header is recomputed with the attempt's timestamp.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

import anyio
import httpx
import orjson
from sqlalchemy.orm import Session, sessionmaker

from service.core.config import Settings
from service.core.metrics import Metrics
from service.core.security import IDEMPOTENCY_HEADER, SIGNATURE_HEADER, signature_header, webhook_secret
from service.db.session import now_us
from service.webhooks.store import Job, Outcome, claim_due, record_outcomes, release_leases

log = logging.getLogger(__name__)


def backoff_s(attempt: int, *, base_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """Delay before retry number ``attempt`` (1 = after the first failure), seconds, jittered.

    >>> 0.5 <= backoff_s(1, base_s=1, max_s=60) <= 1.0, 30 <= backoff_s(10, base_s=1, max_s=60) <= 60
    (True, True)
    """
    d = min(max_s, base_s * (2 ** (attempt - 1)))
    return (rng or random).uniform(d / 2, d)


class Dispatcher:
    """Delivers outbox rows; start with :meth:`start`, stop with :meth:`stop`."""

    def __init__(self, *, sessions: sessionmaker[Session], settings: Settings, metrics: Metrics) -> None:
        self.sessions = sessions
        self.settings = settings
        self.metrics = metrics
        self.server_key = settings.signing_key()
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._inflight: set[asyncio.Task[Outcome]] = set()
        self._done: list[Outcome] = []

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await anyio.to_thread.run_sync(release_leases, self.sessions)
        self._task = asyncio.create_task(self._run(), name="lace-webhook-dispatcher")

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task

    def wake(self) -> None:
        """Thread-safe: new deliveries are committed."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake.set)

    # ------------------------------------------------------------------ loop

    async def _run(self) -> None:
        s = self.settings
        limits = httpx.Limits(max_connections=s.webhook_concurrency, max_keepalive_connections=s.webhook_concurrency)
        sem = asyncio.Semaphore(s.webhook_concurrency)
        async with httpx.AsyncClient(timeout=s.webhook_timeout_s, limits=limits, follow_redirects=False) as client:
            while not self._stopping:
                try:
                    await self._round(client, sem)
                except Exception:
                    log.exception("dispatcher round failed; retrying")
                    await asyncio.sleep(s.webhook_poll_s)
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=s.webhook_poll_s)
                except TimeoutError:
                    pass
                self._wake.clear()
            if self._inflight:
                await asyncio.wait(self._inflight, timeout=s.webhook_timeout_s)
            await self._record()

    async def _round(self, client: httpx.AsyncClient, sem: asyncio.Semaphore) -> None:
        await self._record()
        s = self.settings
        free = s.webhook_batch - len(self._inflight)
        if free <= 0:
            return
        lease_us = int((s.webhook_timeout_s + 5) * 1_000_000)
        jobs = await anyio.to_thread.run_sync(
            lambda: claim_due(self.sessions, now_us=now_us(), limit=free, lease_us=lease_us)
        )
        for job in jobs:
            task = asyncio.create_task(self._send(client, sem, job))
            self._inflight.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Outcome]) -> None:
        self._inflight.discard(task)
        if not task.cancelled() and task.exception() is None:
            self._done.append(task.result())
        self._wake.set()

    async def _record(self) -> None:
        if not self._done:
            return
        done, self._done = self._done, []
        s = self.settings
        next_at = {
            o.job.delivery_id: o.at_us
            + int(backoff_s(o.job.attempt, base_s=s.webhook_backoff_base_s, max_s=s.webhook_backoff_max_s) * 1e6)
            for o in done
            if not o.ok
        }
        try:
            delivered, failed, dead = await anyio.to_thread.run_sync(
                lambda: record_outcomes(self.sessions, done, max_attempts=s.webhook_max_attempts, next_at=next_at)
            )
        except Exception:
            log.exception("recording %d delivery outcomes failed; the leases expire and they are resent", len(done))
            return
        self.metrics.deliveries_ok.inc(delivered)
        self.metrics.deliveries_failed.inc(failed + dead)
        self.metrics.deliveries_dead.inc(dead)
        for o in done:
            if o.ok:
                self.metrics.delivery_latency.observe(max(o.at_us - o.job.alert_created_at_us, 0) / 1e6)

    async def _send(self, client: httpx.AsyncClient, sem: asyncio.Semaphore, job: Job) -> Outcome:
        body = orjson.dumps(job.payload)
        secret = webhook_secret(self.server_key, job.webhook_id, job.salt)
        headers: dict[str, Any] = {
            "Content-Type": "application/json",
            "User-Agent": "lace-webhooks/1",
            IDEMPOTENCY_HEADER: job.idempotency_key,
            "X-Lace-Delivery": str(job.delivery_id),
            "X-Lace-Attempt": str(job.attempt),
        }
        async with sem:
            start = time.perf_counter()
            headers[SIGNATURE_HEADER] = signature_header(secret, body, timestamp_s=int(time.time()))
            try:
                resp = await client.post(job.url, content=body, headers=headers)
                ok = 200 <= resp.status_code < 300
                code: int | None = resp.status_code
                err = None if ok else f"HTTP {resp.status_code}"
            except Exception as e:  # no answer (refused, timeout, bad URL): retried like a 5xx
                ok, code, err = False, None, f"{type(e).__name__}: {e}"
            elapsed_ms = (time.perf_counter() - start) * 1e3
        return Outcome(job=job, ok=ok, status_code=code, error=err, at_us=now_us(), duration_ms=elapsed_ms)
