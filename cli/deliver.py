"""Sending matches found outside the service (``lace stream --deliver``) to a running ``lace serve``:
``POST /queries/{id}/results`` in batches (docs/stream.md, "Moving a statement from the service to Spark").

The service records each batch in one transaction as the query's alerts, de-duplicated by event ids with the
alerts it already has (its own and earlier imports), and delivers the new ones to the query's webhooks: sending
the same matches again records and delivers nothing twice.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

API_KEY_ENV = "LACE_API_KEY"
"""The environment variable of the API key (scope ``admin``) when ``--api-key`` is not given."""
BATCH_BYTES = 512 * 1024
"""Most bytes per request (the service's default limit for bodies other than ``POST /events`` is 1 MiB)."""
BATCH_LINES = 2_000
"""Most matches per request (one database transaction each)."""


class DeliverError(RuntimeError):
    """The service could not be reached or refused a request; the message is one line a user can act on."""


@dataclass
class Delivered:
    """Totals of the batches the service took: matches sent, new alerts, matches already alerted."""

    received: int = 0
    alerts: int = 0
    duplicates: int = 0


def batches(lines: Iterable[bytes], max_bytes: int = BATCH_BYTES, max_lines: int = BATCH_LINES) -> Iterator[bytes]:
    """NDJSON bodies of whole lines (each ending in a newline), at most ``max_lines`` lines and ``max_bytes``
    bytes each (a single longer line is a body of its own).

    >>> list(batches([b"a\\n", b"bb\\n", b"c\\n"], max_bytes=5))
    [b'a\\nbb\\n', b'c\\n']
    """
    body: list[bytes] = []
    size = 0
    for line in lines:
        if body and (size + len(line) > max_bytes or len(body) >= max_lines):
            yield b"".join(body)
            body, size = [], 0
        body.append(line)
        size += len(line)
    if body:
        yield b"".join(body)


class ResultsClient:
    """The results route of query ``query_id`` at the service ``base_url`` (e.g. ``http://127.0.0.1:8080``),
    with API key ``api_key`` (scope ``admin``); ``timeout_s`` per request, seconds."""

    def __init__(self, base_url: str, query_id: int, api_key: str | None, timeout_s: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.query_id = query_id
        self.path = f"/queries/{query_id}/results"
        import httpx  # here: `lace` commands that do not talk to a service do not import it

        headers = {"content-type": "application/x-ndjson"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self.client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)

    def __enter__(self) -> ResultsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def check(self) -> None:
        """An empty import (records nothing): the service answers, the key may import, the query exists.

        Raises
        ------
        DeliverError
            Otherwise, saying which.
        """
        self._post(b"")

    def send(self, lines: Iterable[bytes]) -> Delivered:
        """POST ``lines`` (NDJSON lines of match objects, each ending in a newline) in :func:`batches`; return
        the totals.

        Raises
        ------
        DeliverError
            On the first batch the service did not take (the batches before it are recorded; sending them again
            is harmless), with how many matches were recorded before it.
        """
        total = Delivered()
        for body in batches(lines):
            try:
                got = self._post(body)
            except DeliverError as e:
                if total.received:
                    raise DeliverError(
                        f"{e} (the first {total.received} matches were recorded: sending all again is harmless)"
                    ) from None
                raise
            total.received += got["received"]
            total.alerts += got["alerts"]
            total.duplicates += got["duplicates"]
        return total

    def _post(self, body: bytes) -> dict[str, int]:
        import httpx

        where = f"{self.base_url}{self.path}"
        try:
            r = self.client.post(self.path, content=body)
        except httpx.HTTPError as e:
            raise DeliverError(f"cannot reach the service at {self.base_url}: {e or type(e).__name__}") from None
        if r.status_code == 200:
            try:
                got = r.json()
                return {k: int(got[k]) for k in ("received", "alerts", "duplicates")}
            except (ValueError, KeyError, TypeError):
                raise DeliverError(f"POST {where} answered 200 without the counts: is it a LACE service?") from None
        reason = _reason(r)
        if r.status_code == 401:
            raise DeliverError(f"POST {where}: 401 {reason}: give --api-key (or {API_KEY_ENV}) a key of scope admin")
        if r.status_code == 403:
            raise DeliverError(f"POST {where}: 403 {reason}: the API key needs scope admin")
        if r.status_code == 404:
            raise DeliverError(f"POST {where}: 404 {reason}: check --query-id and the service URL")
        raise DeliverError(f"POST {where}: {r.status_code} {reason}")


def _reason(r: httpx.Response) -> str:
    """The first ``reason`` of a LACE error body, else the start of the body."""
    try:
        return str(r.json()["detail"][0]["reason"])
    except (ValueError, KeyError, IndexError, TypeError):
        return " ".join(r.text.split())[:200] or r.reason_phrase
