"""The response cache: lets steady-state negotiation exchange one small count vector.

After an operation has been negotiated once, every rank stores its response under a bit index
assigned in the same order on every rank. A rank whose request's meta equals the cached one only
reports the bit; a bit whose count reaches the size of the process set is ready everywhere. Any
rank with a request that misses the cache makes the round a full exchange.

Each bit also names a readiness counter (see :meth:`counter_key`), replaced whenever a
negotiation round runs its name: submissions may then have been counted unevenly, and a fresh
counter starts every rank even (docs/engine.md).
"""

from __future__ import annotations

from ringtrain.engine.negotiation import Response
from ringtrain.engine.request import OpKey, RequestMeta
from ringtrain.op_types import OpType

_CACHEABLE = frozenset({OpType.ALLREDUCE, OpType.ALLGATHER, OpType.BROADCAST,
                        OpType.REDUCESCATTER, OpType.ALLTOALL})


class ResponseCache:
    """Responses by key (name and process set) with bit indices; mutated identically on
    every rank."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._bits: dict[OpKey, int] = {}
        self._responses: list[Response] = []
        self._generations: list[int] = []
        #: per bit, the last meta found equal to this rank's cached one: the frontend submits
        #: the same meta object again and again (see ``submit._describe``), which then needs no
        #: comparison field by field
        self._matched: list[RequestMeta | None] = []

    def __len__(self) -> int:
        return len(self._responses)

    def lookup(self, meta: RequestMeta) -> int | None:
        """The bit of a request identical to one negotiated before, or None."""
        bit = self._bits.get(meta.key)
        if bit is None:
            return None
        if self._matched[bit] is meta:
            return bit
        cached = self._responses[bit].metas.get(meta.rank)
        if cached is None or cached != meta:
            return None
        self._matched[bit] = meta
        return bit

    def response(self, bit: int) -> Response:
        return self._responses[bit]

    def members(self, bit: int) -> int:
        return len(self._responses[bit].set_ranks)

    def counter_key(self, bit: int) -> str:
        """The store counter that members of ``bit``'s operation increment on submission."""
        return f"{bit}.{self._generations[bit]}"

    def put(self, response: Response) -> None:
        """Record a response decided by a negotiation round.

        A successful, join-free response is remembered (replacing an older one of that key);
        either way a cached key gets a fresh counter.
        """
        bit = self._bits.get(response.key)
        if bit is not None:
            self._generations[bit] += 1
        if response.error or response.joined or response.op not in _CACHEABLE:
            return
        if bit is not None:
            # A round decided by counts records the cached response itself: the meta matched
            # before still matches (comparing one field by field costs microseconds, per
            # tensor, per round).
            if self._responses[bit] is not response:
                self._responses[bit] = response
                self._matched[bit] = None
        elif len(self._responses) < self.capacity:
            self._bits[response.key] = len(self._responses)
            self._responses.append(response)
            self._generations.append(0)
            self._matched.append(None)
