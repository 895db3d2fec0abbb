"""Process sets: collectives over a subset of the ranks."""

from __future__ import annotations

from collections.abc import Iterable

from ringtrain.torch import runtime


class ProcessSet:
    """A subset of the ranks that collectives can be restricted to.

    Create one with the member ranks and register it on every rank with
    :func:`add_process_set` (or pass it to ``init(process_sets=[...])``) before using it.
    """

    def __init__(self, ranks: Iterable[int] | None = None):
        self.ranks: list[int] | None = None if ranks is None else sorted(set(int(r) for r in ranks))
        self.process_set_id: int | None = None

    def _members(self) -> tuple[int, ...]:
        rt = runtime.current()
        if self.process_set_id is None:
            raise ValueError(f"{self!r} is not registered: call hvd.add_process_set() with it on "
                             "every rank (or pass it to hvd.init(process_sets=[...])) first")
        if self.process_set_id == 0:
            return tuple(range(rt.topology.size))
        ranks = rt.process_sets.get(self.process_set_id)
        if ranks is None:
            raise ValueError(f"{self!r} was removed with hvd.remove_process_set()")
        return ranks

    def _id(self) -> int:
        """The registered id; raises ValueError, as :meth:`_members` does, for a set that is not
        registered or was removed."""
        self._members()
        assert self.process_set_id is not None  # _members() raised otherwise
        return self.process_set_id

    def size(self) -> int:
        """Number of member ranks."""
        return len(self._members())

    def rank(self) -> int:
        """This process's rank within the set, or -1 if it is not a member."""
        members = self._members()
        me = runtime.current().topology.rank
        return members.index(me) if me in members else -1

    def included(self) -> bool:
        """Whether this process is a member."""
        return self.rank() >= 0

    def __repr__(self) -> str:
        ranks = "all ranks" if self.process_set_id == 0 else self.ranks
        return f"ProcessSet(id={self.process_set_id}, ranks={ranks})"


#: The set of all ranks; registered by ``init()``.
global_process_set = ProcessSet()
global_process_set.process_set_id = 0
