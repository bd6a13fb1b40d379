"""The webhook dispatcher: an asyncio loop of its own, on a thread of its own, that drains the outbox with aiohttp.

It does not share the HTTP server's event loop, so a burst of deliveries never holds API requests up. The HTTP
client is aiohttp's (one session, a connection pool of ``webhook_concurrency``): httpx's pool polled every pooled
connection's socket each time it handed one out (httpcore issue encode/httpcore#928), 3.6 ms of CPU per delivery
at 32 connections against aiohttp's 0.3 ms (issue 25; docs/benchmarks.md, "Webhook delivery throughput").

Each loop: lease up to ``webhook_batch`` due deliveries (and one probe per open circuit, see
:mod:`service.webhooks.store`), send each (at most ``webhook_concurrency`` at once). An attempt's
outcome is written as its answer arrives: a recorder task commits whatever outcomes are waiting
(lingering ``MARK_LINGER_S`` for the answers of other attempts in flight), so the window between a
receiver's 2xx and the delivered mark is one small transaction (``lace_delivery_mark_seconds``). A
crash inside that window sends the delivery once more, with the same idempotency key: receivers
deduplicate on it. An attempt keeps its sending slot until its outcome is committed, so at most
``webhook_concurrency`` deliveries are answered and not yet marked at any moment.

A failed attempt is retried after ``min(max, base * 2^(n-1))`` seconds jittered to ``[d/2, d]``
(:func:`~service.webhooks.store.backoff_s`); attempt ``webhook_max_attempts`` failing
dead-letters the delivery unless its endpoint's circuit is open (then it is held). Ingest (and every route that
releases deliveries) wakes the loop when it commits deliveries; a round that leases nothing asks the database when
something comes due next (a retry, a lease's end, a circuit's probe: :func:`~service.webhooks.store.next_due_us`)
and the loop sleeps until then, ``webhook_poll_s`` at most. An idle service polled its database every
``webhook_poll_s`` before: 5.5 % of a core at the test harness's 0.05 s, 0.6 % now.

Every attempt of a delivery carries the same ``Idempotency-Key`` and body; the signature
header is recomputed with the attempt's timestamp (and the pre-rotation secret during its grace
period). A direct attempt connects only to addresses that passed the target check: the connector's resolver is
:class:`~service.webhooks.targets.CheckedResolver`, which hands it only the allowed addresses of the URL's host (an IP
literal is checked before the attempt, :func:`~service.webhooks.targets.literal_refused`). An attempt through the
egress proxy of ``HTTP_PROXY`` / ``HTTPS_PROXY`` goes through a second session, whose connector resolves only the
proxy's host: the proxy resolves the webhook's host and connects (:mod:`service.webhooks.targets`). A refused target
fails the attempt with the reason (``target refused: ...``), like a failed connection but not counted against the
endpoint's circuit.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import threading
import time
from typing import Any

import aiohttp
import anyio
import orjson
import yarl
from aiohttp.abc import AbstractResolver
from aiohttp.helpers import get_env_proxy_for_url
from aiohttp.resolver import DefaultResolver
from sqlalchemy.orm import Session, sessionmaker

from service.core.config import Settings
from service.core.faults import crash_point
from service.core.metrics import Metrics
from service.core.security import IDEMPOTENCY_HEADER, SIGNATURE_HEADER, signature_header, webhook_secret
from service.db.session import now_us
from service.webhooks.store import (
    Job,
    Outcome,
    backoff_s,
    claim_due,
    is_endpoint_failure,
    next_due_us,
    record_outcomes,
    release_leases,
)
from service.webhooks.targets import AddressesRefused, CheckedResolver, literal_refused

__all__ = ["Dispatcher", "backoff_s"]

MIN_WAIT_S = 0.02
"""The shortest sleep between two rounds that leased nothing (a delivery due now was committed meanwhile: its wake
or this much later)."""

log = logging.getLogger(__name__)

CLAIM_INTERVAL_S = 0.05
"""Rounds (claims) start at least this far apart: alerts committed a few at a time each woke a claim of one or two
deliveries, and a claim costs about the same for 1 delivery as for 200 (SQLite, ``python -m bench.delivery
--claims``: 1.8 ms of CPU per delivery leased one at a time, 0.23 ms ten at a time, 0.07 ms 200 at a time; ``--trickle
600``: 1.76-1.96 -> 1.43-1.58 ms of the service's CPU per alert, ingest included). A delivery waits this much longer
at most."""

MARK_LINGER_S = 0.002
"""How long the recorder waits, once an outcome is queued while more attempts are unanswered than answers wait with
it, for their outcomes to join the same commit (a commit costs about the same for 1 outcome as for 30)."""


def env_proxy(url: str) -> tuple[yarl.URL | None, aiohttp.BasicAuth | None]:
    """The proxy (and its credentials) that ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``NO_PROXY`` give ``url``, or
    ``(None, None)``; read once per scheme and host (:func:`_env_proxy`). aiohttp's ``trust_env`` does the same
    lookup, and a ``~/.netrc`` read, on a worker thread for every request: two thread hops per delivery, 5 % of the
    service's CPU in the live-and-archived benchmark (issue 25); and its netrc lookup would send a ``.netrc``
    login for a webhook's host as basic auth, which no webhook asked for."""
    u = yarl.URL(url)
    return _env_proxy(u.scheme, u.raw_host or "")


@functools.lru_cache(maxsize=1024)
def _env_proxy(scheme: str, host: str) -> tuple[yarl.URL | None, aiohttp.BasicAuth | None]:
    try:
        return get_env_proxy_for_url(yarl.URL.build(scheme=scheme, host=host))
    except (LookupError, ValueError):
        return None, None


@dataclasses.dataclass(frozen=True, slots=True)
class _Clients:
    """The dispatcher's two HTTP sessions: ``direct`` connects only to checked addresses
    (:class:`~service.webhooks.targets.CheckedResolver`); ``proxied`` only to the egress proxy."""

    direct: aiohttp.ClientSession
    proxied: aiohttp.ClientSession


class Dispatcher:
    """Delivers outbox rows; start with :meth:`start`, stop with :meth:`stop`.

    Parameters
    ----------
    sessions : sessionmaker
        The service's database sessions (the outbox and its log).
    settings : Settings
        The ``webhook_*`` settings: schedule, concurrency, timeout, breaker, allowed targets.
    metrics : Metrics
        Where attempts, outcomes and latencies are counted.
    resolver : aiohttp.abc.AbstractResolver, optional
        What answers webhook host names, wrapped in :class:`~service.webhooks.targets.CheckedResolver` (default:
        aiohttp's ``DefaultResolver``, made on the dispatcher's loop). Tests give one that answers what they need.
    """

    def __init__(
        self,
        *,
        sessions: sessionmaker[Session],
        settings: Settings,
        metrics: Metrics,
        resolver: AbstractResolver | None = None,
    ) -> None:
        self.sessions = sessions
        self.settings = settings
        self.metrics = metrics
        self.resolver = resolver
        self.server_key = settings.signing_key()
        # both pure in their arguments (the settings and key are fixed): once per webhook / URL, not per attempt
        self._secret = functools.lru_cache(maxsize=1024)(functools.partial(webhook_secret, self.server_key))
        self._refused = functools.lru_cache(maxsize=1024)(self._refusal)
        self._wake = asyncio.Event()  # these three belong to the dispatcher's loop (first used there)
        self._inflight: set[asyncio.Task[None]] = set()
        # an outcome and the future its sender waits on (set once the outcome is committed, or failed to be)
        self._outcomes: asyncio.Queue[tuple[Outcome, asyncio.Future[None]] | None] = asyncio.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._stopping = False
        self._sending = 0  # attempts between holding a slot and having their outcome
        self._open: set[int] = set()  # webhooks whose circuit opened: queued jobs of theirs are not sent
        self._next_due_us: int | None = None  # when the last round leased nothing: when something comes due next

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Release the leases a previous process left, then deliver on the ``lace-webhooks`` thread.

        Raises whatever releasing the leases raised (the database is unreachable)."""
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="lace-webhooks", daemon=True)
        self._thread.start()
        await anyio.to_thread.run_sync(self._started.wait)
        if self._start_error is not None:
            raise self._start_error

    async def stop(self) -> None:
        """Finish the attempts in flight (up to ``webhook_timeout_s``), record their outcomes, end the thread."""
        loop, thread = self._loop, self._thread
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._begin_stop)
            except RuntimeError:  # the loop closed meanwhile
                pass
        if thread is not None:
            await anyio.to_thread.run_sync(thread.join)

    def _begin_stop(self) -> None:
        self._stopping = True
        self._wake.set()

    async def _main(self) -> None:
        try:
            await anyio.to_thread.run_sync(lambda: release_leases(self.sessions, now_us=now_us()))
        except BaseException as e:
            self._start_error = e
            self._started.set()
            return
        self._loop = asyncio.get_running_loop()
        recorder = asyncio.create_task(self._record_loop(), name="lace-webhook-recorder")
        task = asyncio.create_task(self._run(), name="lace-webhook-dispatcher")
        self._started.set()
        try:
            await task
        finally:
            self._outcomes.put_nowait(None)
            await recorder

    def wake(self) -> None:
        """Thread-safe: new deliveries are committed."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._wake.set)
            except RuntimeError:  # closed between the check and the call (shut-down)
                pass

    # ------------------------------------------------------------------ loop

    def _client(self, resolver: AbstractResolver | None) -> aiohttp.ClientSession:
        """A session of ``webhook_concurrency`` connections whose connector resolves with ``resolver`` (None: a
        ``DefaultResolver`` of its own)."""
        s = self.settings
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=s.webhook_concurrency, resolver=resolver),
            timeout=aiohttp.ClientTimeout(total=s.webhook_timeout_s),
            cookie_jar=aiohttp.DummyCookieJar(),  # one endpoint's cookies never go to another
            trust_env=False,  # the proxy from HTTP(S)_PROXY / NO_PROXY: env_proxy, once per host
        )

    async def _run(self) -> None:
        s = self.settings
        sem = asyncio.Semaphore(s.webhook_concurrency)
        async with contextlib.AsyncExitStack() as stack:
            checked = CheckedResolver(s, self.resolver or DefaultResolver())
            stack.push_async_callback(checked.close)
            clients = _Clients(
                direct=await stack.enter_async_context(self._client(checked)),
                proxied=await stack.enter_async_context(self._client(None)),  # resolves only the proxy's host
            )
            last_round = -CLAIM_INTERVAL_S
            while not self._stopping:
                gap = last_round + CLAIM_INTERVAL_S - time.monotonic()
                if gap > 0:
                    await asyncio.sleep(gap)  # more deliveries join the next claim
                last_round = time.monotonic()
                try:
                    await self._round(clients, sem)
                except Exception:
                    log.exception("dispatcher round failed; retrying")
                    await asyncio.sleep(s.webhook_poll_s)
                timeout = s.webhook_poll_s
                if self._next_due_us is not None:  # at least MIN_WAIT_S: never a busy loop, whatever the rows say
                    timeout = min(timeout, max(MIN_WAIT_S, (self._next_due_us - now_us()) / 1e6))
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=timeout)
                except TimeoutError:
                    pass
                self._wake.clear()
            if self._inflight:
                await asyncio.wait(self._inflight, timeout=s.webhook_timeout_s)

    async def _round(self, clients: _Clients, sem: asyncio.Semaphore) -> None:
        """Lease due deliveries when no more than half of ``webhook_batch`` are leased and unfinished.

        Claims are large (a claim and its outcomes' marks cost ~5 ms of SQLAlchemy and a commit each, whatever
        their size: claiming only the free sending slots made claims of ~16 under load, 1.2-1.7 ms of CPU per
        delivery); when ``webhook_batch`` is at least twice ``webhook_concurrency`` (the defaults: 200 and 64),
        enough jobs stay queued to fill every slot while the next claim runs, so sending does not wait for it. A
        lease covers a job's wait for a slot behind every job leased with or before it (each wave of
        ``webhook_concurrency`` attempts takes at most ``webhook_timeout_s``), or the delivery would be claimed
        and sent again while it waits."""
        s = self.settings
        self._next_due_us = None
        outstanding = len(self._inflight)
        if outstanding > s.webhook_batch // 2:
            return  # a recorded outcome frees a slot and wakes the loop
        limit = s.webhook_batch - outstanding
        waves = -(-s.webhook_batch // s.webhook_concurrency) + 1
        lease_us = int((waves * s.webhook_timeout_s + 5) * 1_000_000)
        jobs = await anyio.to_thread.run_sync(
            lambda: claim_due(self.sessions, now_us=now_us(), limit=limit, lease_us=lease_us)
        )
        if jobs:
            self.metrics.delivery_claims.inc()
            self.metrics.deliveries_claimed.inc(len(jobs))
        else:
            self._next_due_us = await anyio.to_thread.run_sync(
                lambda: next_due_us(self.sessions, now_us=now_us())
            )
        for job in jobs:
            if not job.probe:  # claimed as closed: the database is the truth (a PATCH or resume closes it too)
                self._open.discard(job.webhook_id)
            task = asyncio.create_task(self._send(clients, sem, job))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _record_loop(self) -> None:
        """Commit outcomes as they come: each wait ends with all that queued meanwhile, after at most
        ``MARK_LINGER_S`` more when more attempts are still unanswered than answers already wait with it."""
        while True:
            first = await self._outcomes.get()
            if first is not None and self._sending > self._outcomes.qsize() + 1:
                await asyncio.sleep(MARK_LINGER_S)  # those unanswered attempts' outcomes may join this commit
            batch = [first] if first is not None else []
            while not self._outcomes.empty():
                nxt = self._outcomes.get_nowait()
                if nxt is None:
                    first = None
                else:
                    batch.append(nxt)
            if batch:
                try:
                    await self._record([o for o, _ in batch])
                finally:
                    for _, recorded in batch:
                        if not recorded.done():
                            recorded.set_result(None)
                self._wake.set()  # a slot is free; a closed circuit may have released deliveries
            if first is None:
                return

    async def _record(self, done: list[Outcome]) -> None:
        try:
            rec = await anyio.to_thread.run_sync(
                lambda: record_outcomes(self.sessions, done, settings=self.settings)
            )
        except Exception:
            log.exception("recording %d delivery outcomes failed; the leases expire and they are resent", len(done))
            return
        committed = now_us()
        self._open -= {o.job.webhook_id for o in done if not o.skipped and (o.ok or not o.endpoint_down)}
        self._open |= rec.open_webhooks
        self.metrics.deliveries_ok.inc(rec.delivered)
        self.metrics.deliveries_failed.inc(rec.failed + rec.dead + rec.held)
        self.metrics.deliveries_dead.inc(rec.dead)
        self.metrics.circuits_opened.inc(rec.opened)
        for o in done:
            if o.skipped:
                continue
            self.metrics.delivery_mark.observe(max(committed - o.at_us, 0) / 1e6)
            if o.ok:
                self.metrics.delivery_latency.observe(max(o.at_us - o.job.alert_created_at_us, 0) / 1e6)

    async def _send(self, clients: _Clients, sem: asyncio.Semaphore, job: Job) -> None:
        """Attempt ``job`` and hand its outcome to the recorder. A sending slot is held from the request until the
        outcome is committed: at most ``webhook_concurrency`` deliveries are ever answered and not yet marked,
        which bounds what a crash sends again (leased jobs queued behind the slots are not sent yet)."""
        recorded: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def hand_over(outcome: Outcome) -> None:
            self._outcomes.put_nowait((outcome, recorded))
            await recorded

        try:
            refused = self._refused(job.url)
            if refused is not None:
                await hand_over(Outcome(job, False, None, refused, now_us(), 0.0, endpoint_down=False))
                return
            async with sem:
                self._sending += 1
                try:
                    outcome = await self._attempt(clients, job)
                finally:
                    self._sending -= 1
                await hand_over(outcome)
        except Exception as e:  # a bug before the hand-over must not lose the lease silently: record the failure
            log.exception("delivery %d: attempt failed unexpectedly", job.delivery_id)
            self._outcomes.put_nowait(
                (Outcome(job, False, None, f"{type(e).__name__}: {e}", now_us(), 0.0, endpoint_down=False), recorded)
            )

    def _refusal(self, url: str) -> str | None:
        """Why the URL may not be sent to, known before connecting (None: the connection decides). A host name is
        checked by the connector's resolver as it is resolved; an IP literal, which aiohttp does not resolve, here."""
        try:
            host = yarl.URL(url).raw_host  # what the client connects to (an IDN in its ASCII form)
        except (ValueError, TypeError) as e:
            return f"bad URL: {e}"
        if not host:
            return "bad URL: no host"
        reason = literal_refused(host, self.settings)
        return None if reason is None else f"target refused: {reason}"

    async def _attempt(self, clients: _Clients, job: Job) -> Outcome:
        """One POST of ``job`` (its slot already held): the outcome, never an exception of the request."""
        body = orjson.dumps(job.payload)
        secret = self._secret(job.webhook_id, job.salt)
        older = [self._secret(job.webhook_id, job.previous_salt)] if job.previous_salt else []
        headers: dict[str, Any] = {
            "Content-Type": "application/json",
            "User-Agent": "lace-webhooks/1",
            IDEMPOTENCY_HEADER: job.idempotency_key,
            "X-Lace-Delivery": str(job.delivery_id),
            "X-Lace-Attempt": str(job.attempt),
        }
        if self._stopping or (job.webhook_id in self._open and not job.probe):  # its lease is released
            return Outcome(job, False, None, None, now_us(), 0.0, skipped=True)
        start = time.perf_counter()
        headers[SIGNATURE_HEADER] = signature_header(secret, body, timestamp_s=int(time.time()), also=older)
        try:
            proxy, proxy_auth = env_proxy(job.url)
            client = clients.direct if proxy is None else clients.proxied
            async with client.post(
                job.url, data=body, headers=headers, allow_redirects=False, proxy=proxy, proxy_auth=proxy_auth
            ) as resp:
                await resp.read()  # the whole answer, so the connection is kept for the next delivery
                crash_point("webhook.after_post")
                code: int | None = resp.status
            ok = 200 <= resp.status < 300
            err = None if ok else f"HTTP {resp.status}"
            down = not ok and is_endpoint_failure(code)
        except aiohttp.ClientConnectorError as e:
            if isinstance(e.os_error, AddressesRefused):  # nothing was connected to; not the endpoint's failure
                ok, code, err, down = False, None, f"target refused: {e.os_error.strerror}", False
            else:
                ok, code, err, down = False, None, f"{type(e).__name__}: {e}", True
        except Exception as e:  # no answer (refused, timeout, bad URL): retried like a 5xx
            ok, code, err, down = False, None, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__, True
        at = now_us()
        elapsed_ms = (time.perf_counter() - start) * 1e3
        return Outcome(job, ok, code, err, at, elapsed_ms, endpoint_down=down)
