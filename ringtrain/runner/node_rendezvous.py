"""The node rendezvous: how the nodes of a per-node launch meet in the driver's store.

The only module that names these keys. A per-node launch (``ringtrain run --nnodes N
--node-rank K --rdzv-endpoint HOST:PORT``) has one process per node; node 0 serves the store at
the endpoint and drives the job (it plans every rank, as a launch from one host does), every
other node follows: it registers, and starts and stops the ranks the driver asks it to on its
own machine. Under ``ringtrain/nodes/`` of the store:

- ``joined`` counts registrations, ``joined.<i>`` holds the ``i``-th registration (a node's
  rank, name and slots, as JSON);
- ``node.<k>/beat``: a counter node ``k`` adds to while it lives; a counter that stops moving
  means the node is gone (its machine, or its process);
- ``node.<k>/start.<i>``: the driver's ``i``-th request to node ``k``: the rank's number, slot and
  environment; ``node.<k>/starts`` says how many requests there are (set after the request);
- ``rank.<n>/started``, ``rank.<n>/outcome``: what the follower reports of the rank numbered
  ``n`` (that it reported in; how it ended);
- ``rank.<n>/stop``: the driver's request to stop it (``term``, then ``kill``);
- ``done``: the job's exit status, set by the driver once every rank has ended;
- ``node.<k>/bye``: node ``k`` leaves (it read ``done``, or it was stopped and its ranks have
  ended): the driver counts it gone at once, and may close the store once every node left.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ringtrain.contract.elastic_rendezvous import Store
from ringtrain.contract.slots import SlotInfo
from ringtrain.runner.result import RankOutcome, RankState

_BASE = "ringtrain/nodes/"
#: How often a follower adds to its beat (how long a beat may stand still before the driver
#: counts the node as gone is ``--node-timeout``).
BEAT_INTERVAL_S = 0.5
#: How long the driver waits, once the job ended, for its followers to read that it did.
BYE_WAIT_S = 10.0


@dataclass(frozen=True)
class NodeInfo:
    """One registered node: its rank in the launch, the name its ranks' host goes by, slots."""

    rank: int
    name: str
    slots: int


