"""The runtime of this process: what ``init()`` set up, and the queries on it.

``lifecycle`` creates and replaces the :class:`Runtime`; everything else reads it through
:func:`current`. Keeping the state apart from ``init()`` lets ``ProcessSet`` (which
``init(process_sets=...)`` registers) read it without importing ``init()``'s module back.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ringtrain.backends.base import CollectiveBackend
from ringtrain.contract.env import WorkerEnv
from ringtrain.engine.engine import Engine
from ringtrain.engine.request import RequestMeta
from ringtrain.torch.topology import Topology

#: Request metas a runtime keeps for reuse (see ``submit._describe``), at most: an unnamed
#: operation gets a new name every time, and its metas must not pile up.
METAS_KEPT = 4096


@dataclass
class Runtime:
    """Everything ``init()`` set up; replaced by the next ``init()`` after ``shutdown()``."""

    env: WorkerEnv
    topology: Topology
    backend: CollectiveBackend
    engine: Engine
    owns_default_group: bool
    world_generation: int | None = None  # the elastic world this process is in
    process_sets: dict[int, tuple[int, ...]] = field(default_factory=dict)
    next_set_id: int = 1
    name_counters: dict[int, itertools.count] = field(default_factory=dict)
    joins: int = 0  # joins completed: unnamed operations are counted afresh after each
    #: request metas by their arguments, with the inputs' shapes, dtypes and devices
    metas: dict[tuple, tuple[list, RequestMeta]] = field(default_factory=dict)

    def auto_name(self, kind: str, process_set_id: int) -> str:
        """A name for an unnamed operation. Counted per process set: only members submit on a
        set, so a per-set count advances identically on every member, except across a join:
        the ranks that joined early skipped the operations the others ran meanwhile, so the
        count starts again once everyone has joined (and the names carry the join's number,
        never to meet a name still in flight from before it)."""
        counter = self.name_counters.setdefault(process_set_id, itertools.count())
        after_join = f"join{self.joins}." if self.joins else ""
        return f"{kind}.noname.{process_set_id}.{after_join}{next(counter)}"

    def joined(self) -> None:
        """Every rank has joined: start counting unnamed operations afresh (see auto_name)."""
        self.joins += 1
        self.name_counters.clear()


_runtime: Runtime | None = None


def current() -> Runtime:
    """The active runtime.

    Raises:
        ValueError: ``init()`` has not been called (or ``shutdown()`` was).
    """
    rt = _runtime
    if rt is None:
        raise ValueError("ringtrain has not been initialized; call hvd.init() first")
    return rt


def activate(rt: Runtime | None) -> Runtime | None:
    """Make ``rt`` the active runtime (``None``: none) and return the one it replaces.

    Only ``lifecycle.init`` and ``lifecycle.shutdown`` call this, under their lock.
    """
    global _runtime
    replaced, _runtime = _runtime, rt
    return replaced


def is_initialized() -> bool:
    """Whether ``init()`` has been called and ``shutdown()`` has not."""
    return _runtime is not None


def size() -> int:
    """Number of ranks in the job."""
    return current().topology.size


def rank() -> int:
    """This process's rank, in ``[0, size())``."""
    return current().topology.rank


def local_size() -> int:
    """Number of ranks on this host."""
    return current().topology.local_size


def local_rank() -> int:
    """This process's index among the ranks on its host (pin a GPU with it)."""
    return current().topology.local_rank


def cross_size() -> int:
    """Number of hosts that have a rank with this process's local rank."""
    return current().topology.cross_size


def cross_rank() -> int:
    """This host's index among the hosts that have a rank with this process's local rank."""
    return current().topology.cross_rank


def is_homogeneous() -> bool:
    """Whether every host runs the same number of ranks."""
    return current().topology.homogeneous


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Record a Chrome-trace timeline of every operation to ``file_path`` (written by rank 0)."""
    rt = current()
    if rt.topology.rank == 0:
        rt.engine.timeline.start(file_path, mark_cycles)


def stop_timeline() -> None:
    """Finish and close the timeline file."""
    current().engine.timeline.stop()


def is_elastic() -> bool:
    """Whether this process runs under an elastic ``ringtrain run`` (``init()`` first)."""
    return current().world_generation is not None
