"""The elastic rendezvous: how the launcher's driver and the workers agree on each world.

The only module that names the elastic keys of the launcher's store. Every world of a launch has
a generation ``g`` (1, 2, ...), under ``ringtrain/<run_id>/elastic/world.<g>/``:

- ``slot.<worker>``: the driver's assignment of worker ``worker`` in world ``g`` (its rank,
  sizes, local and cross ranks); a live worker left out of ``g`` gets none, and is stopped;
- ``joined``: a counter; world ``g`` is formed once every member has added one;
- ``ready.<worker>``: worker ``worker`` left world ``g`` (a peer failed, or hosts changed) and
  waits for the next one;
- ``next``: the generation that replaces ``g``, set by the driver once it is published;
- ``hosts``: the driver's notice that the hosts changed (``added``, ``removed`` or ``mixed``),
  which ranks check at ``commit()`` (Horovod's ``HostsUpdatedInterrupt``).

The driver publishes world ``g+1`` (every member's slot) before it sets ``world.<g>.next``, and
starts new workers only after publishing, so a worker always finds its slot. A worker joins by
adding to ``joined`` and waiting until all members have, or until ``next`` says the world was
replaced before it formed (a member died on the way); it then joins the next one.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Protocol

from ringtrain.contract.slots import SlotInfo

_POLL_S = 0.02
#: How often a wait for a key looks (see _wait_key).
_KEY_POLL_S = 0.1


class Store(Protocol):
    """The part of ``torch.distributed.Store`` used here."""

    def set(self, key: str, value: bytes | str) -> None: ...
    def get(self, key: str) -> bytes: ...
    def add(self, key: str, amount: int) -> int: ...
    def check(self, keys: list[str]) -> bool: ...


class HostUpdate(Enum):
    """What the driver's host discovery found, as Horovod's ``HostUpdateResult``."""

    ADDED = "added"
    REMOVED = "removed"
    MIXED = "mixed"

    def merge(self, other: HostUpdate | None) -> HostUpdate:
        """This update followed or preceded by ``other``."""
        return self if other in (None, self) else HostUpdate.MIXED


class RendezvousTimeout(RuntimeError):
    """The next world was not formed within the elastic timeout."""


class Keys:
    """The store keys of one launch's elastic worlds."""

    def __init__(self, run_id: str):
        self._base = f"ringtrain/{run_id}/elastic/"

    def slot(self, generation: int, worker: int) -> str:
        return f"{self._base}world.{generation}/slot.{worker}"

    def joined(self, generation: int) -> str:
        return f"{self._base}world.{generation}/joined"

    def ready(self, generation: int, worker: int) -> str:
        return f"{self._base}world.{generation}/ready.{worker}"

    def next(self, generation: int) -> str:
        return f"{self._base}world.{generation}/next"

    def hosts(self, generation: int) -> str:
        return f"{self._base}world.{generation}/hosts"


# -- the driver's side --------------------------------------------------------------------------

def publish_world(store: Store, keys: Keys, generation: int,
                  slots: Mapping[int, SlotInfo]) -> None:
    """Write every member's slot of world ``generation``."""
    for worker, slot in slots.items():
        store.set(keys.slot(generation, worker), json.dumps(dataclasses.asdict(slot)).encode())


def replace_world(store: Store, keys: Keys, old: int, new: int) -> None:
    """Send the members of world ``old`` (waiting to join it, or ready to leave it) to ``new``,
    which must be published already."""
    store.set(keys.next(old), str(new))


def world_formed(store: Store, keys: Keys, generation: int, size: int) -> bool:
    """Whether every member of world ``generation`` has joined it."""
    return store.add(keys.joined(generation), 0) >= size


def ready_workers(store: Store, keys: Keys, generation: int, workers: tuple[int, ...]) -> set[int]:
    """The workers among ``workers`` that left world ``generation`` for the next one."""
    return {w for w in workers if store.check([keys.ready(generation, w)])}


def notify_hosts(store: Store, keys: Keys, generation: int, update: HostUpdate) -> None:
    """Tell the ranks of world ``generation`` that the hosts changed (see ``host_update``)."""
    store.set(keys.hosts(generation), update.value)


# -- the worker's side --------------------------------------------------------------------------

def join_world(store: Store, keys: Keys, worker: int, generation: int, leaving: bool,
               timeout_s: float, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> tuple[SlotInfo, int]:
    """Join world ``generation`` (``leaving=False``: the world this worker was started for), or
    leave it for the next one (``leaving=True``), and wait until the world is formed.

    Returns:
        This worker's slot and the generation of the world it joined.

    Raises:
        RendezvousTimeout: no world formed within ``timeout_s``, or it has no place for this
            worker (which the launcher then stops first, normally).
    """
    deadline = clock() + timeout_s
    if leaving:
        store.set(keys.ready(generation, worker), b"1")
        generation = _wait_next(store, keys, generation, deadline, clock, sleep)
    while True:
        slot = _read_slot(store, keys, generation, worker, deadline, clock, sleep)
        store.add(keys.joined(generation), 1)
        while not world_formed(store, keys, generation, slot.size):
            if store.check([keys.next(generation)]):
                break
            if clock() > deadline:
                raise RendezvousTimeout(
                    f"world {generation} did not form within {timeout_s:g} s "
                    "(--elastic-timeout): some of its workers never joined")
            sleep(_POLL_S)
        else:
            return slot, generation
        generation = int(store.get(keys.next(generation)))


def host_update(store: Store, keys: Keys, generation: int) -> HostUpdate | None:
    """The driver's notice for world ``generation`` that hosts changed, if any."""
    if not store.check([keys.hosts(generation)]):
        return None
    return HostUpdate(store.get(keys.hosts(generation)).decode())


def _wait_key(store: Store, key: str, deadline: float, clock: Callable[[], float],
              sleep: Callable[[float], None]) -> None:
    """Wait until ``key`` exists, looking every :data:`_KEY_POLL_S`. Not a store wait in slices:
    that blocks in C++, where Python signal handlers (Ctrl-C, a job's SIGTERM) cannot run, and
    each slice that times out makes c10d print a warning ("waitForInput ... timed out").

    Raises:
        TimeoutError: the deadline passed.
        Exception: the store's, at once, if the store cannot be reached.
    """
    while not store.check([key]):
        if clock() >= deadline:
            raise TimeoutError(f"no key {key!r} in the store by the deadline")
        sleep(_KEY_POLL_S)


def _wait_next(store: Store, keys: Keys, generation: int, deadline: float,
               clock: Callable[[], float], sleep: Callable[[float], None]) -> int:
    try:
        _wait_key(store, keys.next(generation), deadline, clock, sleep)
    except Exception as exc:  # the store reports a timeout as a generic error
        raise RendezvousTimeout(
            f"the launcher did not form a new world within the elastic timeout after world "
            f"{generation} ended ({exc})") from exc
    return int(store.get(keys.next(generation)))


def _read_slot(store: Store, keys: Keys, generation: int, worker: int, deadline: float,
               clock: Callable[[], float], sleep: Callable[[float], None]) -> SlotInfo:
    key = keys.slot(generation, worker)
    try:
        _wait_key(store, key, deadline, clock, sleep)
    except Exception as exc:
        raise RendezvousTimeout(f"no place in world {generation} for worker {worker} within "
                                f"the elastic timeout ({exc})") from exc
    return SlotInfo(**json.loads(store.get(key)))
