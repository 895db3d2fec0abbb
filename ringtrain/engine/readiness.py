"""Readiness counting: knowing, without a collective, that an operation is submitted everywhere.

Every member of a cached operation adds one to a counter in the rendezvous store when it submits
the operation (see :meth:`ResponseCache.counter_key`); the member whose addition makes the counter
a multiple of the member count is the last to submit, and rings for a round that will find the
operation ready on every rank. Requests submitted together (a gradient bucket) count as one unit
under a key derived from all of theirs, so a bucket costs one store round trip rather than one
per tensor; peers that submit the same bucket derive the same key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

from ringtrain.engine.request import OpType, Request
from ringtrain.engine.response_cache import ResponseCache


class Readiness:
    """Counts this rank's submissions; says when one completes a unit on every member."""

    def __init__(self, cache: ResponseCache, add: Callable[[str], int]):
        self._cache = cache
        self._add = add

    def count(self, requests: list[Request]) -> bool:
        """Count ``requests``, submitted together, as one unit.

        Returns:
            True when a round should start now: this rank completed the unit's counter, or the
            unit cannot be counted (a request the cache does not know, a join, members that
            differ) and only a full exchange can decide it.
        """
        unit = self._unit(requests)
        for request in requests:
            request.counted = None if unit is None else unit[0]
        if unit is None:
            return True
        key, members = unit
        return self._add(key) % members == 0

    def recount(self, requests: Iterable[Request]) -> bool:
        """Count again the units whose counters a full exchange replaced.

        Returns:
            True when a round should start now (as for :meth:`count`).
        """
        units: dict[str, list[Request]] = {}
        for request in requests:
            if request.counted is not None:
                units.setdefault(request.counted, []).append(request)
        ready = False
        for old_key, group in units.items():
            unit = self._unit(group)
            if unit is None or unit[0] != old_key:
                ready |= self.count(group)
        return ready

    def _unit(self, requests: list[Request]) -> tuple[str, int] | None:
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
        if len(keys) == 1:
            return keys[0], len(members)
        digest = hashlib.blake2b("|".join(sorted(keys)).encode(), digest_size=12).hexdigest()
        return f"u{digest}", len(members)
