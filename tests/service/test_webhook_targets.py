"""Webhook deliveries connect only to addresses that passed the target check (issue 46).

The dispatcher's connector resolves through :class:`service.webhooks.targets.CheckedResolver`, which wraps the
resolver that answers the names. That inner resolver is the injection point: :class:`Answers` answers each lookup
with the next address list, as a rebinding DNS server (TTL 0) does. The rest is real: a migrated SQLite outbox, the
:class:`~service.webhooks.dispatcher.Dispatcher` on its own thread, real HTTP to a
:class:`~cli.webhook_receiver.Receiver` on 127.0.0.1. The webhook's host, ``rebind.test``, resolves nowhere else
(``.test`` is reserved), so anything that reaches the receiver went to an address the checked resolver handed over.
"""
from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp.abc import AbstractResolver, ResolveResult
from sqlalchemy.orm import Session, sessionmaker

from cli.service_process import Database, wait_until
from cli.webhook_receiver import Receiver
from service.core.config import Settings
from service.core.metrics import Metrics
from service.core.security import new_idempotency_key
from service.db.migrate import upgrade
from service.db.models import AlertRow, DeliveryRow, QueryRow, WebhookRow
from service.db.session import make_engine, make_session_factory, now_us, transaction
from service.webhooks import delivery, webhook
from service.webhooks.dispatcher import Dispatcher, _env_proxy
from service.webhooks.targets import AddressesRefused, CheckedResolver, literal_refused

sqlite_only = pytest.mark.parametrize("database_kind", ["sqlite"], indirect=True)  # the outbox's database

HOST = "rebind.test"


class Answers(AbstractResolver):
    """Answers the n-th lookup with ``answers[n]`` (the last one again once they run out); :attr:`asked` lists the
    names looked up."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked.append(host)
        addrs = self.answers[min(len(self.asked), len(self.answers)) - 1]
        return [
            ResolveResult(
                hostname=host,
                host=a,
                port=port,
                family=socket.AF_INET6 if ":" in a else socket.AF_INET,
                proto=socket.IPPROTO_TCP,
                flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
            )
            for a in addrs
        ]

    async def close(self) -> None:
        pass


def settings(tmp: Path, **kw: Any) -> Settings:
    """Quick retries (2 attempts, 50 ms apart), nothing but public addresses allowed unless ``kw`` says so."""
    base: dict[str, Any] = {
        "data_dir": tmp,
        "secret_key": secrets.token_urlsafe(32),
        "webhook_max_attempts": 2,
        "webhook_backoff_base_s": 0.05,
        "webhook_backoff_max_s": 0.05,
        "webhook_poll_s": 0.05,
        "webhook_timeout_s": 3,
    }
    return Settings(_env_file=None, **{**base, **kw})  # type: ignore[call-arg]


@pytest.fixture
def outbox(fresh_db: Database) -> Iterator[sessionmaker[Session]]:
    upgrade(fresh_db.url)
    engine = make_engine(fresh_db.url)
    yield make_session_factory(engine)
    engine.dispose()


def add_delivery(sessions: sessionmaker[Session], s: Settings, url: str) -> int:
    """A query, a webhook at ``url`` (made as ``POST /webhooks`` makes it: its URL checked), one alert and its
    pending delivery; the delivery's id."""
    now = now_us()
    with transaction(sessions) as tx:
        q = QueryRow(name=f"q{secrets.token_hex(3)}", text="-", state="active", types=["t"], window_us=None,
                     version=1, active_since_us=now, created_at_us=now, updated_at_us=now)
        tx.add(q)
    with sessions() as tx:
        wid = webhook.create(tx, s, q.id, url).id
    with transaction(sessions) as tx:
        a = AlertRow(query_id=q.id, dedup_key=secrets.token_hex(8), events={"a": [1]}, fields={}, start_us=now,
                     end_us=now, created_at_us=now, query_version=1)
        tx.add(a)
        tx.flush()
        d = DeliveryRow(alert_id=a.id, webhook_id=wid, idempotency_key=new_idempotency_key(), status="pending",
                        attempts=0, next_attempt_at_us=now, created_at_us=now)
        tx.add(d)
    return d.id


def shown(sessions: sessionmaker[Session], delivery_id: int) -> dict[str, Any]:
    """What ``GET /deliveries/{id}`` answers for the delivery (its attempt log included)."""
    with sessions() as tx:
        return delivery.detail(tx, delivery.get(tx, delivery_id)).model_dump()