@dataclass(frozen=True)
class StartRequest:
    """The driver's request to start one rank on a follower: its ``number`` (its rank, or an
    elastic launch's worker id), ``slot``, the ``env`` set on top of the follower's own
    environment, and its elastic ``worker`` id, if any."""

    number: int
    slot: SlotInfo
    env: Mapping[str, str]
    worker: int | None = None

    def to_bytes(self) -> bytes:
        return json.dumps({"number": self.number, "slot": dataclasses.asdict(self.slot),
                           "env": dict(self.env), "worker": self.worker}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> StartRequest:
        raw = json.loads(data)
        return cls(raw["number"], SlotInfo(**raw["slot"]), raw["env"], raw["worker"])


def _node(k: int) -> str:
    return f"{_BASE}node.{k}/"


def _rank(n: int) -> str:
    return f"{_BASE}rank.{n}/"


def _get_if(store: Store, key: str) -> bytes | None:
    return store.get(key) if store.check([key]) else None


# -- the follower's side ----------------------------------------------------------------------

def register(store: Store, node: NodeInfo) -> None:
    """Announce ``node`` to the driver."""
    index = store.add(f"{_BASE}joined", 1) - 1
    store.set(f"{_BASE}joined.{index}", json.dumps(dataclasses.asdict(node)).encode())


def beat(store: Store, node_rank: int) -> None:
    """Tell the driver that node ``node_rank`` still lives."""
    store.add(f"{_node(node_rank)}beat", 1)


def start_requests(store: Store, node_rank: int, seen: int) -> list[StartRequest]:
    """The driver's requests to node ``node_rank`` after the first ``seen``."""
    count = store.add(f"{_node(node_rank)}starts", 0)
    return [StartRequest.from_bytes(store.get(f"{_node(node_rank)}start.{i}"))
            for i in range(seen, count)]


def stop_request(store: Store, number: int) -> str | None:
    """``term`` or ``kill`` once the driver asked to stop rank ``number``, else ``None``."""
    value = _get_if(store, f"{_rank(number)}stop")
    return None if value is None else value.decode()


def report_started(store: Store, number: int) -> None:
    """Rank ``number`` reported in."""
    store.set(f"{_rank(number)}started", b"1")


def report_outcome(store: Store, outcome: RankOutcome) -> None:
    """How rank ``outcome.rank`` ended."""
    store.set(f"{_rank(outcome.rank)}outcome", json.dumps({
        "state": outcome.state.value, "exit_code": outcome.exit_code, "signal": outcome.signal,
        "reason": outcome.reason}).encode())


def done(store: Store) -> int | None:
    """The job's exit status once the driver ended it, else ``None``."""
    value = _get_if(store, f"{_BASE}done")
    return None if value is None else int(value)


def say_bye(store: Store, node_rank: int) -> None:
    """Node ``node_rank`` leaves: it read ``done``, or it was stopped, and starts no more
    ranks."""
    store.set(f"{_node(node_rank)}bye", b"1")


# -- the driver's side -------------------------------------------------------------------------

@dataclass(frozen=True)
class RelayedOutcome:
    """How a rank on another node ended: what its follower reported, or why its node is gone."""

    state: RankState
    exit_code: int | None
    signal: int | None
    reason: str | None


class NodeRelay(Protocol):
    """The driver's line to the followers that start the ranks planned on other nodes.

    :class:`NodeRegistry` is it for a per-node launch; the ssh launch's
    :class:`~ringtrain.runner.ssh_nodes.SshNodes` adds the ssh connections it starts them over.
    Used from the agent's monitor thread only.
    """

    #: Whether the ranks' output comes to the driver (which then writes their files), rather
    #: than being printed and written on their own nodes.
    output_here: bool

    def refresh(self) -> None:
        """Read what the followers reported since the last call."""
        ...

    def request_start(self, node_rank: int, request: StartRequest) -> None:
        """Ask node ``node_rank`` to start a rank."""
        ...

    def request_stop(self, number: int, kill: bool) -> None:
        """Ask the follower of rank ``number`` to stop it (``kill``: at once)."""
        ...

    def started(self, number: int) -> bool:
        """Whether rank ``number`` reported in on its follower."""
        ...

    def outcome(self, number: int) -> RelayedOutcome | None:
        """How rank ``number`` ended, once that is known (``None`` while it runs)."""
        ...


class NodeRegistry:
    """The driver's view of the nodes: who registered, who still beats; a :class:`NodeRelay`.

    A rank placed on a registered node whose beat stopped ends as failed (as not started, if it
    had not reported in); a node that has not registered yet is not judged here (a per-node
    launch places ranks on registered nodes only; the ssh launch watches its connections).

    Args:
        store: a client of the store (used from one thread only).
        own: the driver's own node (always alive).
        timeout_s: how long a node's beat may stand still before it counts as gone
            (``--node-timeout``).
        clock: monotonic seconds.
    """

    output_here = False  # every node prints and writes its own ranks' output

    def __init__(self, store: Store, own: NodeInfo, timeout_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self._store = store
        self._own = own
        self._timeout_s = timeout_s
        self._clock = clock
        self._nodes: dict[int, NodeInfo] = {}
        self._read = 0
        self._beats: dict[int, tuple[int, float]] = {}  # node -> (last beat value, seen at)
        self._starts: dict[int, int] = {}  # node -> requests sent
        self._placed: dict[int, int] = {}  # rank number -> the node asked to start it
        self._left: set[int] = set()  # nodes that said goodbye

    def refresh(self) -> None:
        """Read new registrations and beats."""
        joined = self._store.add(f"{_BASE}joined", 0)
        for i in range(self._read, joined):
            key = f"{_BASE}joined.{i}"
            if not self._store.check([key]):
                break  # registered but not written yet: read at the next refresh
            node = NodeInfo(**json.loads(self._store.get(key)))
            self._nodes[node.rank] = node
            self._read = i + 1
        now = self._clock()
        for k in self._nodes:
            if k == self._own.rank or k in self._left:
                continue
            if self._store.check([f"{_node(k)}bye"]):
                self._left.add(k)
                continue
            value = self._store.add(f"{_node(k)}beat", 0)
            last = self._beats.get(k)
            if last is None or last[0] != value:
                self._beats[k] = (value, now)

    def nodes(self) -> dict[int, NodeInfo]:
        """Every node that registered, by rank (the driver's own included)."""
        return {self._own.rank: self._own, **self._nodes}

    def joined(self, node_rank: int) -> bool:
        """Whether the node registered (as of the last refresh)."""
        return node_rank == self._own.rank or node_rank in self._nodes

    def alive(self, node_rank: int) -> bool:
        """Whether the node's beat moved within the timeout (as of the last refresh), and it
        did not say goodbye."""
        if node_rank == self._own.rank:
            return True
        last = self._beats.get(node_rank)
        return (last is not None and self._clock() - last[1] <= self._timeout_s
                and node_rank not in self._left)

    def rank_of(self, name: str) -> int:
        """The live node named ``name`` (the latest to register, when one left and came back).

        Raises:
            KeyError: no live node has that name.
        """
        found = [k for k, n in self.nodes().items() if n.name == name and self.alive(k)]
        if not found:
            raise KeyError(name)
        return max(found)

    def live_hosts(self) -> dict[str, int]:
        """The live nodes' names and slots, by node rank: an elastic launch's discovery."""
        self.refresh()
        return {n.name: n.slots for k, n in sorted(self.nodes().items()) if self.alive(k)}

    def request_start(self, node_rank: int, request: StartRequest) -> None:
        """Ask node ``node_rank`` to start a rank."""
        i = self._starts.get(node_rank, 0)
        self._placed[request.number] = node_rank
        self._store.set(f"{_node(node_rank)}start.{i}", request.to_bytes())
        self._starts[node_rank] = i + 1
        self._store.add(f"{_node(node_rank)}starts", 1)

    def request_stop(self, number: int, kill: bool) -> None:
        """Ask the follower of rank ``number`` to stop it (``kill``: at once)."""
        self._store.set(f"{_rank(number)}stop", b"kill" if kill else b"term")

    def started(self, number: int) -> bool:
        """Whether rank ``number`` reported in on its follower."""
        return self._store.check([f"{_rank(number)}started"])

    def outcome(self, number: int) -> RelayedOutcome | None:
        """How rank ``number`` ended: as its follower said, or failed when its node, registered,
        stopped beating (or left) without saying."""
        value = _get_if(self._store, f"{_rank(number)}outcome")
        if value is not None:
            raw: dict[str, Any] = json.loads(value)
            return RelayedOutcome(RankState(raw["state"]), raw["exit_code"], raw["signal"],
                                  raw["reason"])
        node = self._placed.get(number)
        if node is None or node not in self._nodes or self.alive(node):
            return None
        state = RankState.FAILED if self.started(number) else RankState.START_FAILED
        return RelayedOutcome(state, None, None,
                              f"node {node} ({self._nodes[node].name}) stopped answering: its "
                              "machine or its `ringtrain run` is gone")

    def finish(self, exit_code: int, wait_s: float) -> None:
        """Tell the followers the job ended, and wait (at most ``wait_s``) for the live ones to
        read it, so that none takes the store's closing for a lost driver."""
        self._store.set(f"{_BASE}done", str(exit_code).encode())
        deadline = self._clock() + wait_s
        waiting = [k for k in self._nodes if k != self._own.rank]
        while waiting and self._clock() < deadline:
            self.refresh()
            waiting = [k for k in waiting if self.alive(k)]
            time.sleep(0.05)
