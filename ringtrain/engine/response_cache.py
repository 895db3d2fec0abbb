"""The response cache: lets steady-state negotiation exchange one small count vector.

After an operation has been negotiated once, every rank stores its response under a bit index
assigned in the same order on every rank. When a rank submits a request whose meta equals what it
submitted last time under that name, it only reports the bit; a bit whose count reaches the size of
the process set is ready everywhere and its cached response is executed without exchanging metas.
Any rank with a request that misses the cache makes the round a full exchange.
"""

from __future__ import annotations

from dataclasses import replace

from ringtrain.engine.negotiation import Response
from ringtrain.engine.request import OpType, RequestMeta

_CACHEABLE = frozenset({OpType.ALLREDUCE, OpType.ALLGATHER, OpType.BROADCAST,
                        OpType.REDUCESCATTER, OpType.ALLTOALL})


def _signature(meta: RequestMeta) -> RequestMeta:
    return replace(meta, age_s=0.0)


class ResponseCache:
    """Responses by name with bit indices; mutated identically on every rank."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._bits: dict[str, int] = {}
        self._responses: list[Response] = []

    def __len__(self) -> int:
        return len(self._responses)

    def lookup(self, meta: RequestMeta) -> int | None:
        """The bit of a request identical to one negotiated before, or None."""
        bit = self._bits.get(meta.name)
        if bit is None:
            return None
        cached = self._responses[bit].metas.get(meta.rank)
        if cached is None or _signature(cached) != _signature(meta):
            return None
        return bit

    def response(self, bit: int) -> Response:
        return self._responses[bit]

    def members(self, bit: int) -> int:
        return len(self._responses[bit].set_ranks)

    def put(self, response: Response) -> None:
        """Remember a successful, join-free response (replacing an older one of that name)."""
        if response.error or response.joined or response.op not in _CACHEABLE:
            return
        stored = replace(response, metas={r: _signature(m) for r, m in response.metas.items()})
        bit = self._bits.get(response.name)
        if bit is not None:
            self._responses[bit] = stored
        elif len(self._responses) < self.capacity:
            self._bits[response.name] = len(self._responses)
            self._responses.append(stored)
