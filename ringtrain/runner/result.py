"""What a launch came to: each rank's state and outcome, and the job's root cause.

A rank moves ``STARTING -> RUNNING -> SUCCEEDED | FAILED | STOPPED``, or from ``STARTING`` to
``START_FAILED`` or ``STOPPED``; :func:`check_transition` enforces this table.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from ringtrain.errors import RingtrainError
from ringtrain.run_files import RootCause, RunReport

#: `ringtrain run`'s exit status when a rank failed after it started.
EXIT_RANK_FAILED = 1
#: ... when the job could not be started (bad input, or a rank that never started).
EXIT_START_FAILED = 2


class RankState(enum.Enum):
    """The lifecycle of one rank."""

    STARTING = "starting"  # process created, the task wrapper has not reported in yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # non-zero exit or killed by a signal, not on the launcher's request
    START_FAILED = "start_failed"  # could not be started, or did not report in in time
    STOPPED = "stopped"  # stopped by the launcher because another rank failed

    @property
    def is_terminal(self) -> bool:
        """Whether the rank has reached its outcome."""
        return not _TRANSITIONS[self]


_TRANSITIONS: dict[RankState, frozenset[RankState]] = {
    RankState.STARTING: frozenset({RankState.RUNNING, RankState.START_FAILED, RankState.STOPPED}),
    RankState.RUNNING: frozenset({RankState.SUCCEEDED, RankState.FAILED, RankState.STOPPED}),
    RankState.SUCCEEDED: frozenset(),
    RankState.FAILED: frozenset(),
    RankState.START_FAILED: frozenset(),
    RankState.STOPPED: frozenset(),
}


class TransitionError(RingtrainError, RuntimeError):
    """A rank was moved along a transition that the lifecycle does not have."""


def check_transition(old: RankState, new: RankState) -> RankState:
    """Return ``new`` if a rank may move from ``old`` to it.

    Raises:
        TransitionError: the move is not in the lifecycle's table.
    """
    if new not in _TRANSITIONS[old]:
        raise TransitionError(f"a rank cannot go from {old.value} to {new.value}")
    return new


@dataclass(frozen=True)
class RankOutcome:
    """How one rank ended."""

    rank: int  # in an elastic launch: the worker's number (see ``RankSpec.number``)
    hostname: str
    state: RankState
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None  # why it did not start, or what ended it besides an exit
    worker: bool = False  # an elastic worker, named "worker N"

    def describe(self) -> str:
        """One clause for the root-cause line, e.g. ``rank 1 on node2 exited with code 3``."""
        who = f"{'worker' if self.worker else 'rank'} {self.rank} on {self.hostname}"
        if self.state is RankState.START_FAILED:
            return f"{who} did not start: {self.reason}"
        if self.reason:
            return f"{who} failed: {self.reason}"
        if self.signal is not None:
            return f"{who} was killed by signal {signal_name(self.signal)}"
        return f"{who} exited with code {self.exit_code}"


@dataclass(frozen=True)
class RunResult:
    """The outcome of a launch, as returned by ``Agent.run``."""

    outcomes: tuple[RankOutcome, ...]
    root_causes: tuple[RankOutcome, ...]  # the first failure(s); empty on success or interrupt
    interrupted_by: int | None  # the signal that stopped the launcher, if one did
    stopped: int  # ranks the launcher stopped because of the root cause
    #: Elastic: workers lost (failed, or removed with their slots) whom the world was re-formed
    #: without; their outcomes do not decide the job's.
    survived: tuple[RankOutcome, ...] = ()
    #: Elastic: why the launcher ended the job itself (reset limit, too few slots in time).
    error: str | None = None
    #: A follower node of a per-node launch: the exit status node 0 ended the job with. The
    #: follower then exits 0 (it did its part; node 0's result is the job's), and non-zero only
    #: when it failed itself (it lost node 0, or could not join).
    followed: int | None = None

    @property
    def succeeded(self) -> bool:
        """Whether every rank succeeded."""
        return self.error is None and all(o.state is RankState.SUCCEEDED for o in self.outcomes)

    @property
    def exit_code(self) -> int:
        """`ringtrain run`'s exit status: 0, 1 (a rank failed), 2 (the job did not start) or
        128 + the signal that interrupted the launcher."""
        if self.interrupted_by is not None:
            return 128 + self.interrupted_by
        if self.succeeded or (self.followed is not None and self.error is None):
            return 0
        if any(o.state is RankState.START_FAILED for o in self.root_causes):
            return EXIT_START_FAILED
        return EXIT_RANK_FAILED

    def report(self) -> RunReport:
        """What ``--result-file`` holds: the exit status, the summary line, and each root
        cause's rank, host, state, exit code and signal (``None`` when it has none)."""
        return RunReport(self.exit_code, self.message, tuple(
            RootCause(c.rank, c.hostname, c.state.value, c.exit_code, c.signal)
            for c in self.root_causes))

    @property
    def message(self) -> str:
        """The one-line summary: the root cause and how many ranks were stopped."""
        if self.interrupted_by is not None:
            head = f"interrupted by signal {signal_name(self.interrupted_by)}"
        elif self.followed is not None and self.error is None:
            how = "succeeded" if self.followed == 0 else (
                f"failed with exit status {self.followed} (node 0's result names the root cause)")
            return f"the job {how}; {len(self.outcomes)} ranks ran on this node"
        elif self.succeeded:
            head = f"all {len(self.outcomes)} ranks succeeded"
            lost = [o.describe() for o in self.survived if o.state is not RankState.STOPPED]
            return f"{head}; the world was re-formed without: {'; '.join(lost)}" if lost else head
        elif self.error is not None:
            head = self.error
        else:
            head = "; ".join(_group_start_failures(self.root_causes))
        if not self.stopped:
            return head
        other = "" if self.interrupted_by is not None or self.error is not None else "the other "
        return f"{head}; stopped {other}{self.stopped} rank{'s' if self.stopped != 1 else ''}"


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; the number itself for numbers without a name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _group_start_failures(causes: Sequence[RankOutcome]) -> list[str]:
    # Ranks of one host that failed to start for the same reason read better as one clause.
    groups: dict[tuple[str, str | None], list[RankOutcome]] = {}
    clauses = []
    for cause in causes:
        if cause.state is RankState.START_FAILED:
            groups.setdefault((cause.hostname, cause.reason), []).append(cause)
        else:
            clauses.append(cause.describe())
    for (hostname, reason), members in groups.items():
        if len(members) == 1:
            clauses.append(members[0].describe())
        else:
            ranks = ", ".join(str(m.rank) for m in sorted(members, key=lambda m: m.rank))
            clauses.append(f"ranks {ranks} on {hostname} did not start: {reason}")
    return clauses
