"""Which hosts a webhook may target: public addresses, plus loopback, private or link-local ones
when a setting allows them (``LACE_WEBHOOK_ALLOW_LOOPBACK`` / ``_PRIVATE`` / ``_LINK_LOCAL``).

A URL is checked when it is set (its host name resolved; a name that does not resolve yet is
accepted) and again before every attempt, so a name that later resolves to a refused address is
not sent to (the attempt fails with the reason). What remains is the short window between that
resolution and the HTTP client's own (DNS rebinding within a second); a deployment that must close it puts
an egress proxy in front.
"""
from __future__ import annotations

import ipaddress
import socket
from functools import lru_cache

from service.core.config import Settings

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT: not "private" to the ipaddress module


class TargetRefused(ValueError):
    """The host is (or resolves to) an address the settings do not allow."""


def address_kind(ip: IpAddress) -> str | None:
    """``loopback``, ``link-local``, ``private`` or ``reserved`` for a non-public address; None if public.

    >>> [address_kind(ipaddress.ip_address(a)) for a in ("127.0.0.1", "169.254.169.254", "10.0.0.1", "8.8.8.8")]
    ['loopback', 'link-local', 'private', None]
    """
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_unspecified or ip.is_multicast or ip.is_reserved:
        return "reserved"
    if ip.is_private or (isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED):
        return "private"
    return None


def _allowed(kind: str | None, settings: Settings) -> bool:
    return (
        kind is None
        or (kind == "loopback" and settings.webhook_allow_loopback)
        or (kind == "private" and settings.webhook_allow_private)
        or (kind == "link-local" and settings.webhook_allow_link_local)
    )


def _setting(kind: str) -> str:
    return {"loopback": "LACE_WEBHOOK_ALLOW_LOOPBACK", "private": "LACE_WEBHOOK_ALLOW_PRIVATE"}.get(
        kind, "LACE_WEBHOOK_ALLOW_LINK_LOCAL" if kind == "link-local" else ""
    )


def resolve(host: str) -> list[IpAddress]:
    """The addresses of ``host`` (an IP literal, or a name through the resolver); [] if it does not resolve."""
    literal = host.strip("[]")
    try:
        return [ipaddress.ip_address(literal)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(literal, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    return [ipaddress.ip_address(str(i[4][0]).split("%", 1)[0]) for i in infos]


def check_target(host: str, settings: Settings, *, addresses: list[IpAddress] | None = None) -> None:
    """Raise :class:`TargetRefused` unless every address of ``host`` is allowed.

    ``localhost`` and ``*.localhost`` count as loopback without asking the resolver.
    """
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        addrs: list[IpAddress] = [ipaddress.ip_address("127.0.0.1")]
    else:
        addrs = resolve(host) if addresses is None else addresses
    for ip in addrs:
        kind = address_kind(ip)
        if not _allowed(kind, settings):
            extra = f" (set {_setting(kind or '')}=true to allow)" if kind and _setting(kind) else ""
            raise TargetRefused(f"targets a {kind} address ({ip}), which is not allowed{extra}")


@lru_cache(maxsize=1024)
def _cached(host: str, minute: int) -> tuple[IpAddress, ...]:
    return tuple(resolve(host))


def check_target_cached(host: str, settings: Settings, now_s: float) -> None:
    """:func:`check_target` with the resolution cached for up to a minute (the dispatcher's check)."""
    check_target(host, settings, addresses=list(_cached(host, int(now_s // 60))))
