"""The elastic agent: the driver half of Horovod's elastic training.

It supervises workers as the fixed :class:`~ringtrain.runner.agent.Agent` does, but a failed
worker does not end the job: the world is re-formed without it. Worlds follow one another by
generation, each agreed through the launcher's store (:mod:`ringtrain.contract.elastic_rendezvous`):

1. The first world starts once discovery offers ``-np`` slots (within ``--elastic-timeout``); it
   takes every offered slot up to ``--max-np`` (:func:`elastic_plan.plan_world`).
2. A re-form begins when a member fails, or when a rank leaves its world: it saw a peer fail
   (``HorovodInternalError``: it restored its last commit) or was told at ``commit()`` that the
   hosts changed (``HostsUpdatedInterrupt``). The agent tells the ranks of host changes only
   when they would change the world, and only once it could form it (``--min-np`` slots).
3. Once every live member has left the world (or at once, if the world never formed), the next
   world is planned from the survivors and the hosts discovered now, published, its new workers
   started and its removed workers stopped. ``--reset-limit`` bounds the number of re-forms;
   a re-form needs ``--min-np`` slots within ``--elastic-timeout``.
4. Once a worker exits with code 0 the job is finishing: no more re-forms, and the job succeeds
   if every member of the last world does.

A host where a worker failed gets no replacement until discovery reports it anew
(:class:`elastic_plan.FailedHosts`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Protocol

from ringtrain.contract import elastic_rendezvous as rdzv
from ringtrain.contract.env import ElasticWorker
from ringtrain.contract.slots import SlotInfo
from ringtrain.run_files import LostWorker, WorldReport, write_json
from ringtrain.runner import node_rendezvous as nodes
from ringtrain.runner.agent import Agent
from ringtrain.runner.config import ElasticSpec
from ringtrain.runner.elastic_plan import FailedHosts, Worker, WorldPlan, plan_world
from ringtrain.runner.hosts import HostInfo
from ringtrain.runner.output import RankOutput
from ringtrain.runner.plan import RankPlanner
from ringtrain.runner.result import RankOutcome, RankState, RunResult
from ringtrain.runner.spawn import SpawnOptions
from ringtrain.runner.supervised_rank import SupervisedRank

log = logging.getLogger(__name__)

#: Why the reset limit ends a job (Horovod: "number of resets during elastic job exceeded limit").
RESET_LIMIT_MESSAGE = ("the world must be re-formed again, but --reset-limit allows {limit} "
                       "re-forms; stopping the job")


def write_world(path: str, generation: int, slots: Mapping[int, SlotInfo],
                lost: Sequence[LostWorker]) -> None:
    """Replace the ``--world-file`` (:class:`~ringtrain.run_files.WorldReport`, which the job
    service reads) with world ``generation`` (workers by id) and the ``lost`` workers so far,
    atomically; a file that cannot be written is logged, not fatal."""
    hosts: dict[str, list[int]] = {}
    for worker, slot in sorted(slots.items(), key=lambda item: item[1].rank):
        hosts.setdefault(slot.hostname, []).append(worker)
    report = WorldReport(generation, {h: tuple(w) for h, w in hosts.items()}, tuple(lost))
    try:
        write_json(path, report.to_json())
    except OSError as e:
        log.warning("--world-file %s: cannot write world %d (%s)", path, generation, e.strerror)


class HostSource(Protocol):
    """Where the driver learns the hosts: a discovery script's poller, or a per-node launch's
    registered nodes."""

    def latest(self) -> dict[str, int]:
        """The hosts and their slots now, in the order found."""
        ...


def _worker(rank: SupervisedRank) -> int:
    """The worker id of a rank of an elastic launch (each has one)."""
    assert rank.spec.worker is not None
    return rank.spec.worker


class ElasticAgent(Agent):
    """Runs an elastic launch to completion."""

    def __init__(self, planner: RankPlanner, spec: ElasticSpec, initial_np: int,
                 poller: HostSource, store: rdzv.Store, run_id: str, options: SpawnOptions,
                 sink: RankOutput, start_timeout_s: float,
                 relay: nodes.NodeRelay | None = None):
        """``initial_np``: the fewest ranks of the first world (``-np``); ``poller``: the host
        discovery, started; ``store``: the launcher's rendezvous store; the rest as for
        :class:`Agent`."""
        super().__init__(planner.launch_plan([]), options, sink, start_timeout_s, relay=relay)
        self._planner = planner
        self._spec = spec
        self._initial_np = initial_np
        self._poller = poller
        self._store = store
        self._keys = rdzv.Keys(run_id)
        self._failed_hosts = FailedHosts()
        self._generation = 0
        self._slots: Mapping[int, SlotInfo] = {}  # the current world: worker -> slot
        self._workers: dict[int, SupervisedRank] = {}  # every worker started, by id
        self._next_id = 0
        self._resets = 0
        self._since = time.monotonic()  # since when the first or next world is due
        self._reform_due = False
        self._notified: rdzv.HostUpdate | None = None
        self._finishing = False
        self._survived: set[int] = set()  # workers the world was re-formed without
        self._lost: list[LostWorker] = []  # workers that failed, for --world-file
        self._error: str | None = None

    # -- the Agent's hooks ---------------------------------------------------------------------

    def _start(self) -> None:
        """Nothing yet: the first world starts from ``_on_tick`` once there are slots."""

    def _waiting(self) -> bool:
        return self._generation == 0 and not self._stopping

    def _on_rank_failed(self, rank: SupervisedRank, outcome: RankOutcome) -> None:
        if self._stopping or self._finishing or rank.spec.worker not in self._slots:
            self._fail(outcome)
            return
        live = self._live()
        if not live:
            self._fail(outcome)  # nobody is left to carry the state on
            return
        host = rank.spec.hostname
        self._lost.append(LostWorker(_worker(rank), host, self._generation,
                                     outcome.describe()))
        self._write_world()  # a supervisor learns of the loss before the world re-forms
        self._failed_hosts.record_failure(
            host, sum(m.spec.hostname == host for m in live), self._poller.latest().get(host))
        log.warning("%s; re-forming the world without it", outcome.describe())
        self._begin_reform()

    def _on_rank_succeeded(self, rank: SupervisedRank) -> None:
        if rank.spec.worker in self._slots:
            self._finishing = True

    def _on_tick(self, now: float) -> None:
        if self._stopping or self._finishing:
            return
        hosts = self._usable_hosts()
        if self._generation == 0:
            self._form_if_enough(plan_world([], hosts, self._spec.max_np, 0), self._initial_np,
                                 now)
            return
        if not self._reform_due:
            if rdzv.ready_workers(self._store, self._keys, self._generation,
                                  tuple(self._slots)):
                self._begin_reform()  # a rank saw a peer fail, or was told of new hosts
            else:
                self._notify_host_changes(hosts)
                return
        if self._spec.reset_limit is not None and self._resets >= self._spec.reset_limit:
            self._stop_job(RESET_LIMIT_MESSAGE.format(limit=self._spec.reset_limit))
            return
        live = self._live()
        left = rdzv.ready_workers(self._store, self._keys, self._generation,
                                  tuple(_worker(r) for r in live))
        formed = rdzv.world_formed(self._store, self._keys, self._generation, len(self._slots))
        if formed and len(left) < len(live):
            if now - self._since > self._spec.timeout_s:
                stuck = ", ".join(str(r.spec.worker) for r in live if r.spec.worker not in left)
                self._stop_job(f"workers {stuck} did not leave world {self._generation} within "
                               f"{self._spec.timeout_s:g} s (--elastic-timeout) after it broke")
            return
        plan = plan_world([Worker(_worker(r), r.spec.hostname) for r in live], hosts,
                          self._spec.max_np, self._next_id)
        self._form_if_enough(plan, self._spec.min_np, now)

    def _result(self) -> RunResult:
        counted = [r for r in self._ranks if r.spec.worker not in self._survived]
        return RunResult(
            outcomes=tuple(r.final_outcome() for r in counted),
            root_causes=tuple(self._root_causes),
            interrupted_by=self._interrupted_by,
            stopped=sum(r.stop_requested and r.state is RankState.STOPPED for r in counted),
            survived=tuple(r.final_outcome() for r in self._ranks
                           if r.spec.worker in self._survived),
            error=self._error,
        )

    # -- worlds --------------------------------------------------------------------------------

    def _live(self) -> list[SupervisedRank]:
        """The current world's workers that have not ended, in rank order."""
        live = [self._workers[w] for w in self._slots if w in self._workers]
        return sorted((r for r in live if not r.state.is_terminal),
                      key=lambda r: self._slots[_worker(r)].rank)

    def _usable_hosts(self) -> list[HostInfo]:
        reported = self._poller.latest()
        self._failed_hosts.forget_changed(reported)
        return self._failed_hosts.usable(reported)

    def _begin_reform(self) -> None:
        if not self._reform_due:
            self._reform_due = True
            self._since = time.monotonic()

    def _form_if_enough(self, plan: WorldPlan, needed: int, now: float) -> None:
        if plan.size >= needed:
            self._form(plan)
        elif now - self._since > self._spec.timeout_s:
            self._stop_job(f"fewer than {needed} slots were available for "
                           f"{self._spec.timeout_s:g} s (--elastic-timeout); the hosts offer "
                           f"{plan.size}")

    def _form(self, plan: WorldPlan) -> None:
        old = self._generation
        generation = old + 1
        rdzv.publish_world(self._store, self._keys, generation, plan.slots)
        self._survived.update(w for w in self._slots if w not in plan.slots)
        if old:
            self._resets += 1
        self._generation = generation
        self._slots = plan.slots
        self._next_id += len(plan.new)
        self._reform_due = False
        self._notified = None
        for worker in plan.removed:
            log.info("worker %d: no slot in world %d; stopping it", worker, generation)
            self._stop_rank(self._workers[worker])
        for new in plan.new:
            self._start_worker(new.id, plan.slots[new.id], generation)
        if old:
            rdzv.replace_world(self._store, self._keys, old, generation)
        self._write_world()
        log.info("world %d: %d ranks (workers %s)", generation, plan.size,
                 ", ".join(map(str, plan.slots)))

    def _write_world(self) -> None:
        if self._spec.world_file is not None:
            write_world(self._spec.world_file, self._generation, self._slots, self._lost)

    def _start_worker(self, worker: int, slot: SlotInfo, generation: int) -> None:
        spec = self._planner.rank(slot, ElasticWorker(worker, generation, self._spec.timeout_s))
        try:
            # A per-node launch's other nodes write their workers' files; an ssh launch's
            # remote hosts send the output here.
            if spec.node is None or (self._relay is not None and self._relay.output_here):
                self._sink.open_rank(worker)
        except OSError as e:
            self._stop_job(f"--output-filename: cannot create the files of worker {worker} ({e})")
            return
        self._start_rank(spec)
        self._workers[worker] = self._ranks[-1]

    def _notify_host_changes(self, hosts: list[HostInfo]) -> None:
        """Tell the ranks (at their next commit) that the hosts changed, when that would change
        the world and the world could then be formed."""
        plan = plan_world([Worker(_worker(r), r.spec.hostname) for r in self._live()], hosts,
                          self._spec.max_np, self._next_id)
        if not (plan.new or plan.removed) or plan.size < self._spec.min_np:
            return
        if plan.new and plan.removed:
            update = rdzv.HostUpdate.MIXED
        else:
            update = rdzv.HostUpdate.ADDED if plan.new else rdzv.HostUpdate.REMOVED
        update = update.merge(self._notified)
        if update is not self._notified:
            log.info("hosts changed (%s): telling the ranks of world %d", update.value,
                     self._generation)
            rdzv.notify_hosts(self._store, self._keys, self._generation, update)
            self._notified = update

    def _stop_job(self, error: str) -> None:
        log.error("%s", error)
        self._error = error
        self._stop_all()
