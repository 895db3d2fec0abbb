"""Rendezvous: where the launcher serves the job's ``TCPStore`` and how the workers reach it.

The launcher owns the store for the whole launch (``RINGTRAIN_LAUNCHER_STORE=1`` tells workers
to connect as clients); every ``init()`` of the workers keys its data under
``env.store_prefix(run_id, generation)``.
"""

from __future__ import annotations

import datetime
import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from ringtrain.errors import ConfigError
from ringtrain.runner import network

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NetworkPlan:
    """How ranks reach the launcher and each other.

    ``socket_ifnames`` go to the workers as GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME. When
    ``ifnames_explicit`` is false they were derived (loopback for a single-machine job) and a
    value the user exported wins over them.
    """

    master_addr: str
    socket_ifnames: tuple[str, ...]
    ifnames_explicit: bool
    local_hosts: frozenset[str]


def plan_network(hostnames: Sequence[str], network_interfaces: Sequence[str]) -> NetworkPlan:
    """The store address and the collectives' interfaces for a job on ``hostnames`` (those
    that run a rank, in ``-H`` order): the address of the first ``--network-interfaces`` entry
    if given; else 127.0.0.1 (with the loopback interface for Gloo) when every host is reached
    over loopback; else the address this machine uses to reach the first remote host.

    Raises:
        ConfigError: a named interface does not exist or has no IPv4 address.
    """
    addresses = network.interface_addresses()
    local_hosts = frozenset(h for h in hostnames
                            if network.is_this_machine(h, frozenset(addresses.values())))
    if network_interfaces:
        missing = [n for n in network_interfaces if n not in addresses]
        if missing:
            raise ConfigError(
                f"--network-interfaces: {', '.join(missing)} has no IPv4 address on this "
                f"machine (interfaces with one: {', '.join(sorted(addresses)) or 'none'})")
        return NetworkPlan(addresses[network_interfaces[0]], tuple(network_interfaces), True,
                           local_hosts)
    if all(network.is_loopback(h) for h in hostnames):
        return NetworkPlan("127.0.0.1", (network.loopback_interface(addresses),), False,
                           local_hosts)
    remote = next(h for h in hostnames if h not in local_hosts and not network.is_loopback(h))
    address = network.route_source(remote)
    if address is None:
        # The job fails later with ssh's own message about the host; this is the best guess.
        address = socket.gethostname()
        log.warning("no route to %s; workers will dial the launcher at %s", remote, address)
    return NetworkPlan(address, (), False, local_hosts)


class StoreServer:
    """The launcher's ``torch.distributed.TCPStore``, listening on one address only.

    Use as a context manager; the store stops when the block ends.
    """

    def __init__(self, address: str, timeout_s: float, port: int = 0):
        """Start the store on ``port`` of ``address`` (0: a free one).

        Raises:
            OSError: the address cannot be bound.
        """
        import torch.distributed as dist  # the launcher needs torch only here

        # Bind the socket ourselves: TCPStore would listen on every interface, and a port
        # chosen here cannot be taken by someone else between choosing and binding.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(1024)
        except OSError:
            sock.close()
            raise
        self.address = address
        self.port: int = sock.getsockname()[1]
        self._store: dist.TCPStore | None = dist.TCPStore(
            address, self.port, is_master=True, wait_for_workers=False,
            timeout=datetime.timedelta(seconds=timeout_s),
            master_listen_fd=sock.detach(),  # the store owns and closes the socket now
        )
        log.debug("rendezvous store listening on %s:%d", address, self.port)

    @property
    def store(self):
        """A client of the store (the launcher's own, e.g. for the elastic driver).

        Raises:
            ValueError: the store was closed.
        """
        if self._store is None:
            raise ValueError("the rendezvous store was closed")
        return self._store

    def close(self) -> None:
        """Stop serving (idempotent)."""
        self._store = None

    def __enter__(self) -> StoreServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
