"""The round runner: runs this rank's rounds in order, each as its bell says (a unit round, or a
negotiation round: docs/engine.md). The engine thread runs :meth:`RoundRunner.run`; a caller
that claimed a round, :meth:`RoundRunner.run_claimed` (see :mod:`ringtrain.engine.turn`).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace

from ringtrain.backends import spin
from ringtrain.backends.base import CollectiveBackend
from ringtrain.engine import control, deadlock, negotiation
from ringtrain.engine.backlog import Backlog
from ringtrain.engine.config import EngineConfig
from ringtrain.engine.control import ControlVector
from ringtrain.engine.doorbell import NEGOTIATE, Doorbell, Rounds, reach_store
from ringtrain.engine.execute import Executor
from ringtrain.engine.intraop import serialize_this_thread
from ringtrain.engine.negotiation import Decision
from ringtrain.engine.peers import PeerProcess, Peers
from ringtrain.engine.readiness import Readiness
from ringtrain.engine.request import OpKey
from ringtrain.engine.response_cache import ResponseCache
from ringtrain.engine.stall import StallInspector
from ringtrain.engine.timeline import ROUNDS_ROW, Timeline
from ringtrain.engine.turn import Turn
from ringtrain.engine.waits import WaitTracker
from ringtrain.errors import HorovodInternalError
from ringtrain.op_types import OpType

log = logging.getLogger(__name__)

#: The engine thread waits this long for a bell before checking again that it should go on;
#: rounds only start when a rank rings.
_BELL_WAIT_S = 3600.0
#: An engine whose callers may run rounds checks this often whether one of them failed it (a
#: collective of theirs found a peer dead): nobody rings for that.
_CALLERS_BELL_WAIT_S = 1.0
#: A pause in submissions this long ends a negotiation round's gathering before the cycle time.
_QUIET_S = 0.0002


class RoundRunner:
    """Runs an engine's rounds, and holds what they share with its callers (the engine's
    arguments, see :class:`~ringtrain.engine.engine.Engine`).

    Attributes:
        stopped: set once :meth:`run` has ended.
        gather_s: the cycle time: how long a negotiation round gathers at most.
    """

    def __init__(self, backend: CollectiveBackend, config: EngineConfig, doorbell: Doorbell,
                 backend_name: str, clock: Callable[[], float], peers: Sequence[PeerProcess],
                 inline: bool):
        self.rank, self.size = backend.rank, backend.size
        self._backend = backend
        self.doorbell = doorbell
        self.clock = clock
        self.timeline = Timeline(self.rank)
        self.executor = Executor(backend, config.fusion_threshold_bytes, self.timeline,
                                 backend_name)
        self.cache = ResponseCache(config.cache_capacity)
        self.readiness = Readiness(self.cache, functools.partial(reach_store, doorbell.count),
                                   functools.partial(reach_store, doorbell.read))
        self.backlog = Backlog()
        self.rounds = Rounds(self.rank, doorbell)
        # --no-stall-check (HOROVOD_STALL_CHECK_DISABLE) turns deadlock detection off too.
        self.waits = WaitTracker(self.rank, config.stall_check_enabled, clock)
        self.turn = Turn(doorbell, inline, lambda: self.backlog.failure is not None,
                         self.backlog.fail)
        self._stall = StallInspector(self.rank, config, clock)
        self._peers = Peers(self.rank, peers)
        self.stopped = threading.Event()
        self.gather_s = max(config.cycle_time_ms, 0.0) / 1000.0

    def run(self) -> None:
        """The engine thread: wait for each round's bell and run the round, until the engine
        fails or every rank stops."""
        serialize_this_thread()  # see intraop: a team of this thread's own would fight training
        # It waits beside the training thread, which may be running Python: brief spins only.
        spin.limit_this_thread(spin.BESIDE_PYTHON_SPIN_S)
        bell_wait_s = _CALLERS_BELL_WAIT_S if self.turn.callers_may_run else _BELL_WAIT_S
        try:
            while self.backlog.failure is None:
                # Read afresh: callers may have run rounds while this thread slept (their
                # claims spare it the wake-up), and a bell that old may have been reused.
                round_ = self.rounds.current
                bell = self.doorbell.wait(round_, bell_wait_s)
                if bell is None:
                    continue
                with self.turn.lock:
                    if self.backlog.failure is not None:
                        break
                    if self.rounds.current != round_:  # a caller ran that round itself
                        continue
                    if not self.run_round(bell):
                        break
        except BaseException as exc:
            self.fail(exc)
        finally:
            self.stopped.set()
            self.timeline.stop()

    def run_claimed(self, bell: bytes) -> None:
        """Run the claimed unit round in a caller's thread (holding the turn)."""
        try:
            self.run_round(bell)
        except BaseException as exc:
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        """Fail the engine with ``exc``, raised where a round ran, naming the rank that died if
        a collective failed; raise ``exc`` again if it is no ordinary exception."""
        if isinstance(exc, HorovodInternalError):  # the stall inspector gave up; a doorbell's
            self.backlog.fail(exc)
        elif isinstance(exc, Exception):  # a collective failed: a peer died or the network broke
            log.debug("engine stopped by %r", exc)
            self.backlog.fail(self._peers.collective_failure(exc))
        else:
            # A signal handler raised inside a caller's collective (Ctrl-C): this rank's part
            # of it is lost, and so is its place in the sequence of rounds.
            self.backlog.fail(HorovodInternalError(
                f"rank {self.rank} was interrupted ({exc!r}) in the middle of a collective; "
                "call hvd.init() again to continue"))
            raise exc

    def run_round(self, bell: bytes) -> bool:
        """Run the current round (its bell read) and move on to the next; False once every
        rank must stop. The calling thread holds the turn."""
        rounds = self.rounds
        rounds.start(self.clock(), bell)
        if bell == NEGOTIATE:
            self._gather()
            if not self._negotiation_round():
                return False
        else:
            self._unit_round(bell.decode())
        with self.backlog.lock:
            rounds.finish()
            if self.backlog.peers_joined and self.backlog.queue:
                rounds.ring(NEGOTIATE)
        return True

    def _gather(self) -> None:
        """Wait up to one cycle time while this rank keeps submitting, so that what arrives
        meanwhile is fused in this round; not once submissions pause, nor once a submitter blocks
        on a result (docs/engine.md, "Rounds and the doorbell")."""
        backlog = self.backlog
        deadline = self.clock() + self.gather_s
        seen = backlog.submitted
        while (remaining := deadline - self.clock()) > 0:
            if backlog.caller_blocked.wait(min(_QUIET_S, remaining)):
                return
            if backlog.submitted == seen:
                return
            seen = backlog.submitted

    def _negotiation_round(self) -> bool:
        """Take the queue, add up the control vectors, decide and execute; False once every
        rank must stop."""
        backlog = self.backlog
        with backlog.lock:
            backlog.take_queue(self.rounds.current)
            shutting_down = backlog.shutdown_requested
            self.rounds.drained = True
            # Callers blocked so far wait for requests this round takes; a later one is news.
            backlog.caller_blocked.clear()
            wait_state, awaited = self.waits.state(backlog.pending)
        if self.timeline.mark_rounds:
            self.timeline.instant(ROUNDS_ROW, "CYCLE_START")  # Horovod's name for the event
        mine, bits = self._offer(shutting_down, wait_state, awaited)
        packed = mine.pack()
        self._backend.control_allreduce(packed)
        total = ControlVector.unpack(packed, self.size)
        blocked = self.waits.blocked(list(total.wait_states))
        if total.shutdown:
            backlog.fail(HorovodInternalError(
                "ringtrain was shut down (hvd.shutdown() was called on "
                f"{total.shutdown} rank(s)); call hvd.init() again to continue"))
            return False
        backlog.peers_joined = bool(total.joined)
        if not total.decides_by_counts:
            decision = self._full_exchange(awaited, blocked)
        else:
            decision = Decision(responses=[self.cache.response(bit)
                                           for bit, n in enumerate(total.offers)
                                           if n == self.cache.members(bit)])
            if decision.responses:
                # Run by the counts, not by their readiness counters, which some members may
                # not have added to (their units differ): those counters must start even again.
                self._renew_counters(decision)
        self._note_wanted(decision, total.offers, bits)
        self._execute(decision)
        # After the round's work, not before it: releasing bells is a store round trip per round
        # on rank 0, and no rank waits for it.
        self.rounds.forget()
        return True

    def _offer(self, shutting_down: bool, wait_state: int,
               awaited: set[OpKey]) -> tuple[ControlVector, set[int]]:
        """This rank's control vector, and the cached responses it offers."""
        pending = self.backlog.pending
        bits, missed, joined = control.offers(pending.values(), self.cache)
        return ControlVector.of_rank(
            self.rank, self.size, len(self.cache), bits,
            full_exchange=missed or self._stall.wants_report(list(pending.values())),
            shutdown=shutting_down, joined=joined,
            deadlock_check=self.waits.wants_check(wait_state, awaited, pending),
            wait_state=wait_state), bits

    def _note_wanted(self, decision: Decision, offered: Sequence[int], mine: set[int]) -> None:
        """Remember the operations peers offered in this round that this rank has not submitted:
        submitted here later, each must ring for a negotiation, as its readiness counter can no
        longer complete (one submitted while this round ran rings now). One leaves the set
        when its operation runs here (:meth:`Backlog.take_decided`) or with the next negotiation.
        """
        if decision.waiting:  # a full exchange says who is missing
            wanted = {key for key, w in decision.waiting.items() if self.rank in w.missing}
        else:  # the counts do: offered by some members, not by this rank
            wanted = {self.cache.response(bit).key for bit, n in enumerate(offered)
                      if n and bit not in mine and n < self.cache.members(bit)}
        backlog = self.backlog
        with backlog.lock:
            backlog.wanted_by_peers = wanted
            if wanted and any(r.key in wanted and not self.readiness.completed(r)
                              for r in backlog.queue):
                self.rounds.ring(NEGOTIATE)

    def _unit_round(self, tag: str) -> None:
        """Run this rank's requests counted under ``tag``: every member has them queued, or had
        them run by an earlier round on every rank alike."""
        with self.backlog.lock:
            self.rounds.drained = True
            unit = self.backlog.take_unit(tag, self.rounds.current)
        bits = []
        for request in unit:
            bit = self.cache.lookup(request.meta)
            assert bit is not None  # a request is counted under a tag only once it is cached
            bits.append(bit)
        bits.sort()
        decision = Decision(responses=[self.cache.response(bit) for bit in bits])
        self._execute(decision)
        if decision.responses and len(decision.responses[0].set_ranks) == self.size:
            self.rounds.forget()  # every rank took part in the collective: all are past the bell

    def _full_exchange(self, awaited: set[OpKey], blocked: list[int]) -> Decision:
        now = self.clock()
        metas = [replace(r.meta, age_s=now - r.submitted_at, waited=r.key in awaited,
                         offered_round=r.offered_round)
                 for r in self.backlog.pending.values()]
        gathered = self._backend.control_allgather(metas)
        decision = negotiation.decide(gathered)
        failed = deadlock.find(gathered, decision, blocked)
        if failed:
            log.error("rank %d: %s", self.rank, failed[0].error)
            decision.responses.extend(failed)
            for response in failed:
                decision.waiting.pop(response.key, None)
        self._renew_counters(decision)
        stall_error = self._stall.inspect(decision)
        if stall_error is not None:
            raise stall_error
        return decision

    def _renew_counters(self, decision: Decision) -> None:
        """Record a negotiation round's responses in the cache, which gives their keys fresh
        readiness counters (on every rank alike: the decision is); waiting requests whose unit's
        counter changed count again. Before the handles complete: a key submitted again must
        count on its new counter."""
        backlog = self.backlog
        with backlog.lock:
            for response in decision.responses:
                self.cache.put(response)
            decided = {response.key for response in decision.responses}
            waiting = [r for r in (*backlog.pending.values(), *backlog.queue)
                       if r.key not in decided]
            for ring in self.readiness.recount(waiting):
                self.rounds.ring(ring)

    def _execute(self, decision: Decision) -> None:
        decided_at = self.clock()
        with self.backlog.lock:
            local = self.backlog.take_decided(decision.responses)
        timeline = self.timeline
        if timeline.active:
            for request in local.values():
                timeline.span(request.name, f"NEGOTIATE_{request.meta.op.value.upper()}",
                              request.submitted_at, decided_at)
        try:
            self.executor.run(decision.responses, local)
        except BaseException:
            # The collective failed (a peer died): its requests are no longer pending, and must
            # fail with the rest rather than leave their callers waiting.
            with self.backlog.lock:
                self.backlog.pending.update((n, r) for n, r in local.items()
                                             if not r.handle.done())
            raise
        if decision.join_done is not None:
            self._complete_joins(decision.join_done)

    def _complete_joins(self, last_rank: int) -> None:
        backlog = self.backlog
        with backlog.lock:
            joins = [k for k, r in backlog.pending.items() if r.meta.op is OpType.JOIN]
            requests = [backlog.pending.pop(k) for k in joins]
            backlog.keys.difference_update(joins)
        for request in requests:
            request.handle.set_result(last_rank)
