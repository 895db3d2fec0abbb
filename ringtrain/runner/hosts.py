"""Hosts and slots: parsing ``-H``/``--hostfile`` and assigning ranks to slots (pure functions).

The assignment is Horovod's ``get_host_assignments``: ranks fill the hosts in the order given,
each host up to its slots; ``local_*`` count the ranks on one host, ``cross_*`` the hosts that
have a rank with the same local rank.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ringtrain.contract.slots import SlotInfo

_HOSTNAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9._-]*[A-Za-z0-9_])?")


@dataclass(frozen=True)
class HostInfo:
    """A host and how many ranks it may run."""

    hostname: str
    slots: int


def parse_hosts(spec: str, source: str = "-H/--hosts") -> list[HostInfo]:
    """Parse ``host1:slots,host2:slots`` into the hosts in the order given; a host without
    ``:slots`` has one slot, as in mpirun. Errors name ``source``, how the user gave it.

    Raises:
        ValueError: an entry is empty, has a bad host name or slot count, or a host repeats.
    """
    hosts = [_parse_entry(entry, source) for entry in spec.split(",")]
    _check_unique(hosts, source)
    return hosts


def parse_hostfile(text: str, source: str = "--hostfile") -> list[HostInfo]:
    """Parse a hostfile: one ``host slots=N`` per line (``slots`` optional, default 1).

    Blank lines and everything after ``#`` are ignored.

    Raises:
        ValueError: a line is malformed, a host repeats, or the file names no host.
    """
    hosts = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source} line {lineno}"
        parts = line.split()
        slots = "1"
        if len(parts) == 2 and parts[1].startswith("slots="):
            slots = parts[1].removeprefix("slots=")
        elif len(parts) != 1:
            raise ValueError(f"{where}: {raw.strip()!r} is not `HOST slots=N`")
        hosts.append(HostInfo(_check_hostname(parts[0], where), _parse_slots(slots, where)))
    if not hosts:
        raise ValueError(f"{source} names no host; write one `HOST slots=N` per line")
    _check_unique(hosts, source)
    return hosts


def total_slots(hosts: Iterable[HostInfo]) -> int:
    """The number of ranks these hosts can run together."""
    return sum(h.slots for h in hosts)


def assign(hosts: Sequence[HostInfo], np: int) -> list[SlotInfo]:
    """One :class:`SlotInfo` per rank of ``np``, in rank order, exactly as Horovod's
    ``get_host_assignments``: earlier hosts fill first; hosts left without a rank get none.

    Raises:
        ValueError: ``np`` is below 1 or above the total number of slots.
    """
    capacity = total_slots(hosts)
    if not 1 <= np <= capacity:
        raise ValueError(f"cannot place {np} ranks on {capacity} slots")
    # local rank -> hostnames that have a rank with this local rank, in host order
    hosts_at_local: dict[int, list[str]] = {}
    per_host: list[tuple[str, list[int]]] = []
    rank = 0
    for host in hosts:
        ranks = list(range(rank, min(rank + host.slots, np)))
        rank += len(ranks)
        if ranks:
            per_host.append((host.hostname, ranks))
        for local_rank in range(len(ranks)):
            hosts_at_local.setdefault(local_rank, []).append(host.hostname)
    return [
        SlotInfo(
            hostname=hostname,
            rank=r,
            local_rank=local_rank,
            cross_rank=hosts_at_local[local_rank].index(hostname),
            size=np,
            local_size=len(ranks),
            cross_size=len(hosts_at_local[local_rank]),
        )
        for hostname, ranks in per_host
        for local_rank, r in enumerate(ranks)
    ]


def _parse_entry(entry: str, source: str) -> HostInfo:
    entry = entry.strip()
    if not entry:
        raise ValueError(f"{source} has an empty entry; write host1:slots,host2:slots")
    name, sep, slots = entry.partition(":")
    if sep and ":" in slots:
        raise ValueError(f"{source} entry {entry!r} is not host:slots (IPv6 addresses are not "
                         "supported; give the host's name)")
    return HostInfo(_check_hostname(name, f"{source} entry {entry!r}"),
                    _parse_slots(slots if sep else "1", f"{source} entry {entry!r}"))


def _check_hostname(name: str, where: str) -> str:
    if not _HOSTNAME.fullmatch(name):
        raise ValueError(f"{where}: {name!r} is not a host name or IPv4 address")
    return name


def _parse_slots(text: str, where: str) -> int:
    try:
        slots = int(text)
    except ValueError:
        raise ValueError(f"{where}: slots {text!r} is not a whole number") from None
    if slots < 1:
        raise ValueError(f"{where}: slots must be at least 1, not {slots}")
    return slots


def _check_unique(hosts: list[HostInfo], source: str) -> None:
    seen: set[str] = set()
    for host in hosts:
        if host.hostname in seen:
            raise ValueError(f"{source} lists host {host.hostname!r} twice; give it once with "
                             "the total number of slots")
        seen.add(host.hostname)
