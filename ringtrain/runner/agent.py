"""The agent: starts every rank of a plan, streams their output, and supervises them.

``Agent.run`` has three phases, as torchrun's agent: start every rank; monitor until all have
exited, stopping the rest on the first failure (or on an interrupt); return a
:class:`~ringtrain.runner.result.RunResult`. Each rank is a
:class:`~ringtrain.runner.supervised_rank.SupervisedRank`, whose threads (its output pumps, its
exit) tell the monitor what happened through one queue.

What a failure means is the one policy a subclass changes (the elastic agent re-forms the world
instead of stopping it): ``_on_rank_failed``, ``_on_rank_succeeded`` and ``_on_tick`` are its
hooks, and ``_start_rank``/``_stop_rank``/``_stop_all`` what it may do.
"""

from __future__ import annotations

import logging
import queue
import signal
import time
from collections.abc import Iterable

from ringtrain.runner import node_rendezvous as nodes
from ringtrain.runner.output import RankOutput
from ringtrain.runner.plan import LaunchPlan, RankSpec
from ringtrain.runner.result import RankOutcome, RankState, RunResult, check_transition, signal_name
from ringtrain.runner.spawn import RankProcess, SpawnOptions
from ringtrain.runner.supervised_rank import Event, SupervisedRank

log = logging.getLogger(__name__)

_REAP_TIMEOUT_S = 5.0  # how long to wait for processes after SIGKILL before giving up on them
_RELAY_POLL_S = 0.1  # how often the driver reads what other nodes' followers reported
_NO_HOROVOD = "No module named 'horovod"
_NO_TENSORFLOW = "No module named 'tensorflow"


def failure_hint(stderr_tail: Iterable[str]) -> str | None:
    """What to do about a rank's failure, read from its last stderr lines (oldest first):
    ``None`` unless the cause is unambiguous."""
    for line in stderr_tail:
        if not line.startswith("ModuleNotFoundError:"):
            continue
        if _NO_HOROVOD in line:
            return ("the script imports horovod, which is not installed: run it with "
                    "`ringtrain run --horovod-compat ...` (then `import horovod.torch` loads "
                    "ringtrain), or import ringtrain.torch as hvd")
        if _NO_TENSORFLOW in line:
            # Keras 3 imports TensorFlow when KERAS_BACKEND is unset (its default backend);
            # ringtrain.keras runs it on torch.
            return ("tensorflow is not installed and ringtrain does not use it: run Keras on "
                    "torch with KERAS_BACKEND=torch (set before keras is first imported; "
                    "`ringtrain run --horovod-compat` sets it when unset), and port "
                    "TensorFlow calls of the script to keras.ops")
    return None


