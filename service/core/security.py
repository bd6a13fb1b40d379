"""API keys, webhook secrets and webhook signatures.

* API keys are ``lace_`` + 32 random bytes (URL-safe base64); only their SHA-256 is
  stored. A high-entropy token needs no salt or slow hash.
* A webhook's signing secret is derived, never stored: ``HMAC-SHA256(server key,
  "webhook:<id>:<salt>")``; the database keeps the random salt. The secret is shown once,
  when the webhook is created.
* A delivery carries ``X-Lace-Signature: t=<unix seconds>,v1=<hex>`` where ``hex`` is
  ``HMAC-SHA256(secret, "<t>." + body)`` (the timestamp binds the signature against replays).

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


def new_salt() -> str:
    return secrets.token_hex(16)


def webhook_secret(server_key: bytes, webhook_id: int, salt: str) -> str:
    """The signing secret of webhook ``webhook_id`` (deterministic: redeliveries sign alike)."""
    digest = hmac.new(server_key, f"webhook:{webhook_id}:{salt}".encode(), hashlib.sha256).digest()
    return "whsec_" + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def sign(secret: str, body: bytes, timestamp_s: int) -> str:
    """Hex HMAC-SHA256 of ``"<timestamp_s>." + body`` under ``secret``."""
    return hmac.new(secret.encode(), str(timestamp_s).encode() + b"." + body, hashlib.sha256).hexdigest()


def signature_header(secret: str, body: bytes, *, timestamp_s: int) -> str:
    """The ``X-Lace-Signature`` value for ``body`` sent at ``timestamp_s`` (unix seconds)."""
    return f"t={timestamp_s},v1={sign(secret, body, timestamp_s)}"


def verify_signature(secret: str, body: bytes, header: str, *, now_s: int, tolerance_s: int = 300) -> bool:
    """Receiver side: the header is well formed, fresh (within ``tolerance_s`` seconds) and matches."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        ts = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(now_s - ts) > tolerance_s or "v1" not in parts:
        return False
    return hmac.compare_digest(parts["v1"], sign(secret, body, ts))
