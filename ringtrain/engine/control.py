"""The control vector: what the ranks add up in a negotiation round (``control_allreduce``).

A small int32 vector, laid out alike on every rank: four flags, each rank's wait state (see
:mod:`ringtrain.engine.waits`; a rank fills its own), one count per cached response (a rank
offers each cached operation it has pending). Summed, a flag counts the ranks that raised it, and
a response offered by every member is ready everywhere.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

import torch

from ringtrain.engine.request import Request
from ringtrain.engine.response_cache import ResponseCache
from ringtrain.op_types import OpType

_FLAGS = 4


def offers(pending: Iterable[Request], cache: ResponseCache) -> tuple[set[int], bool, bool]:
    """What a rank offers for ``pending``: the bits of the cached ones, whether one is not
    cached (only a full exchange can decide it), and whether one is a join."""
    bits = set()
    missed = joined = False
    for request in pending:
        if request.meta.op is OpType.JOIN:
            joined = True
            continue
        bit = cache.lookup(request.meta)
        if bit is None:
            missed = True
        else:
            bits.add(bit)
    return bits, missed, joined


@dataclass(frozen=True)
class ControlVector:
    """One rank's control vector, or the sum of every rank's.

    Attributes:
        full_exchange: ranks that want the metas exchanged (a request the cache does not know,
            a stall report due).
        shutdown: ranks that want to shut down.
        joined: ranks that have joined.
        deadlock_check: ranks that want a deadlock check (see :mod:`ringtrain.engine.waits`).
        wait_states: each rank's wait state, by rank.
        offers: per cached response (by bit), how many ranks offer it.
    """

    full_exchange: int
    shutdown: int
    joined: int
    deadlock_check: int
    wait_states: Sequence[int]
    offers: Sequence[int]

    @classmethod
    def of_rank(cls, rank: int, size: int, cached: int, bits: Collection[int], *,
                full_exchange: bool, shutdown: bool, joined: bool, deadlock_check: bool,
                wait_state: int) -> ControlVector:
        """The vector of rank ``rank`` of ``size``, which offers ``bits`` of ``cached``."""
        wait_states = [0] * size
        wait_states[rank] = wait_state
        offers = [0] * cached
        for bit in bits:
            offers[bit] = 1
        return cls(int(full_exchange), int(shutdown), int(joined), int(deadlock_check),
                   wait_states, offers)

    @property
    def decides_by_counts(self) -> bool:
        """Whether the counts alone decide the round: no rank wants the metas exchanged, has
        joined, or wants a deadlock check."""
        return not (self.full_exchange or self.joined or self.deadlock_check)

    def pack(self) -> torch.Tensor:
        """The vector to add up."""
        return torch.tensor([self.full_exchange, self.shutdown, self.joined, self.deadlock_check,
                             *self.wait_states, *self.offers], dtype=torch.int32)

    @classmethod
    def unpack(cls, packed: torch.Tensor, size: int) -> ControlVector:
        """Read a packed vector (a sum) of a world of ``size`` ranks."""
        values = packed.tolist()
        full_exchange, shutdown, joined, deadlock_check = values[:_FLAGS]
        return cls(full_exchange, shutdown, joined, deadlock_check,
                   values[_FLAGS:_FLAGS + size], values[_FLAGS + size:])
