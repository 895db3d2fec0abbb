"""Questions the launcher asks about this machine's network: which hosts are this machine, which
address the workers should dial, which address an interface has.

Nothing here sends traffic: a UDP ``connect`` only asks the kernel for a route.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def interface_addresses() -> dict[str, str]:
    """This machine's network interfaces that have an IPv4 address, name -> address."""
    addresses = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR,
                                     struct.pack("256s", name.encode()[:15]))
            except OSError:  # the interface has no IPv4 address
                continue
            addresses[name] = socket.inet_ntoa(packed[20:24])
    return addresses


def resolve(hostname: str) -> str | None:
    """The host's IPv4 address, or ``None`` when it does not resolve.

    Names under ``.localhost`` are this machine's loopback address, as RFC 6761 reserves them,
    whether or not the system's resolver knows them: the job service names the nodes of a local
    cluster so (``node3.localhost``), which keeps them apart as hosts of an elastic launch.
    """
    if hostname.lower().rstrip(".").endswith(".localhost"):
        return "127.0.0.1"
    try:
        return str(socket.getaddrinfo(hostname, None, socket.AF_INET)[0][4][0])
    except (OSError, IndexError):
        return None


def is_this_machine(hostname: str, local_addresses: frozenset[str]) -> bool:
    """Whether a rank on ``hostname`` runs as a local process rather than over ssh.

    As in Horovod, a host is this machine when its name is ``localhost`` or this machine's name,
    or it resolves to an address of one of this machine's interfaces (so does any name under
    ``.localhost``, see :func:`resolve`; ``local_addresses`` are :func:`interface_addresses`'
    values). ``127.0.0.2`` is not: no interface has it, so it stands for another host (the tests
    use this).
    """
    if hostname in ("localhost", socket.gethostname()):
        return True
    return resolve(hostname) in local_addresses


def is_loopback(hostname: str) -> bool:
    """Whether ``hostname`` is reached over the loopback interface (localhost, 127.x.x.x, or
    a name of this machine that resolves to loopback)."""
    if hostname == "localhost":
        return True
    address = resolve(hostname)
    return address is not None and ipaddress.ip_address(address).is_loopback


def route_source(hostname: str) -> str | None:
    """The address this machine uses to reach ``hostname``, or ``None`` when there is no route."""
    address = resolve(hostname)
    if address is None:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((address, 9))  # any port: UDP connect only picks the route
        except OSError:
            return None
        return sock.getsockname()[0]


def loopback_interface(addresses: dict[str, str]) -> str:
    """The name of the loopback interface (``lo`` on Linux)."""
    for name, address in addresses.items():
        if ipaddress.ip_address(address).is_loopback:
            return name
    return "lo"