class Agent:
    """Runs one launch plan to completion."""

    def __init__(self, plan: LaunchPlan, options: SpawnOptions, sink: RankOutput,
                 start_timeout_s: float, stop_grace_s: float | None = None,
                 relay: nodes.NodeRelay | None = None):
        """Args:
            sink: where the ranks' output goes (its owner closes it).
            start_timeout_s: how long a rank may take to report in.
            stop_grace_s: after a stop request, how long before the ranks are killed; by
                default a little longer than the wrapper's own grace, so the wrapper's orderly
                SIGTERM-then-SIGKILL of the command runs first.
            relay: the other nodes, whose followers start the ranks planned on them
                (``RankSpec.node``): an ssh launch's remote hosts, a per-node launch's nodes.
        """
        self._plan = plan
        self._relay = relay
        self._next_relay_poll = 0.0
        self._options = options
        self._sink = sink
        self._ranks: list[SupervisedRank] = []  # every rank started so far, in start order
        self._start_timeout_s = start_timeout_s
        self._stop_grace_s = options.grace_s + 2.0 if stop_grace_s is None else stop_grace_s
        # SimpleQueue: `put` is reentrant, so `interrupt` may be called from a signal handler.
        self._events: queue.SimpleQueue[tuple[Event, int]] = queue.SimpleQueue()
        self._root_causes: list[RankOutcome] = []
        self._interrupted_by: int | None = None
        self._stopping = False  # the whole job is being stopped

    def interrupt(self, signum: int) -> None:
        """Stop the job because the launcher got ``signum``; a second call kills at once.

        Safe to call from a signal handler or another thread.
        """
        self._events.put((Event.INTERRUPT, signum))

    def run(self) -> RunResult:
        """Start every rank, supervise them until all have exited, and report every rank's
        outcome and the root cause of a failure."""
        try:
            self._start()
            self._monitor()
        finally:
            self._cleanup()
        return self._result()

    def _result(self) -> RunResult:
        return RunResult(
            outcomes=tuple(r.final_outcome() for r in self._ranks),
            root_causes=tuple(self._root_causes),
            interrupted_by=self._interrupted_by,
            stopped=sum(r.stop_requested and r.state is RankState.STOPPED for r in self._ranks),
        )

    # -- start ------------------------------------------------------------------------------

    def _start(self) -> None:
        for index, spec in enumerate(self._plan.ranks):
            if not self._start_rank(spec):
                for later in self._plan.ranks[index + 1:]:
                    rank = SupervisedRank(later)
                    rank.exited = True
                    rank.finish(RankState.STOPPED, reason="not started")
                    self._ranks.append(rank)
                return

    def _start_rank(self, spec: RankSpec) -> bool:
        """Start one more rank; returns whether its process was created (if not, the rank has
        failed to start and ``_on_rank_failed`` was called)."""
        index = len(self._ranks)
        rank = SupervisedRank(spec)
        self._ranks.append(rank)
        if spec.node is not None:
            assert self._relay is not None  # ranks are planned on other nodes only with a relay
            rank.relayed = True
            # The follower applies the start timeout; the relay watches the node.
            self._relay.request_start(spec.node, nodes.StartRequest(
                spec.number, spec.slot, spec.env, spec.worker))
            log.debug("rank %d: asked node %d to start it", spec.number, spec.node)
            return True
        try:
            rank.proc = RankProcess(spec, self._plan.command, self._options)
        except OSError as e:
            rank.exited = True
            self._on_rank_failed(rank, rank.finish(RankState.START_FAILED, reason=str(e)))
            return False
        rank.deadline = time.monotonic() + self._start_timeout_s
        log.debug("rank %d on %s: started (pid %d)", spec.number, spec.hostname,
                  rank.proc.popen.pid)
        rank.watch(index, self._sink, self._options.token, self._events)
        return True

    # -- monitor ----------------------------------------------------------------------------

    def _monitor(self) -> None:
        while self._waiting() or any(not r.exited for r in self._ranks):
            try:
                kind, value = self._events.get(timeout=0.1)
            except queue.Empty:
                kind, value = None, -1  # time passed: deadlines are checked below
            if kind is Event.EXIT:
                self._on_exit(self._ranks[value])
            elif kind is Event.MARKER:
                rank = self._ranks[value]
                if rank.started and rank.state is RankState.STARTING:
                    rank.state = check_transition(rank.state, RankState.RUNNING)
            elif kind is Event.INTERRUPT:
                self._on_interrupt(value)
            now = time.monotonic()
            if self._relay is not None and now >= self._next_relay_poll:
                self._poll_relayed()
                self._next_relay_poll = now + _RELAY_POLL_S
            self._check_start_deadlines(now)
            self._kill_or_abandon_overdue(now)
            self._on_tick(now)

    def _on_exit(self, rank: SupervisedRank) -> None:
        # Let the stderr reader finish first: the wrapper's last markers may still be in the pipe.
        assert rank.proc is not None and rank.stderr_thread is not None  # it had a process
        rank.stderr_thread.join(timeout=2.0)
        rank.exited = True
        if rank.state.is_terminal:  # e.g. it timed out while starting and was stopped since
            return
        returncode = rank.proc.popen.returncode
        if rank.exit_marker is not None:
            code, sig = rank.exit_marker.exit_status()
        else:
            code, sig = (returncode, None) if returncode >= 0 else (None, -returncode)
        if not rank.started:
            reason = rank.failed_reason or rank.tail()
            killed = rank.abandon_at is not None and returncode == -signal.SIGKILL
            if rank.stop_requested and (killed or not reason):
                rank.finish(RankState.STOPPED, exit_code=code, signal=sig)
            else:
                reason = reason or (f"exited with code {returncode}" if returncode >= 0 else
                                    f"was killed by signal {signal_name(-returncode)}"
                                    ) + " before it started"
                self._on_rank_failed(rank, rank.finish(RankState.START_FAILED, exit_code=code,
                                                       signal=sig, reason=reason))
        elif code == 0:
            rank.finish(RankState.SUCCEEDED, exit_code=0)
            self._on_rank_succeeded(rank)
        elif rank.stop_requested:
            rank.finish(RankState.STOPPED, exit_code=code, signal=sig)
        else:
            hint = failure_hint(rank.stderr_tail)
            hinted = None if hint is None else (
                f"{'exited with code ' + str(code) if code is not None else 'died'}; {hint}")
            self._on_rank_failed(rank, rank.finish(RankState.FAILED, exit_code=code, signal=sig,
                                                   reason=hinted))

    def _poll_relayed(self) -> None:
        """Take in what the followers reported of their ranks (the relay fails those of lost
        nodes)."""
        assert self._relay is not None
        self._relay.refresh()
        for rank in self._ranks:
            if not rank.relayed or rank.exited:
                continue
            number = rank.spec.number
            if not rank.started and self._relay.started(number):
                rank.started = True
                if rank.state is RankState.STARTING:
                    rank.state = check_transition(rank.state, RankState.RUNNING)
            relayed = self._relay.outcome(number)
            if relayed is not None:
                rank.exited = True
                self._on_relayed_end(rank, relayed)

    def _on_relayed_end(self, rank: SupervisedRank, end: nodes.RelayedOutcome) -> None:
        if rank.state.is_terminal:
            return
        details = {"exit_code": end.exit_code, "signal": end.signal, "reason": end.reason}
        if end.state is RankState.SUCCEEDED:
            rank.finish(RankState.SUCCEEDED, exit_code=0)
            self._on_rank_succeeded(rank)
        elif end.state is RankState.START_FAILED and rank.state is RankState.STARTING:
            # As for a rank of this machine: one that could not start is a start failure even
            # after a stop request (its node may be unreachable, and every such rank is named).
            self._on_rank_failed(rank, rank.finish(RankState.START_FAILED, **details))
        elif end.state is RankState.STOPPED or rank.stop_requested:
            rank.finish(RankState.STOPPED, **details)
        else:
            self._on_rank_failed(rank, rank.finish(RankState.FAILED, **details))

    def _check_start_deadlines(self, now: float) -> None:
        late = [r for r in self._ranks if r.state is RankState.STARTING and not r.exited
                and not r.stop_requested and not r.relayed and now >= r.deadline]
        why = f"did not report in within {self._start_timeout_s:g} s (--start-timeout)"
        for rank in late:
            outcome = rank.finish(RankState.START_FAILED,
                                  reason=f"{why}: {rank.tail()}" if rank.tail() else why)
            self._stop_rank(rank)
            self._on_rank_failed(rank, outcome)

    # -- policy: what a subclass may change ---------------------------------------------------

    def _on_rank_failed(self, rank: SupervisedRank, outcome: RankOutcome) -> None:
        """A rank failed (exited badly, or did not start): by default the job stops."""
        self._fail(outcome)

    def _on_rank_succeeded(self, rank: SupervisedRank) -> None:
        """A rank exited with code 0."""

    def _on_tick(self, now: float) -> None:
        """Called by the monitor after each event, and at least every 0.1 s."""

    def _waiting(self) -> bool:
        """Whether to keep monitoring although no rank is running (ranks are yet to start)."""
        return False

    def _fail(self, *outcomes: RankOutcome) -> None:
        for outcome in outcomes:
            log.debug("%s", outcome.describe())
        # Failures after the stop are usually the survivors noticing that a peer is gone, so
        # only those before it are root causes; but every rank that could not start is named,
        # since connection failures to one host all arrive at about the same time.
        if not self._stopping:
            self._root_causes.extend(outcomes)
            self._stop_all()
        else:
            self._root_causes.extend(o for o in outcomes if o.state is RankState.START_FAILED)

    def _on_interrupt(self, signum: int) -> None:
        if not self._stopping:
            self._interrupted_by = signum
            self._stop_all()
        else:  # a second Ctrl-C: no more grace
            now = time.monotonic()
            for rank in self._ranks:
                if rank.abandon_at is None:
                    rank.kill_at = now

    def _stop_all(self) -> None:
        self._stopping = True
        for rank in self._ranks:
            self._stop_rank(rank)

    def _stop_rank(self, rank: SupervisedRank) -> None:
        """Ask one rank to stop (its exit is then no failure); SIGKILL follows after the grace."""
        if not rank.state.is_terminal:
            rank.stop_requested = True
        if rank.relayed and not rank.exited and rank.kill_at is None:
            assert self._relay is not None
            self._relay.request_stop(rank.spec.number, kill=False)
            rank.kill_at = time.monotonic() + self._stop_grace_s
        if rank.proc is not None and not rank.exited and rank.kill_at is None:
            rank.proc.request_stop()
            rank.kill_at = time.monotonic() + self._stop_grace_s

    def _kill_or_abandon_overdue(self, now: float) -> None:
        for rank in self._ranks:
            if rank.exited:
                continue
            if rank.abandon_at is None and rank.kill_at is not None and now >= rank.kill_at:
                log.debug("rank %d did not stop within %g s; killing it", rank.spec.number,
                          self._stop_grace_s)
                if rank.relayed:
                    assert self._relay is not None
                    self._relay.request_stop(rank.spec.number, kill=True)
                else:
                    assert rank.proc is not None  # a rank that has not exited has a process
                    rank.proc.kill()
                rank.abandon_at = now + _REAP_TIMEOUT_S
            elif rank.abandon_at is not None and now >= rank.abandon_at:
                log.warning("rank %d on %s did not exit after SIGKILL; leaving it",
                            rank.spec.number, rank.spec.hostname)
                rank.exited = True
                if not rank.state.is_terminal:
                    rank.finish(RankState.STOPPED, reason="did not exit after SIGKILL")

    # -- cleanup ----------------------------------------------------------------------------

    def _cleanup(self) -> None:
        # Normally every process has exited by now; this covers an exception in the agent.
        for rank in self._ranks:
            if rank.proc is not None and rank.proc.popen.poll() is None:
                rank.proc.kill()
            if rank.outcome is None:  # only after an exception in the agent
                rank.finish(RankState.STOPPED, reason="stopped by a launcher error")
        for rank in self._ranks:
            for thread in rank.threads:
                thread.join(timeout=1.0)  # a process that escaped its group may hold a pipe

