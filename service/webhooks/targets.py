"""Which addresses a webhook delivery may connect to: public ones, plus loopback, private or link-local ones when a
setting allows them (``LACE_WEBHOOK_ALLOW_LOOPBACK`` / ``_PRIVATE`` / ``_LINK_LOCAL``).

The guarantee: a delivery sent directly (no egress proxy) connects only to addresses that passed the check, because
the check sits where the HTTP client gets its addresses. :class:`CheckedResolver` is the resolver of the
dispatcher's connector: it resolves the host once, drops every address the settings refuse and hands the connector
only the rest; when none is left the attempt fails with the reason (:class:`AddressesRefused`). There is no second,
unchecked resolution, so a name whose DNS answers a public address to one lookup and ``127.0.0.1`` to the next
(DNS rebinding) is checked on the answer that is connected to. aiohttp may reuse that checked answer for up to its
DNS cache's 10 s, and a kept-alive connection to it, but never an address that did not pass. IP literals never reach
a resolver: :func:`literal_refused` checks them before every attempt.

Through an egress proxy (``HTTP_PROXY`` / ``HTTPS_PROXY``) the proxy resolves the webhook's host and connects: the
service checks IP literals before every attempt and every URL when it is set, but which address a name reaches is
then up to the proxy's rules.

When a URL is set (``POST``/``PATCH /webhooks``) :func:`check_target` refuses it early (422) if its host is, or
resolves to, any refused address. A name that does not resolve at that moment is accepted: its attempts fail
("does not resolve") until it does, and then connect only to allowed addresses. (The service may have no DNS for
outside names when an egress proxy resolves them, and a receiver may not be deployed yet.)
"""
from __future__ import annotations

import errno
import ipaddress
import socket

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.helpers import is_ip_address

from service.core.config import Settings

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT: not "private" to the ipaddress module


class TargetRefused(ValueError):
    """The host is (or resolves to) an address the settings do not allow."""


class AddressesRefused(OSError):
    """Every address a host name resolved to is refused: what :class:`CheckedResolver` raises.

    An ``OSError`` (``errno`` ``EACCES``, the reason in ``strerror``), so aiohttp's connector reports it as a failed
    connection (``aiohttp.ClientConnectorDNSError``, whose ``os_error`` is this exception) and connects nowhere.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(errno.EACCES, reason)


def address_kind(ip: IpAddress) -> str | None:
    """``loopback``, ``link-local``, ``private`` or ``reserved`` for a non-public address; None if public.

    An IPv4-mapped IPv6 address (``::ffff:a.b.c.d``) is judged as its IPv4 address.

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


_SETTING = {
    "loopback": "LACE_WEBHOOK_ALLOW_LOOPBACK",
    "private": "LACE_WEBHOOK_ALLOW_PRIVATE",
    "link-local": "LACE_WEBHOOK_ALLOW_LINK_LOCAL",
}


def refusal(ip: IpAddress, settings: Settings) -> str | None:
    """Why ``ip`` may not be connected to under ``settings``; None when it may.

    Parameters
    ----------
    ip : IPv4Address | IPv6Address
        The address (an IPv4-mapped IPv6 address is judged as its IPv4 address).
    settings : Settings
        ``webhook_allow_loopback``, ``webhook_allow_private`` and ``webhook_allow_link_local`` are read.

    Returns
    -------
    str | None
        e.g. ``"targets a loopback address (127.0.0.1), which is not allowed (set LACE_WEBHOOK_ALLOW_LOOPBACK=true
        to allow)"``; reserved addresses (unspecified, multicast, 240/4) are never allowed.
    """
    kind = address_kind(ip)
    allowed = (
        kind is None
        or (kind == "loopback" and settings.webhook_allow_loopback)
        or (kind == "private" and settings.webhook_allow_private)
        or (kind == "link-local" and settings.webhook_allow_link_local)
    )
    if allowed:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        shown = f"::ffff:{ip.ipv4_mapped}"  # as it is usually written (str() gives ::ffff:7f00:1)
    else:
        shown = str(ip)
    extra = f" (set {_SETTING[kind]}=true to allow)" if kind in _SETTING else ""
    return f"targets a {kind} address ({shown}), which is not allowed{extra}"


def _is_localhost(host: str) -> bool:
    """``localhost`` and ``*.localhost`` (RFC 6761): loopback whatever a resolver answers."""
    name = host.strip("[]").rstrip(".").lower()
    return name == "localhost" or name.endswith(".localhost")


_LOOPBACK = ipaddress.ip_address("127.0.0.1")


