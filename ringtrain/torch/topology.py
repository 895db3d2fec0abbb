"""Where each rank sits: local (same host) and cross (same local rank, other hosts) positions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Topology:
    """This rank's place among all ranks, as Horovod defines local and cross ranks."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    homogeneous: bool


def from_hostnames(rank: int, hostnames: Sequence[str]) -> Topology:
    """Compute the topology from every rank's hostname (indexed by rank).

    Ranks on one host are numbered locally in global-rank order; hosts are ordered by their lowest
    rank, and the cross communicator of local rank ``l`` holds one rank from every host that has a
    local rank ``l``.
    """
    me = hostnames[rank]
    local_rank = sum(1 for h in hostnames[:rank] if h == me)
    counts: dict[str, int] = {}
    local_ranks: list[int] = []
    for host in hostnames:
        local_ranks.append(counts.get(host, 0))
        counts[host] = counts.get(host, 0) + 1
    hosts_with_my_local_rank = [h for h, lr in zip(hostnames, local_ranks) if lr == local_rank]
    return Topology(
        rank=rank,
        size=len(hostnames),
        local_rank=local_rank,
        local_size=counts[me],
        cross_rank=hosts_with_my_local_rank.index(me),
        cross_size=len(hosts_with_my_local_rank),
        homogeneous=len(set(counts.values())) == 1,
    )
