"""Heartbeats: which ranks' processes still run, for a round that waits on a rank that stopped.

A stopped member (SIGSTOP, a debugger, a frozen host) closes no connection, so a collective would
wait for the backend's timeout (hours). While a rank's engine has work its pending watch adds one
to the rank's counter in the store about once a second; a rank stuck in a round past the stall
shutdown time names the peers whose counter has not moved for that long (docs/engine.md).
"""

from __future__ import annotations

from collections.abc import Callable

from ringtrain.engine.doorbell import Doorbell


def _key(rank: int) -> str:
    return f"alive.{rank}"


class Liveness:
    """This rank's heartbeat (a counter of ``doorbell``), and what it has seen of its peers'."""

    def __init__(self, rank: int, size: int, doorbell: Doorbell, clock: Callable[[], float]):
        self._rank = rank
        self._size = size
        self._doorbell = doorbell
        self._clock = clock
        self._seen: dict[int, tuple[int, float]] = {}  # rank -> (counter, when it last moved)

    def beat(self) -> None:
        """Show that this rank's process runs."""
        self._doorbell.count(_key(self._rank))

    def silent(self, period_s: float) -> list[int]:
        """Peers whose heartbeat has not moved for ``period_s``, as far as this and earlier calls
        saw (the first call only starts watching)."""
        now = self._clock()
        silent = []
        for rank in range(self._size):
            if rank == self._rank:
                continue
            value = self._doorbell.read(_key(rank))
            seen = self._seen.get(rank)
            if seen is None or seen[0] != value:
                self._seen[rank] = (value, now)
            elif now - seen[1] >= period_s:
                silent.append(rank)
        return silent

    def forget(self) -> None:
        """A round ended: the next stuck round starts watching afresh."""
        self._seen.clear()
