"""Which peer died: the error of a failed collective names the rank whose process is gone.

The backend only reports a broken connection, naming no rank. Every rank records each peer's
process at ``init()``; after a collective fails, the peers on this machine whose process is gone
(or a zombie) are the dead ones. Peers on other machines cannot be looked at from here: the
launcher names the rank that failed first (docs/engine.md, "Stalls, deadlocks, failures").
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ringtrain.errors import HorovodInternalError
from ringtrain.proc_stat import is_alive, start_ticks

_PROC = Path("/proc")
#: How long a survivor waits for a dying peer's process to end: its sockets may close a moment
#: before the process does (an exception unwinding, atexit handlers).
SETTLE_S = 1.0
_POLL_S = 0.05


@dataclass(frozen=True)
class PeerProcess:
    """One rank's process, as its peers can find it again.

    Attributes:
        host: the rank's hostname (as the launcher named it).
        pid: its process id.
        machine: the boot id of its kernel and its pid namespace: a pid names the same process
            only within one namespace of one running kernel. Host names cannot tell that (the
            nodes of a local job cluster are several names of one machine; containers may share
            a name).
        start_ticks: when it started, in clock ticks since boot, telling it from a reused pid.
    """

    host: str
    pid: int
    machine: str
    start_ticks: int

    @classmethod
    def this(cls, host: str) -> PeerProcess:
        """This process, on ``host``."""
        try:
            boot = (_PROC / "sys/kernel/random/boot_id").read_text().strip()
            machine = f"{boot}/{os.readlink('/proc/self/ns/pid')}"
        except OSError:  # no /proc: nothing can be checked, and nothing claimed
            machine = ""
        ticks = start_ticks(os.getpid())
        return cls(host, os.getpid(), machine, -1 if ticks is None else ticks)

    def describe(self, rank: int) -> str:
        """``rank 1 (host node1, pid 4242)``."""
        return f"rank {rank} (host {self.host}, pid {self.pid})"


def _gone(peer: PeerProcess) -> bool:
    return not is_alive(peer.pid, peer.start_ticks)


class Peers:
    """Every rank's process, by rank (empty: nothing is known, nothing is named), as seen
    from ``rank``."""

    def __init__(self, rank: int, processes: Sequence[PeerProcess]):
        self._rank = rank
        self._processes = tuple(processes)

    def _here(self) -> list[int]:
        """The peers on this machine (same kernel boot and pid namespace)."""
        if not self._processes or not self._processes[self._rank].machine:
            return []
        me = self._processes[self._rank].machine
        return [r for r, p in enumerate(self._processes)
                if r != self._rank and p.machine == me]

    def dead(self) -> list[int]:
        """The peers on this machine whose process is gone."""
        return [r for r in self._here() if _gone(self._processes[r])]

    def wait_for_dead(self, settle_s: float = SETTLE_S,
                      clock: Callable[[], float] = time.monotonic) -> list[int]:
        """The dead peers, waiting up to ``settle_s`` for one to show (not at all when no peer
        is on this machine)."""
        if not self._here():
            return []
        deadline = clock() + settle_s
        while not (dead := self.dead()) and clock() < deadline:
            time.sleep(_POLL_S)
        return dead

    def failure_cause(self, dead: Sequence[int]) -> str:
        """What killed the collective: ``rank 1 (host h, pid p) died (its process is gone: it
        exited or was killed)``."""
        names = ", ".join(self._processes[r].describe(r) for r in dead)
        if len(dead) == 1:
            return f"{names} died (its process is gone: it exited or was killed)"
        return f"{names} died (their processes are gone: they exited or were killed)"

    def collective_failure(self, exc: BaseException) -> HorovodInternalError:
        """The error that a collective failed with ``exc`` stops the engine with: naming the
        rank that died, if one shows."""
        dead = self.wait_for_dead()
        cause = (f"because {self.failure_cause(dead)}" if dead else
                 "most likely because another rank failed or exited")
        return HorovodInternalError(f"a collective failed on rank {self._rank}, {cause}: {exc}")
