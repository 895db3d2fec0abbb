"""The Ray executor's records of an attempt: the launch handle stored with the job
(:class:`RayHandle`), and the one it keeps while it watches the attempt, with an explicit stage
(:class:`AttemptStage`, whose moves :meth:`RayAttempt.move` enforces), dropped when the attempt
is released.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

from ringtrain.jobs.errors import RecordError
from ringtrain.jobs.service.executors.base import Observation
from ringtrain.jobs.service.executors.phase import Phase
from ringtrain.jobs.service.executors.ray import transfer


class AttemptStage(enum.Enum):
    """Where a placed attempt is, as the Ray executor drives it."""

    # Ray placed its bundles; whether its nodes were started is not known yet (a new attempt,
    # or one a restarted service found again: the agents' answers tell).
    PLACED = "placed"
    STARTING = "starting"  # the start calls to the nodes' agents are in flight
    RUNNING = "running"  # every node was started; the executor polls their status
    # A node failed or was lost; the others are being stopped and send what they hold of their
    # logs and outputs, within a bound.
    DRAINING = "draining"


_MOVES: dict[AttemptStage, frozenset[AttemptStage]] = {
    AttemptStage.PLACED: frozenset({AttemptStage.STARTING, AttemptStage.RUNNING,
                                    AttemptStage.DRAINING}),
    AttemptStage.STARTING: frozenset({AttemptStage.RUNNING, AttemptStage.DRAINING}),
    AttemptStage.RUNNING: frozenset({AttemptStage.DRAINING}),
    AttemptStage.DRAINING: frozenset(),
}


@dataclass(frozen=True)
class Failure:
    """How an attempt ends (a node failed, or was lost), kept while its other nodes stop and
    send their outputs.

    Attributes:
        phase: what the attempt ends as: exited (with the failed node's ``exit_code``), or lost.
        since: when it was seen, against the drain's bound.
        gone: nodes whose agents are gone, asked nothing any more.
    """

    phase: Phase
    exit_code: int | None
    message: str
    since: float
    gone: frozenset[int] = frozenset()

    def observation(self) -> Observation:
        """What the executor reports once the attempt ends."""
        return Observation(self.phase, self.exit_code, self.message)


@dataclass
class RayAttempt:
    """Everything the executor holds of one placed attempt.

    Attributes:
        placed: the Ray node of each bundle.
        agents: the agent of each bundle's machine, once looked up.
        starting: the start calls in flight (``STARTING``).
        asked: the status calls in flight, by node; asked again once every node answered.
        failure: how the attempt ends (``DRAINING``).
        shrunk: nodes an elastic attempt lost and goes on without.
        private: a node works in a private copy: polls list the job's carried files (a walk of
            outputs/ that attempts on the share need not pay for every tick).
        copies: the tars of the private copies' working dirs, by the inputs sent with them (or
            why there is none).
        pending: each node's files that have not reached the share in full.
    """

    placed: dict[int, str]
    stage: AttemptStage = AttemptStage.PLACED
    agents: list[Any] | None = None
    starting: list[Any] = field(default_factory=list)
    asked: dict[int, Any] | None = None
    failure: Failure | None = None
    shrunk: set[int] = field(default_factory=set)
    private: bool = False
    copies: dict[tuple[str, ...], transfer.PrivateCopy | str] = field(default_factory=dict)
    pending: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def move(self, stage: AttemptStage) -> None:
        """Go to ``stage`` (staying is allowed).

        Raises:
            ValueError: the move is not in the stage table (a bug in the executor).
        """
        if stage is not self.stage and stage not in _MOVES[self.stage]:
            raise ValueError(f"a Ray attempt cannot go from {self.stage.value} to {stage.value}")
        self.stage = stage

    def fail(self, failure: Failure) -> bool:
        """Note how the attempt ends (a second failure only adds the nodes it lost to the
        first); whether this was the first failure (the other nodes are then to be stopped)."""
        if self.failure is not None:
            first = self.failure
            self.failure = Failure(first.phase, first.exit_code, first.message, first.since,
                                   first.gone | failure.gone)
            return False
        self.failure = failure
        self.move(AttemptStage.DRAINING)
        return True

    @property
    def gone(self) -> frozenset[int]:
        """Nodes asked nothing any more: lost with a failure, or left by an elastic attempt."""
        lost = self.failure.gone if self.failure is not None else frozenset()
        return lost | frozenset(self.shrunk)

    def drop_copies(self) -> None:
        """Close the private copies' tars (every node has its working dir, or it ended)."""
        for copy in self.copies.values():
            if isinstance(copy, transfer.PrivateCopy):
                copy.close()
        self.copies.clear()


@dataclass(frozen=True)
class RayHandle:
    """The Ray executor's launch handle of one attempt.

    Attributes:
        address: the Ray cluster's address.
        placement_group: the placement group's name (``<job id>.<attempt>``).
        started_at: when it was asked for, against the placement timeout.
    """

    address: str
    placement_group: str
    node_count: int
    attempt: int
    started_at: float

    def key(self, node: int) -> str:
        """Node ``node``'s key at its agent."""
        return f"{self.placement_group}.node{node}"

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored with the job."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> RayHandle:
        """The handle :meth:`to_json` gave. Raises RecordError if ``data`` is not one."""
        try:
            handle = cls(**data)
        except TypeError as e:
            raise RecordError(f"the Ray launch handle stored with the job is malformed ({e})") \
                from None
        if not (isinstance(handle.placement_group, str) and isinstance(handle.node_count, int)):
            raise RecordError(f"the Ray launch handle stored with the job is malformed: {data!r}")
        return handle