@contextmanager
def dispatching(sessions: sessionmaker[Session], s: Settings, resolver: AbstractResolver | None) -> Iterator[Metrics]:
    """A running dispatcher whose connector resolves through ``resolver`` (None: aiohttp's default); its metrics."""
    metrics = Metrics()
    d = Dispatcher(sessions=sessions, settings=s, metrics=metrics, resolver=resolver)
    asyncio.run(d.start())
    try:
        yield metrics
    finally:
        asyncio.run(d.stop())


def counted(metrics: Metrics, name: str) -> float:
    return metrics.registry.get_sample_value(name) or 0.0


@sqlite_only
@pytest.mark.parametrize(
    ("answer", "kind"),
    [("127.0.0.1", "loopback"), ("::ffff:127.0.0.1", "loopback"), ("169.254.169.254", "link-local")],
)
def test_an_attempt_never_connects_to_a_refused_answer(
    outbox: sessionmaker[Session], receiver: Receiver, tmp_path: Path, answer: str, kind: str
) -> None:
    """The name answers a refused address when the attempt resolves it: each attempt fails with the reason, the
    receiver on 127.0.0.1 gets nothing, the failures are counted and shown on the delivery; the endpoint's circuit
    stays closed (the endpoint did not fail, nothing was sent)."""
    s = settings(tmp_path)
    did = add_delivery(outbox, s, f"http://{HOST}:{receiver.port}/hook")  # accepted: it does not resolve here
    dns = Answers([answer])
    with dispatching(outbox, s, dns) as metrics:
        assert wait_until(lambda: shown(outbox, did)["status"] == "dead", timeout_s=10), shown(outbox, did)
    d = shown(outbox, did)
    assert receiver.received == []
    assert dns.asked == [HOST, HOST]  # one lookup per attempt, the connector's, and no other
    reason = f"target refused: {HOST} targets a {kind} address ({answer}), which is not allowed (set LACE_WEBHOOK_"
    assert d["last_error"].startswith(reason), d
    assert [(a["outcome"], a["status_code"], a["error"]) for a in d["log"]] == [
        ("failed", None, d["last_error"]),
        ("dead", None, d["last_error"]),
    ]
    assert counted(metrics, "lace_alert_delivery_failures_total") == 2
    assert counted(metrics, "lace_alerts_dead_lettered_total") == 1
    assert counted(metrics, "lace_alerts_delivered_total") == 0
    with outbox() as tx:
        w = tx.get(WebhookRow, d["webhook_id"])
        assert w is not None and (w.circuit, w.failures) == ("closed", 0)


@sqlite_only
def test_refused_answers_are_dropped_and_the_allowed_one_is_connected_to(
    outbox: sessionmaker[Session], receiver: Receiver, tmp_path: Path
) -> None:
    """Loopback allowed, link-local not: of the answer (169.254.169.254, 127.0.0.1) only 127.0.0.1 reaches the
    connector, and the delivery arrives there, with the webhook's name as its Host."""
    s = settings(tmp_path, webhook_allow_loopback=True)
    did = add_delivery(outbox, s, f"http://{HOST}:{receiver.port}/hook")
    dns = Answers(["169.254.169.254", "127.0.0.1"])
    with dispatching(outbox, s, dns) as metrics:
        assert wait_until(lambda: shown(outbox, did)["status"] == "delivered", timeout_s=10), shown(outbox, did)
    assert [r["headers"]["host"] for r in receiver.received] == [f"{HOST}:{receiver.port}"]
    assert dns.asked == [HOST]
    assert counted(metrics, "lace_alerts_delivered_total") == 1


@sqlite_only
def test_the_default_resolver_is_checked_too(outbox: sessionmaker[Session], receiver: Receiver, tmp_path: Path) -> None:
    """aiohttp's own resolver behind the check: ``localhost`` is refused without loopback allowed (before any
    lookup), and delivered to with it."""
    strict, loose = settings(tmp_path), settings(tmp_path, webhook_allow_loopback=True)
    did = add_delivery(outbox, loose, f"http://localhost:{receiver.port}/hook")  # made while loopback was allowed
    with dispatching(outbox, strict, None):
        assert wait_until(lambda: shown(outbox, did)["status"] == "dead", timeout_s=10), shown(outbox, did)
    assert receiver.received == []
    assert shown(outbox, did)["last_error"] == (
        "target refused: localhost targets a loopback address (127.0.0.1), which is not allowed "
        "(set LACE_WEBHOOK_ALLOW_LOOPBACK=true to allow)"
    )
    with outbox() as tx:
        assert delivery.redeliver(tx, did).status == "pending"
    with dispatching(outbox, loose, None):
        assert wait_until(lambda: shown(outbox, did)["status"] == "delivered", timeout_s=10), shown(outbox, did)
    assert len(receiver.received) == 1


