"""A follower node of a per-node launch: starts and stops the driver's ranks on this machine.

It supervises its ranks as the driver's :class:`~ringtrain.runner.agent.Agent` does its own, but
decides nothing: it starts and stops the ranks the driver asks it to
(:mod:`ringtrain.runner.node_rendezvous`) and reports how they went, until the driver ends the
job, or until it loses the driver (the store stops answering, or the ssh launcher's connection
closes) and stops its ranks: a job without its driver cannot go on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from ringtrain.contract.elastic_rendezvous import Store
from ringtrain.runner import node_rendezvous as nodes
from ringtrain.runner.agent import Agent
from ringtrain.runner.output import RankOutput
from ringtrain.runner.plan import LaunchPlan, RankSpec
from ringtrain.runner.result import RankOutcome, RunResult
from ringtrain.runner.spawn import SpawnOptions
from ringtrain.runner.supervised_rank import SupervisedRank

log = logging.getLogger(__name__)


class FollowerAgent(Agent):
    """Runs the ranks the driver places on this node until the driver ends the job."""

    def __init__(self, node: nodes.NodeInfo, store: Store, command: tuple[str, ...],
                 options: SpawnOptions, sink: RankOutput, start_timeout_s: float,
                 environ: Mapping[str, str]):
        """``environ`` is this node's environment, the driver's variables going on top of it;
        the rest as for :class:`Agent`."""
        super().__init__(LaunchPlan(command, (), "", 0, ""), options, sink, start_timeout_s)
        self._node = node
        self._store = store
        self._environ = dict(environ)
        self._seen = 0  # start requests taken
        self._reported: set[int] = set()  # ranks whose end was reported
        self._announced: set[int] = set()  # ranks whose start was reported
        self._next_beat = 0.0
        self._done: int | None = None  # the job's exit status, once the driver ended it
        self._error: str | None = None
        self._lost_driver: str | None = None  # set from another thread

    def lose_driver(self, why: str) -> None:
        """The driver is gone (``why`` says how): stop this node's ranks and end.

        Safe to call from another thread; acted on at the monitor's next tick.
        """
        self._lost_driver = why

    def _start(self) -> None:
        """Nothing yet: ranks start when the driver asks."""

    def _waiting(self) -> bool:
        return self._done is None and self._error is None and not self._stopping

    def _on_rank_failed(self, rank: SupervisedRank, outcome: RankOutcome) -> None:
        """The driver decides what a failure means; the follower only reports it."""

    def _on_tick(self, now: float) -> None:
        if self._error is not None or self._done is not None:
            return
        if self._lost_driver is not None:
            self._error = self._lost_driver
            self._stop_all()
            return
        try:
            self._talk(now)
        except Exception as e:  # the store's errors are RuntimeErrors or DistStoreErrors
            # Reported once, as the result's message, after the ranks stopped.
            self._error = (f"node {self._node.rank}: lost the driver's store ({e}); stopping "
                           "this node's ranks")
            self._stop_all()

    def _talk(self, now: float) -> None:
        if now >= self._next_beat:
            nodes.beat(self._store, self._node.rank)
            self._next_beat = now + nodes.BEAT_INTERVAL_S
        for request in nodes.start_requests(self._store, self._node.rank, self._seen):
            self._seen += 1
            self._start_requested(request)
        for rank in self._ranks:
            number = rank.spec.number
            if rank.started and number not in self._announced:
                nodes.report_started(self._store, number)
                self._announced.add(number)
            if rank.outcome is not None and rank.exited and number not in self._reported:
                nodes.report_outcome(self._store, rank.outcome)
                self._reported.add(number)
            elif not rank.state.is_terminal:
                asked = nodes.stop_request(self._store, number)
                if asked == "kill" and rank.proc is not None and not rank.exited:
                    rank.kill_at = now  # the monitor kills it at once
                    rank.stop_requested = True
                elif asked is not None and not rank.stop_requested:
                    self._stop_rank(rank)
        self._done = nodes.done(self._store)
        if self._done is not None:
            self._stop_all()  # normally nothing is left
            nodes.say_bye(self._store, self._node.rank)

    def _start_requested(self, request: nodes.StartRequest) -> None:
        spec = RankSpec(request.slot, self._environ | dict(request.env), request.worker)
        try:
            self._sink.open_rank(request.number)
        except OSError as e:
            log.error("rank %d: cannot create its output files (%s)", request.number, e)
        log.debug("node %d: starting rank %d", self._node.rank, request.number)
        self._start_rank(spec)

    def _result(self) -> RunResult:
        result = super()._result()
        if self._error is None and self._done is None:  # stopped: leave, so no rank comes
            try:
                for rank in self._ranks:
                    if rank.outcome is not None and rank.spec.number not in self._reported:
                        nodes.report_outcome(self._store, rank.outcome)
                nodes.say_bye(self._store, self._node.rank)
            except Exception as e:  # the driver may be gone too
                log.warning("node %d: cannot tell the driver it leaves (%s)", self._node.rank, e)
        return RunResult(result.outcomes, result.root_causes, result.interrupted_by,
                         result.stopped, error=self._error, followed=self._done)


def wait_for_store(connect: Callable[[float], Store], timeout_s: float, what: str) -> Store:
    """Connect to the driver's store at ``what`` (node 0 may start later), retrying until
    ``timeout_s``; ``connect`` makes one client connection within the seconds it is given,
    raising when nobody answered by then.

    Raises:
        TimeoutError: nobody answered within the timeout.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return connect(max(0.5, min(5.0, deadline - time.monotonic())))
        except Exception as e:  # RuntimeError / DistNetworkError while node 0 is not up
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the driver (node 0) did not answer at {what} within "
                                   f"{timeout_s:g} s (--rdzv-timeout): {e}") from None
            time.sleep(0.2)
