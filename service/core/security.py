"""API keys, webhook secrets and webhook signatures.

* API keys are ``lace_`` + 32 random bytes (URL-safe base64); only their SHA-256 is
  stored. A high-entropy token needs no salt or slow hash.
* A webhook's signing secret is derived, never stored: ``HMAC-SHA256(server key,
  "webhook:<id>:<salt>")``; the database keeps the random salt. The secret is shown once,
  when the webhook is created.
* A delivery carries ``X-Lace-Signature: t=<unix seconds>,v1=<hex>`` where ``hex`` is
  ``HMAC-SHA256(secret, "<t>." + body)`` (the timestamp binds the signature against replays).
  During a secret rotation's grace period the header has one ``v1`` per secret, the new one first.

Examples
--------
>>> body = b'{"a":1}'
>>> header = signature_header("whsec_x", body, timestamp_s=1700000000)
>>> header.startswith("t=1700000000,v1=")
True
>>> verify_signature("whsec_x", body, header, now_s=1700000010, tolerance_s=300)
True
>>> verify_signature("whsec_y", body, header, now_s=1700000010, tolerance_s=300)
False
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
import uuid
from collections.abc import Sequence
from typing import Literal

Scope = Literal["admin", "ingest", "read"]
SCOPES: tuple[Scope, ...] = ("admin", "ingest", "read")
KEY_PREFIX = "lace_"
SIGNATURE_HEADER = "X-Lace-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"


def new_api_key() -> str:
    """A fresh API key token (shown once)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_api_key(token: str) -> str:
    """SHA-256 hex of a token: what the database stores and looks keys up by."""
    return hashlib.sha256(token.encode()).hexdigest()


def uuid7(now_ms: int | None = None) -> uuid.UUID:
    """A UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then 74 random bits; sorts by time.

    >>> u = uuid7(1_700_000_000_000); (u.version, u.int >> 80)
    (7, 1700000000000)
    """
    ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    rand = int.from_bytes(secrets.token_bytes(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | (rand >> 62 & 0xFFF) << 64 | 0b10 << 62 | rand & ((1 << 62) - 1)
    return uuid.UUID(int=value)


def new_idempotency_key() -> str:
    """``lace-<UUIDv7>``: the key of one delivery, kept by its every retry and redelivery, never reused."""
    return f"lace-{uuid7()}"


def new_salt() -> str:
    return secrets.token_hex(16)


def webhook_secret(server_key: bytes, webhook_id: int, salt: str) -> str:
    """The signing secret of webhook ``webhook_id`` (deterministic: redeliveries sign alike)."""
    digest = hmac.new(server_key, f"webhook:{webhook_id}:{salt}".encode(), hashlib.sha256).digest()
    return "whsec_" + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def sign(secret: str, body: bytes, timestamp_s: int) -> str:
    """Hex HMAC-SHA256 of ``"<timestamp_s>." + body`` under ``secret``."""
    return hmac.new(secret.encode(), str(timestamp_s).encode() + b"." + body, hashlib.sha256).hexdigest()


def signature_header(secret: str, body: bytes, *, timestamp_s: int, also: Sequence[str] = ()) -> str:
    """The ``X-Lace-Signature`` value for ``body`` sent at ``timestamp_s`` (unix seconds);
    ``also``: older secrets still in their grace period, each adding a ``v1``."""
    sigs = "".join(f",v1={sign(s, body, timestamp_s)}" for s in (secret, *also))
    return f"t={timestamp_s}{sigs}"


def verify_signature(secret: str, body: bytes, header: str, *, now_s: int, tolerance_s: int = 300) -> bool:
    """Receiver side: the header is well formed, fresh (within ``tolerance_s`` seconds) and one ``v1`` matches."""
    parts = [p.split("=", 1) for p in header.split(",") if "=" in p]
    try:
        ts = int(next(v for k, v in parts if k == "t"))
    except (StopIteration, ValueError):
        return False
    if abs(now_s - ts) > tolerance_s:
        return False
    mac = sign(secret, body, ts)
    return any(k == "v1" and hmac.compare_digest(v, mac) for k, v in parts)
