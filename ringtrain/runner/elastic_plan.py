"""Elastic planning: which workers form the next world, on which slots (pure; nothing starts).

A world is planned from the workers still alive, in their current rank order, and the slots the
hosts offer now. Survivors keep their places where their host still has room, so that rank 0
(whose state every new member receives) is a survivor; new workers fill the remaining slots,
hosts of survivors first, then new hosts in discovery order; ``max_np`` caps the total. Ranks,
local and cross ranks then follow Horovod's assignment (``hosts.assign``) over that host order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ringtrain.contract.slots import SlotInfo
from ringtrain.runner.hosts import HostInfo, assign


@dataclass(frozen=True)
class Worker:
    """One worker process of an elastic launch; ``id`` is never reused within the launch."""

    id: int
    hostname: str


@dataclass(frozen=True)
class WorldPlan:
    """The next world: every member's slot (in rank order), who starts, who is left out."""

    slots: Mapping[int, SlotInfo]  # worker id -> slot
    new: tuple[Worker, ...]  # workers to start for this world
    removed: tuple[int, ...]  # live workers without a place (their host has fewer slots now)

    @property
    def size(self) -> int:
        """The number of ranks."""
        return len(self.slots)


def plan_world(live: Sequence[Worker], hosts: Sequence[HostInfo], max_np: int | None,
               next_id: int) -> WorldPlan:
    """Plan the next world from the ``live`` workers, in rank order of the current world
    (empty at the start), and the hosts' usable slots, in discovery order, with at most
    ``max_np`` ranks (``None``: no limit) and new workers numbered from ``next_id``. Its
    ``size`` may be 0 when no host has a slot."""
    room = {h.hostname: h.slots for h in hosts}
    limit = sum(room.values()) if max_np is None else max_np
    members: dict[str, list[Worker]] = {}
    removed = []
    for worker in live:
        on_host = members.setdefault(worker.hostname, [])
        if len(on_host) < room.get(worker.hostname, 0) and _count(members) < limit:
            on_host.append(worker)
        else:
            removed.append(worker.id)
    new: list[Worker] = []
    for host in [*members, *(h.hostname for h in hosts if h.hostname not in members)]:
        on_host = members.setdefault(host, [])
        while len(on_host) < room.get(host, 0) and _count(members) < limit:
            worker = Worker(next_id + len(new), host)
            new.append(worker)
            on_host.append(worker)
    placed = [HostInfo(host, len(workers)) for host, workers in members.items() if workers]
    size = _count(members)
    slots = assign(placed, size) if size else []
    workers = [w for host in placed for w in members[host.hostname]]
    return WorldPlan({w.id: slot for w, slot in zip(workers, slots)}, tuple(new),
                     tuple(removed))


def _count(members: Mapping[str, list[Worker]]) -> int:
    return sum(len(workers) for workers in members.values())


class FailedHosts:
    """Hosts where a worker failed: they keep only their surviving workers (no replacement is
    started there) until the discovery script reports them anew, with another slot count or
    after dropping them.

    Horovod blacklists such a host for good, stopping its surviving workers too; this is gentler,
    so that the slots of one machine can shrink without ending the job.
    """

    def __init__(self) -> None:
        self._caps: dict[str, tuple[int, int | None]] = {}  # host -> (cap, slots when it failed)

    def record_failure(self, hostname: str, survivors: int, reported: int | None) -> None:
        """A worker on ``hostname`` failed; ``survivors`` workers remain there, and discovery
        reports ``reported`` slots for it now."""
        self._caps[hostname] = (survivors, reported)

    def forget_changed(self, reported: Mapping[str, int]) -> None:
        """Lift the caps of hosts that discovery now reports differently."""
        self._caps = {host: cap for host, cap in self._caps.items()
                      if reported.get(host) == cap[1]}

    def usable(self, reported: Mapping[str, int]) -> list[HostInfo]:
        """The reported hosts with their usable slots, in the order reported."""
        return [HostInfo(host, min(slots, self._caps.get(host, (slots, None))[0]))
                for host, slots in reported.items()]
