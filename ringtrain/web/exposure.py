"""Who may reach a ringtrain server: loopback only, unless it is given a bearer token.

Both of ringtrain's servers act on this host (the job service starts processes, the model server
spends its cores), so one reachable from other machines must authenticate its clients.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket

from ringtrain.errors import ConfigError


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    # A dual-stack socket reports an IPv4 peer as ::ffff:a.b.c.d, which Python 3.11 does not
    # call loopback even for 127.0.0.1.
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def check_bind(host: str, token: str | None, service: str, reason: str) -> None:
    """Refuse to bind ``service`` (``"the job service"``) to a non-loopback ``host`` without a
    ``token``; the message says ``reason``, why exposing it is dangerous (``"it runs commands
    on this host"``).

    Raises:
        ConfigError: ``host`` is reachable from other machines and ``token`` is empty.
    """
    if not is_loopback(host) and not token:
        raise ConfigError(f"binding {service} to {host} exposes it to the network, and {reason}: "
                          "pass --token (or set RINGTRAIN_TOKEN); clients then send "
                          "`Authorization: Bearer <token>`")


def bearer_credentials(authorization: bytes) -> bytes | None:
    """What an ``Authorization: Bearer <credentials>`` header carries; ``None`` for another
    scheme. The scheme's name is case-insensitive (RFC 9110, section 11.1): clients send
    ``bearer`` too."""
    scheme, _, credentials = authorization.partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    return credentials.lstrip(b" ")


def bearer_matches(authorization: str, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <token>`` (the token compared in
    constant time)."""
    given = bearer_credentials(authorization.encode())
    return given is not None and secrets.compare_digest(given, token.encode())


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: a free one), IPv6 for an address with ':'.

    Its connections send without Nagle's delay. asyncio turns Nagle off only on sockets whose
    protocol number says TCP, and a socket made with protocol 0 does not: then every response
    after the first on a kept-alive connection waited for the client's delayed ACK, 40 ms
    (measured with `ringtrain serve`: 44 ms for `/v2/health/live`, 3 ms with this).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it on Linux; asyncio sets it again where it can.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock


def client_url(host: str, port: int, tls: bool = False) -> str:
    """How a client on this host reaches a server bound to ``host:port`` (``tls``: over
    HTTPS)."""
    if host in ("0.0.0.0", "localhost"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    scheme = "https" if tls else "http"
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