def resolve(host: str) -> list[IpAddress]:
    """The addresses of ``host`` (the check when a URL is set; deliveries resolve through :class:`CheckedResolver`).

    Parameters
    ----------
    host : str
        An IP literal (bracketed or not) or a name, looked up with ``socket.getaddrinfo`` (blocking).

    Returns
    -------
    list of IPv4Address | IPv6Address
        The literal, or every address of the name in the resolver's order (IPv6 scope ids dropped); ``[]`` when
        it does not resolve (no error is raised).
    """
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
    """Refuse ``host`` unless every address it has is allowed (the check when a webhook's URL is set).

    Parameters
    ----------
    host : str
        A URL's host: a name, an IPv4 literal or an IPv6 literal (bracketed or not). ``localhost`` and
        ``*.localhost`` count as loopback without asking the resolver.
    settings : Settings
        Which kinds of address are allowed (:func:`refusal`).
    addresses : list of IPv4Address | IPv6Address, optional
        The addresses to judge; default :func:`resolve` (``host``). A name that does not resolve has none, and
        passes.

    Raises
    ------
    TargetRefused
        With the reason of the first refused address.
    """
    if _is_localhost(host):
        addrs: list[IpAddress] = [_LOOPBACK]
    else:
        addrs = resolve(host) if addresses is None else addresses
    for ip in addrs:
        reason = refusal(ip, settings)
        if reason is not None:
            raise TargetRefused(reason)


def literal_refused(host: str, settings: Settings) -> str | None:
    """Why an attempt may not connect to ``host`` when aiohttp would not resolve it; None otherwise.

    aiohttp hands a host that looks like an IP address (``aiohttp.helpers.is_ip_address``: digits and dots, or any
    colon) straight to the socket, without a resolver, so :class:`CheckedResolver` never sees it: such a host must
    be an IP address the settings allow. A name returns None (the resolver checks it).

    Parameters
    ----------
    host : str
        The URL's raw host (``yarl.URL.raw_host``: IPv6 without brackets, an IDN in its ASCII form).
    settings : Settings
        Which kinds of address are allowed (:func:`refusal`).

    Returns
    -------
    str | None
        ``"<host> targets a ... address ..."``, or ``"<host> is not an IP address"`` for a numeric form that the
        ``ipaddress`` module does not read (``2130706433``, which aiohttp refuses too).
    """
    if not is_ip_address(host):
        return None
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return f"{host} is not an IP address"
    reason = refusal(ip, settings)
    return None if reason is None else f"{host} {reason}"


class CheckedResolver(AbstractResolver):
    """The resolver of the dispatcher's connector: hands it only the addresses the settings allow.

    Each :meth:`resolve` asks ``resolver`` once, drops every address :func:`refusal` refuses and returns the rest;
    when none is left it raises :class:`AddressesRefused` with the reasons, and the connection attempt fails
    without connecting anywhere.

    Parameters
    ----------
    settings : Settings
        Which kinds of address are allowed (:func:`refusal`).
    resolver : aiohttp.abc.AbstractResolver
        What answers the names: aiohttp's ``DefaultResolver`` in the service (``getaddrinfo`` on a thread, or
        aiodns when installed); in tests, one that answers what the test needs. It is closed with this resolver.
    """

    def __init__(self, settings: Settings, resolver: AbstractResolver) -> None:
        self.settings = settings
        self.resolver = resolver

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """The addresses of ``host`` that the settings allow.

        Parameters
        ----------
        host : str
            A host name (aiohttp never asks a resolver about an IP literal).
        port : int
            The TCP port, copied into the results.
        family : socket.AddressFamily
            ``AF_INET``, ``AF_INET6`` or ``AF_UNSPEC`` (the connector's).

        Returns
        -------
        list of aiohttp.abc.ResolveResult
            The inner resolver's answers whose ``host`` is an allowed address, in its order (at least one).

        Raises
        ------
        AddressesRefused
            The name is ``localhost`` / ``*.localhost`` and loopback is not allowed (the inner resolver is not
            asked), or every answer is refused (the reasons joined by ``"; "``).
        OSError
            Whatever the inner resolver raises (``socket.gaierror``: the name does not resolve).
        """
        if _is_localhost(host):
            reason = refusal(_LOOPBACK, self.settings)
            if reason is not None:
                raise AddressesRefused(f"{host} {reason}")
        answers = await self.resolver.resolve(host, port, family)
        kept: list[ResolveResult] = []
        refused: list[str] = []
        for answer in answers:
            try:
                ip = ipaddress.ip_address(answer["host"].split("%", 1)[0])  # an IPv6 scope id is not the address
            except ValueError:
                refused.append(f"the answer {answer['host']!r} is not an IP address")
                continue
            reason = refusal(ip, self.settings)
            if reason is None:
                kept.append(answer)
            else:
                refused.append(reason)
        if not kept:
            if not refused:
                raise AddressesRefused(f"{host} has no address")
            raise AddressesRefused(f"{host} {'; '.join(dict.fromkeys(refused))}")
        return kept

    async def close(self) -> None:
        """Close the inner resolver."""
        await self.resolver.close()
