"""Readiness counting: knowing, without a collective, that an operation is submitted everywhere.

Every member adds one to a unit's counter in the store when it submits the unit (a gradient
bucket, under a key derived from all of its requests' keys, or a lone request: see
:meth:`ResponseCache.counter_key`). A member cannot submit a unit again before its previous
submission completed everywhere, so the ``e``-th submission on every member takes the counter
from ``(e-1)·m`` to ``e·m``: the member whose addition reaches ``e·m`` rings the unit's tag
``key@e``, and every rank runs exactly its ``e``-th submission of that unit. A unit some member
did not count runs in a negotiation round instead, which replaces the counter (docs/engine.md,
"Units, readiness counters and unit rounds").
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

from ringtrain.engine.doorbell import NEGOTIATE
from ringtrain.engine.request import Request
from ringtrain.engine.response_cache import ResponseCache
from ringtrain.op_types import OpType


def tag(key: str, epoch: int) -> str:
    """The bell of a unit's ``epoch``-th submission."""
    return f"{key}@{epoch}"


class Readiness:
    """Counts this rank's submissions; says when one completes a unit on every member."""

    def __init__(self, cache: ResponseCache, add: Callable[[str], int],
                 read: Callable[[str], int]):
        self._cache = cache
        self._add = add
        self._read = read

    def count(self, requests: list[Request]) -> bytes | None:
        """Count ``requests``, submitted together, as one unit.

        Returns:
            The bell to ring: the unit's tag when this rank completed it on every member;
            :data:`~ringtrain.engine.doorbell.NEGOTIATE` when the unit cannot be counted (a
            request the cache does not know, a join, members that differ) and only a negotiation
            round can decide it. None when peers are still to submit it.
        """
        return self.count_unit(requests, self.unit(requests))

    def count_unit(self, requests: list[Request], unit: tuple[str, int] | None) -> bytes | None:
        """:meth:`count`, with ``unit`` (what :meth:`unit` says of ``requests``) found already:
        the engine finds it before it takes the doorbell's lock, which the addition holds and
        the peers wait for."""
        if unit is None:
            for request in requests:
                request.counted = None
            return NEGOTIATE
        key, members = unit
        value = self._add(key)
        counted = tag(key, -(-value // members))  # the submission this addition belongs to
        for request in requests:
            request.counted = counted
        return counted.encode() if value % members == 0 else None

    def completed(self, request: Request) -> bool:
        """Whether the submission ``request`` was counted under is complete on every member
        (its bell rung by the member that completed it); False for one not counted."""
        if request.counted is None:
            return False
        key, epoch = request.counted.rsplit("@", 1)
        return self._read(key) >= int(epoch) * len(request.meta.set_ranks)

    def recount(self, requests: Iterable[Request]) -> list[bytes]:
        """Count again the units whose counters a negotiation replaced.

        Returns:
            What to ring (as for :meth:`count`), for each unit that asks for a round.
        """
        units: dict[str, list[Request]] = {}
        for request in requests:
            if request.counted is not None:
                units.setdefault(request.counted, []).append(request)
        rings = []
        for counted, group in units.items():
            unit = self.unit(group)
            if unit is None or not counted.startswith(unit[0] + "@"):
                ring = self.count(group)
                if ring is not None:
                    rings.append(ring)
        return rings

    def unit(self, requests: list[Request]) -> tuple[str, int] | None:
        """The counter key and member count of ``requests`` as one unit, or None."""
        keys, members = [], None
        for request in requests:
            bit = None if request.meta.op is OpType.JOIN else self._cache.lookup(request.meta)
            if bit is None or members not in (None, request.meta.set_ranks):
                return None
            members = request.meta.set_ranks
            keys.append(self._cache.counter_key(bit))
        if not keys:
            return None
        assert members is not None  # set with the first key
        if len(keys) == 1:
            return keys[0], len(members)
        digest = hashlib.blake2b("|".join(sorted(keys)).encode(), digest_size=12).hexdigest()
        return f"u{digest}", len(members)
