"""A rank's place in a launch: what the launcher assigns to each rank (``runner/hosts.py``) and
the elastic rendezvous hands a worker in each world."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SlotInfo:
    """One rank's place in the job (Horovod's ``SlotInfo``)."""

    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int