@sqlite_only
def test_through_a_proxy_the_proxy_connects(
    outbox: sessionmaker[Session], receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``HTTP_PROXY`` set the request goes to the proxy (here on 127.0.0.1, though loopback targets are
    refused: the proxy is the operator's) and the webhook's name is the proxy's to resolve: the checked resolver
    is not asked."""
    for name in ("http_proxy", "https_proxy", "no_proxy", "NO_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{receiver.port}")
    _env_proxy.cache_clear()
    try:
        s = settings(tmp_path)
        did = add_delivery(outbox, s, f"http://{HOST}:9/hook")
        dns = Answers(["127.0.0.1"])
        with dispatching(outbox, s, dns):
            assert wait_until(lambda: shown(outbox, did)["status"] == "delivered", timeout_s=10), shown(outbox, did)
    finally:
        _env_proxy.cache_clear()
    assert [r["headers"]["host"] for r in receiver.received] == [f"{HOST}:9"]
    assert dns.asked == []


# ------------------------------------------------------------------ the resolver and the literal check alone


def test_the_checked_resolver_judges_every_answer_of_every_lookup(tmp_path: Path) -> None:
    """Each lookup is judged on its own answer: public, then loopback (rebinding), then a mix."""
    dns = Answers(
        ["93.184.216.34"],
        ["127.0.0.1"],
        ["93.184.216.34", "127.0.0.1", "::ffff:127.0.0.1", "169.254.169.254", "fe80::1%1", "10.0.0.1", "0.0.0.0"],
    )
    checked = CheckedResolver(settings(tmp_path), dns)

    async def lookups() -> list[Any]:
        out: list[Any] = []
        for _ in range(3):
            try:
                out.append([r["host"] for r in await checked.resolve(HOST, 443, socket.AF_UNSPEC)])
            except AddressesRefused as e:
                out.append(e.strerror)
        return out

    first, second, third = asyncio.run(lookups())
    assert first == ["93.184.216.34"]
    assert second == (
        f"{HOST} targets a loopback address (127.0.0.1), which is not allowed "
        "(set LACE_WEBHOOK_ALLOW_LOOPBACK=true to allow)"
    )
    assert third == ["93.184.216.34"]

    loose = CheckedResolver(settings(tmp_path, webhook_allow_loopback=True, webhook_allow_link_local=True), dns)
    kept = asyncio.run(loose.resolve(HOST, 443, socket.AF_UNSPEC))
    assert [r["host"] for r in kept] == [
        "93.184.216.34", "127.0.0.1", "::ffff:127.0.0.1", "169.254.169.254", "fe80::1%1"
    ]

    none_left = Answers(["10.0.0.1", "::ffff:169.254.169.254"])
    with pytest.raises(AddressesRefused) as e:
        asyncio.run(CheckedResolver(settings(tmp_path), none_left).resolve(HOST))
    assert e.value.strerror == (
        f"{HOST} targets a private address (10.0.0.1), which is not allowed (set LACE_WEBHOOK_ALLOW_PRIVATE=true to "
        "allow); targets a link-local address (::ffff:169.254.169.254), which is not allowed "
        "(set LACE_WEBHOOK_ALLOW_LINK_LOCAL=true to allow)"
    )
    never = Answers(["93.184.216.34"])
    with pytest.raises(AddressesRefused, match="loopback"):
        asyncio.run(CheckedResolver(settings(tmp_path), never).resolve("api.localhost"))
    assert never.asked == []


def test_ip_literals_are_checked_before_the_attempt(tmp_path: Path) -> None:
    """aiohttp does not resolve what looks like an IP address: those hosts are judged as they are."""
    s = settings(tmp_path)
    assert literal_refused("example.com", s) is None  # a name: the resolver's
    assert literal_refused("93.184.216.34", s) is None
    assert "loopback" in str(literal_refused("127.0.0.1", s))
    assert "loopback" in str(literal_refused("::ffff:7f00:1", s))
    assert "link-local" in str(literal_refused("169.254.169.254", s))
    assert "reserved" in str(literal_refused("0.0.0.0", s))
    assert literal_refused("2130706433", s) == "2130706433 is not an IP address"
    assert literal_refused("127.0.0.1", settings(tmp_path, webhook_allow_loopback=True)) is None
