"""Local webhook endpoints: :class:`Receiver` records every request; :class:`WebhookReceiver` (what ``lace demo``
runs) also checks every delivery's signature.

A receiver is an HTTP server (an ASGI app served by uvicorn on a thread, on ``127.0.0.1`` and a free port). The
plain :class:`Receiver` answers every request with :attr:`Receiver.status` (settable, per request with
``status_for``) and records it: the tests and the fault benchmarks use it to see exactly what the service sent.

:class:`WebhookReceiver` is what a user of the service runs to receive alerts (docs/rest.md, "Webhooks"): one path
per webhook, ``/hook/<name>``, each with its signing secret (the ``secret`` that ``POST /webhooks`` answers once); a
delivery is accepted (200) when its ``X-Lace-Signature`` verifies and its ``t`` is recent, refused (401) otherwise,
so the service would retry it. Redeliveries of an accepted alert (same ``Idempotency-Key``) are answered 200 and
counted, not recorded twice as alerts.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

SIGNATURE_TOLERANCE_S = 300
"""A signature whose ``t`` is further than this from the receiver's clock is refused, seconds."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def verify_signature(secret: str, body: bytes, header: str, *, now_s: float | None = None) -> bool:
    """The documented check: ``header`` is ``t=<unix s>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>``, with a
    second ``v1`` (the previous secret's) during a rotation's grace period: any ``v1`` may match.

    Returns False for a malformed header, no matching MAC or a ``t`` more than
    :data:`SIGNATURE_TOLERANCE_S` from ``now_s`` (default: the clock).
    """
    try:
        parts = [p.split("=", 1) for p in header.split(",")]
        t = next(v for k, v in parts if k == "t")
        sent_s = int(t)
    except (StopIteration, ValueError):
        return False
    mac = hmac.new(secret.encode(), t.encode() + b"." + body, hashlib.sha256).hexdigest()
    now = time.time() if now_s is None else now_s
    fresh = abs(now - sent_s) <= SIGNATURE_TOLERANCE_S
    return fresh and any(k == "v1" and hmac.compare_digest(mac, v) for k, v in parts)


class Receiver:
    """A webhook endpoint that records every request (see the module docstring).

    Each request becomes a record in :attr:`received`: ``{"path", "headers" (lower-case names), "body" (bytes),
    "at" (epoch seconds), "status" (the answer)}``. The answer is ``status_for(body)`` when that is set and not
    None, else :attr:`status`, sent after ``delay_s``; ``after_response(record)`` runs once it was sent (on the
    receiver's thread). A request whose sender disconnects before its body arrived is not recorded.

    Parameters
    ----------
    host : str
        Bind address (default ``127.0.0.1``).
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = free_port(host)
        self.received: list[dict[str, Any]] = []
        self.status = 200
        self.delay_s = 0.0
        self.status_for: Callable[[bytes], int | None] | None = None
        self.after_response: Callable[[dict[str, Any]], None] | None = None
        self._lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The URL of the path ``/hook`` (give it to ``POST /webhooks``)."""
        return f"http://{self.host}:{self.port}/hook"

    def hook_url(self, hook: str) -> str:
        """The URL of webhook path ``/hook/<hook>``."""
        return f"{self.url}/{hook}"

    def answer(self, path: str, body: bytes, headers: dict[str, str], at_s: float) -> int:
        """The status to answer a request with (under no lock; subclasses check what they need)."""
        return (self.status_for(body) if self.status_for else None) or self.status

    # ------------------------------------------------------------------ the ASGI app

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            return
        chunks: list[bytes] = []
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return  # the sender died mid-request: nothing was delivered
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        body, at_s = b"".join(chunks), time.time()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        status = self.answer(scope["path"], body, headers, at_s)
        record = {"path": scope["path"], "headers": headers, "body": body, "at": at_s, "status": status}
        with self._lock:
            self.received.append(record)
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok" if 200 <= status < 300 else b"refused"})
        if self.after_response is not None:
            self.after_response(record)

    # ------------------------------------------------------------------ what arrived

    def ok(self) -> list[dict[str, Any]]:
        """The records of the requests answered 2xx."""
        with self._lock:
            return [r for r in self.received if 200 <= r["status"] < 300]

    def wait_for(self, n: int, timeout_s: float = 20.0) -> list[dict[str, Any]]:
        """Block until ``n`` requests were answered 2xx (or the timeout); return them."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(self.ok()) < n:
            time.sleep(0.02)
        return self.ok()

    def bodies_by_key(self) -> dict[str, set[bytes]]:
        """Per ``Idempotency-Key``, the distinct bodies answered 2xx (one each, when the service keeps its word)."""
        out: dict[str, set[bytes]] = {}
        for rec in self.ok():
            out.setdefault(rec["headers"].get("idempotency-key", ""), set()).add(rec["body"])
        return out

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout_s: float = 10.0) -> None:
        """Serve on a daemon thread; return once it listens.

        Raises
        ------
        RuntimeError
            When the server did not start within ``timeout_s``.
        """
        import uvicorn

        config = uvicorn.Config(self, host=self.host, port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="lace-webhook-receiver", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the webhook receiver did not start on {self.host}:{self.port}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = None


@dataclass(slots=True)
class Delivery:
    """One accepted alert: which webhook path it came to, its JSON body and its arrival (epoch seconds)."""

    hook: str
    body: dict[str, Any]
    at_s: float


@dataclass
class ReceiverCounts:
    """Requests received, accepted (signature verified, first time), refused (bad or no signature,
    unknown path, not JSON) and redelivered (verified again under an idempotency key already taken)."""

    received: int = 0
    verified: int = 0
    refused: int = 0
    redelivered: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


class WebhookReceiver(Receiver):
    """The demo's webhook endpoint (see the module docstring): signatures checked per path.

    Accepted deliveries are appended to :attr:`deliveries` and put on :attr:`arrivals` (a queue the
    caller drains to print them as they come); every request is in :attr:`received` too.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        super().__init__(host)
        self.secrets: dict[str, str] = {}
        self.deliveries: list[Delivery] = []
        self.arrivals: queue.SimpleQueue[Delivery] = queue.SimpleQueue()
        self.counts = ReceiverCounts()
        self._keys: set[str] = set()

    def add_secret(self, hook: str, secret: str) -> None:
        """The signing secret of path ``hook`` (before the first delivery to it)."""
        with self._lock:
            self.secrets[hook] = secret

    def accepted(self) -> int:
        with self._lock:
            return len(self.deliveries)

    def answer(self, path: str, body: bytes, headers: dict[str, str], at_s: float) -> int:
        hook = path.removeprefix("/hook/")
        with self._lock:
            self.counts.received += 1
            secret = self.secrets.get(hook) if path.startswith("/hook/") else None
        reason = None
        if secret is None:
            reason = "unknown path"
        elif not verify_signature(secret, body, headers.get("x-lace-signature", ""), now_s=at_s):
            reason = "bad signature"
        doc: Any = None
        if reason is None:
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError:
                reason = "not JSON"
        with self._lock:
            if reason is not None:
                self.counts.refused += 1
                self.counts.reasons[reason] = self.counts.reasons.get(reason, 0) + 1
                return 401
            key = headers.get("idempotency-key", "")
            if key and key in self._keys:
                self.counts.redelivered += 1
                return 200
            self._keys.add(key)
            self.counts.verified += 1
            d = Delivery(hook, doc, at_s)
            self.deliveries.append(d)
        self.arrivals.put(d)
        return 200
