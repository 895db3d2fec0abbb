"""The engine: one per process, a background thread that negotiates and runs named operations.

Rounds start on the doorbell (see :mod:`ringtrain.engine.doorbell`), and are of two kinds.

A unit round runs one unit of cached operations (a gradient bucket) that its last member found
submitted everywhere (see :mod:`ringtrain.engine.readiness`): every rank knows what to run from
the bell alone.

An operation submitted on its own while nothing else is queued (a synchronous collective) is
counted as a unit of one, so that a cached one runs in a unit round too.

A negotiation round starts when a request needs all ranks' attention (an operation the cache does
not know, the rest of a burst of operations submitted one by one, shutdown, a stall to report).
Every rank takes part in one negotiation: a sum of per-rank counts (the response cache's bits,
plus flags for "I have a request the cache does not know", "I want to shut down", "I have
joined"). When every rank's requests hit the cache, the counts alone say what is ready.
Otherwise all ranks exchange the metas of everything pending and :func:`negotiation.decide`
makes the same decision on every rank.

Either way the operations to run are then fused and executed, and their handles completed.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import torch

from ringtrain.backends.base import CollectiveBackend
from ringtrain.engine import negotiation
from ringtrain.engine.config import EngineConfig
from ringtrain.engine.doorbell import NEGOTIATE, Doorbell
from ringtrain.engine.execute import Executor
from ringtrain.engine.intraop import serialize_this_thread
from ringtrain.engine.liveness import Liveness
from ringtrain.engine.negotiation import Decision
from ringtrain.engine.peers import PeerProcess, Peers
from ringtrain.engine.readiness import Readiness
from ringtrain.engine.request import Request
from ringtrain.engine.response_cache import ResponseCache
from ringtrain.engine.stall import StallInspector
from ringtrain.engine.timeline import CYCLE_ROW, Timeline
from ringtrain.errors import HorovodInternalError, StallError
from ringtrain.op_types import OpType

log = logging.getLogger(__name__)

_FULL_EXCHANGE, _SHUTDOWN, _JOINED, _FLAGS = 0, 1, 2, 3
#: The engine waits this long for the doorbell before checking again that it should go on;
#: rounds only start when a rank rings.
_BELL_WAIT_S = 3600.0
#: A pause in submissions this long ends a round's gathering before the cycle time is up.
_QUIET_S = 0.0002
#: How often requests waiting on peers trigger a round (liveness and stall checks).
_PROBE_S = 1.0


class Engine:
    """Queues named requests and runs them in agreement with every other rank.

    Three kinds of thread share an engine: *callers* (any thread that submits, closes a
    :meth:`one_round` block or shuts down), the *engine* thread (``_run``: rounds, collectives,
    handles) and the *watch* (``_watch_pending``: rings while requests wait on peers). Rounds are
    numbered alike on every rank; a round is *drained* once it has taken this rank's requests.
    ``_lock`` guards every field below that more than one thread writes.

    =======================  =========================================  ==========================
    field                    means                                      written by (lock)
    =======================  =========================================  ==========================
    ``_queue``               submitted requests no round has taken yet  callers append, engine
                             (a unit's are counted before they enter)   takes (``_lock``)
    ``_pending``             requests a round took, by name, until a    engine (``_lock``; it
                             response runs or fails them                reads without, the watch
                                                                        with it)
    ``_names``               names in flight on this rank (in a block,  callers add; removed when
                             queued or pending): a duplicate is         run or failed (``_lock``)
                             refused
    ``_round``               the round the engine waits for or runs     engine (``_lock``)
    ``_drained``             ``_round`` has taken its requests, so a    engine (``_lock``)
                             ring must target the round after it
    ``_negotiation``         the latest round this rank found rung as   whoever rings (``_lock``)
                             a negotiation: a negotiation ring for a
                             round up to it is answered already
    ``_forgotten``           the first round whose bell rank 0 has not  engine (its own)
                             released yet
    ``_submitted``           requests queued so far; ``_gather`` stops  callers (``_lock``); the
                             gathering once it stops growing            engine reads without
    ``_peers_joined``        the last negotiation saw a joined rank:    engine, without the lock;
                             counters cannot complete, so units ring    callers read it under it,
                             for a negotiation                          and the engine re-checks
                                                                        its queue after a round
    ``_shutdown_requested``  ``shutdown()`` was called on this rank     callers (``_lock``)
    ``_failure``             why the engine stopped; later submissions  engine, once (``_lock``)
                             raise it
    ``_cache``               negotiated responses and counter keys,     engine in negotiation
                             identical on every rank                    rounds (``_lock``);
                                                                        callers read it under it
    ``_batch``               this thread's open one-round block         each caller its own
                                                                        (thread-local)
    ``_stopped``             the engine thread has ended (ends the      engine (an Event)
                             watch)
    ``_round_since``         when the round in progress started (None   engine, without the lock;
                             between rounds): a round stuck past the    the watch reads it
                             stall shutdown time looks for stopped
                             peers (see liveness)
    =======================  =========================================  ==========================

    Args:
        backend: the collectives of this rank's world.
        knobs: cycle time, fusion threshold, cache capacity, stall times.
        doorbell: the bells shared with every other rank's engine.
        backend_name: the library's name in timeline phases (``GLOO_ALLREDUCE``).
        clock: the monotonic clock that requests are stamped and aged by (stall reports, the
            pending watch, gathering); tests pass one they move by hand.
        peers: every rank's process, by rank, so that a failed collective names the rank that
            died (see :mod:`ringtrain.engine.peers`); empty: the error names none.
    """

    def __init__(self, backend: CollectiveBackend, config: EngineConfig, doorbell: Doorbell,
                 backend_name: str = "GLOO", clock: Callable[[], float] = time.monotonic,
                 peers: Sequence[PeerProcess] = ()):
        self.rank = backend.rank
        self.size = backend.size
        self._backend = backend
        self._doorbell = doorbell
        self._clock = clock
        self._cycle_s = max(config.cycle_time_ms, 0.0) / 1000.0
        self.timeline = Timeline(self.rank)
        self._executor = Executor(backend, config.fusion_threshold_bytes, self.timeline,
                                  backend_name)
        self._cache = ResponseCache(config.cache_capacity)
        self._stall = StallInspector(self.rank, config, clock)
        self._stuck_after_s = config.stall_shutdown_s if config.stall_check_enabled else 0.0
        self._liveness = Liveness(self.rank, self.size, doorbell, clock)
        self._peers = Peers(self.rank, peers)
        self._round_since: float | None = None
        self._lock = threading.Lock()
        self._queue: collections.deque[Request] = collections.deque()
        self._pending: dict[str, Request] = {}
        self._names: set[str] = set()
        self._round = 0  # the next round; every rank counts rounds alike
        self._negotiation = -1  # a negotiation round rung that has not taken this rank's queue
        self._forgotten = 0  # rounds before this one are released from the store
        self._submitted = 0  # requests submitted so far, to see when submissions pause
        self._drained = False  # the current round has taken its requests: news waits for the next
        self._peers_joined = False  # a rank has joined: counters do not reach the member count
        self._shutdown_requested = False
        self._failure: HorovodInternalError | None = None
        self._batch = threading.local()  # requests of this thread's one_round block
        self._readiness = Readiness(self._cache, functools.partial(_reach_store, doorbell.count))
        self._stopped = threading.Event()
        self._caller_blocked = threading.Event()  # a submitter waits for a result: stop gathering
        self._thread = threading.Thread(target=self._run, name="ringtrain-engine", daemon=True)
        self._thread.start()
        self._watch = threading.Thread(target=self._watch_pending, name="ringtrain-pending-watch",
                                       daemon=True)
        self._watch.start()

    # -- the caller's side ----------------------------------------------------------------------

    def submit(self, request: Request) -> None:
        """Queue a request; its handle completes when every rank has run it.

        Raises:
            ValueError: an operation of the same name is already in flight on this rank.
            HorovodInternalError: the engine has stopped (shutdown, peer failure, stall).
        """
        with self._lock:
            if self._failure is not None:
                raise self._failure
            if request.name in self._names:
                raise ValueError(
                    f"an operation named {request.name!r} is already in flight on this rank; "
                    "synchronize() it before submitting that name again, or use another name")
            request.submitted_at = self._clock()  # requests age on the engine's clock
            self._names.add(request.name)
            request.handle.on_block(self._caller_blocked.set)
            batch = getattr(self._batch, "requests", None)
            if batch is not None:
                batch.append(request)  # queued once counted, see one_round
                return
            if not self._queue:
                # Most likely a lone operation (a synchronous collective, or the first of a
                # burst): counted as a unit of one, it costs a store round trip more than a
                # ring, but runs with no control collective, and no peer's engine wakes for it
                # before every member has submitted it (a round that would find it missing
                # there and decide nothing).
                self._queue_unit_locked([request])
                return
            self._queue.append(request)
            self._submitted += 1
            # The rest of a burst: counting each operation would cost a store round trip per
            # tensor; they ring for a negotiation round that gathers and fuses them instead.
            self._ring_locked(NEGOTIATE)

    @contextlib.contextmanager
    def one_round(self) -> Iterator[None]:
        """Submit several requests from this thread as one unit, negotiated in one round.

        On exit the unit is counted once (see :mod:`ringtrain.engine.readiness`) and queued; the
        rank that completes it everywhere rings the unit's own round, which runs it with no
        negotiation. Peers must submit the same unit (the same names) for it to complete; a
        nested block joins the outer one.
        """
        if getattr(self._batch, "requests", None) is not None:
            yield
            return
        self._batch.requests = []
        try:
            yield
        finally:
            batch, self._batch.requests = self._batch.requests, None
            if batch:
                with self._lock:
                    self._queue_unit_locked(batch)

    def _queue_unit_locked(self, batch: list[Request]) -> None:
        if self._failure is not None:
            self._names.difference_update(r.name for r in batch)
            for request in batch:
                request.handle.set_error(self._failure)
            return
        # Counted before the engine can see it: a queued request has always been counted, so a
        # unit's tag rings only once every member's requests are in its queue.
        ring = self._readiness.count(batch)
        self._queue.extend(batch)
        self._submitted += len(batch)
        if self._peers_joined:  # counters cannot complete while a rank submits nothing
            ring = NEGOTIATE
        if ring is not None:
            self._ring_locked(ring)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the engine on every rank; pending operations fail. Idempotent."""
        with self._lock:
            self._shutdown_requested = True
            if self._failure is None:
                self._ring_locked(NEGOTIATE)
            self._caller_blocked.set()  # this thread now waits for the engine
        if threading.current_thread() is not self._thread:
            deadline = time.monotonic() + timeout
            self._thread.join(timeout)
            # The watch ends once the engine has (it waits on _stopped), but may be inside a
            # store call: a daemon thread still in C++ when the interpreter finalizes aborts the
            # process ("terminate called without an active exception", exit 134) after a
            # training run that succeeded.
            if not self._thread.is_alive():
                self._watch.join(max(deadline - time.monotonic(), 0.0))
        self.timeline.stop()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _ring_locked(self, bell: bytes) -> None:
        """Make sure a round with ``bell`` happens soon on every rank (caller holds the lock).

        The first round this rank has not drained yet whose bell is free, or (for a negotiation)
        already a negotiation, gets it.
        """
        round_ = self._round + 1 if self._drained else self._round
        if bell == NEGOTIATE and self._negotiation >= round_:
            return
        while _reach_store(self._doorbell.ring, round_, bell) != bell:
            round_ += 1  # taken by a unit, or (for a unit) by another unit or a negotiation
        if bell == NEGOTIATE:
            self._negotiation = round_

    # -- the background threads -----------------------------------------------------------------

    def _run(self) -> None:
        serialize_this_thread()  # see intraop: a team of this thread's own would fight training
        try:
            while True:
                bell = self._doorbell.wait(self._round, _BELL_WAIT_S)
                if bell is None:
                    continue
                self._round_since = self._clock()
                if bell == NEGOTIATE:
                    self._gather()
                    if self._cycle() is None:
                        break
                else:
                    self._unit_round(bell.decode())
                self._round_since = None
                with self._lock:
                    self._round += 1
                    self._drained = False
                    if self._peers_joined and self._queue:
                        self._ring_locked(NEGOTIATE)
        except HorovodInternalError as exc:  # the stall inspector gave up
            self._fail(exc)
        except Exception as exc:  # a collective failed: a peer died or the network broke
            log.debug("engine stopped by %r", exc)
            dead = self._peers.wait_for_dead()
            cause = (f"because {self._peers.failure_cause(dead)}" if dead else
                     "most likely because another rank failed or exited")
            self._fail(HorovodInternalError(
                f"a collective failed on rank {self.rank}, {cause}: {exc}"))
        finally:
            self._stopped.set()
            self.timeline.stop()

    def _gather(self) -> None:
        """Wait up to one cycle time while this rank keeps submitting.

        Operations submitted one by one arrive moments apart, and what arrives meanwhile is
        negotiated (and fused) in this round instead of the next; a lone operation does not wait
        the whole cycle once submissions have stopped, nor at all once its caller blocks on a
        result (a synchronous collective: nothing more comes from that thread until it is done).
        """
        deadline = self._clock() + self._cycle_s
        seen = self._submitted
        while (remaining := deadline - self._clock()) > 0:
            if self._caller_blocked.wait(min(_QUIET_S, remaining)):
                return
            if self._submitted == seen:
                return
            seen = self._submitted

    def _watch_pending(self) -> None:
        """Ring for a round while requests wait on peers: the round then reports stalls, and a
        collective with a peer that died fails instead of waiting for a bell nobody rings.
        While there is work, beat the heart, and fail a round stuck on a stopped peer."""
        while not self._stopped.wait(_PROBE_S):
            try:
                with self._lock:
                    waiting = list(self._pending.values()) + list(self._queue)
                    if waiting and self._clock() - min(r.submitted_at for r in waiting) > _PROBE_S:
                        self._ring_locked(NEGOTIATE)
                if waiting or self._round_since is not None:
                    _reach_store(self._liveness.beat)
                if self._stuck_on_silent_peers():
                    return
            except HorovodInternalError:
                return

    def _stuck_on_silent_peers(self) -> bool:
        """Fail everything if the round in progress has waited past the stall shutdown time on
        peers that show no sign of life (see liveness); whether it did."""
        since = self._round_since
        if since is None or self._stuck_after_s <= 0:
            self._liveness.forget()
            return False
        waited = self._clock() - since
        if waited < _PROBE_S:
            return False
        silent = _reach_store(self._liveness.silent, self._stuck_after_s)
        if not silent:
            return False
        self._fail(StallError(
            f"rank(s) {silent} stopped responding: no heartbeat for {self._stuck_after_s:g} s "
            f"while rank {self.rank} waited {waited:.1f} s for them in a collective (a process "
            "stopped or frozen, or its host lost); shutting down"))
        return True

    def _cycle(self) -> bool | None:
        """One negotiation round and its execution; None once every rank must stop."""
        with self._lock:
            while self._queue:
                request = self._queue.popleft()
                self._pending[request.name] = request
            shutting_down = self._shutdown_requested
            self._drained = True
            # Callers blocked so far wait for requests this round takes; a later one is news.
            self._caller_blocked.clear()
        if self.timeline.mark_cycles:
            self.timeline.instant(CYCLE_ROW, "CYCLE_START")

        bits = set()
        missed = joined = False
        for request in self._pending.values():
            if request.meta.op is OpType.JOIN:
                joined = True
                continue
            bit = self._cache.lookup(request.meta)
            if bit is None:
                missed = True
            else:
                bits.add(bit)
        counts = [0] * (_FLAGS + len(self._cache))
        counts[_FULL_EXCHANGE] = int(missed or self._stall.wants_report(
            list(self._pending.values())))
        counts[_SHUTDOWN] = int(shutting_down)
        counts[_JOINED] = int(joined)
        for bit in bits:
            counts[_FLAGS + bit] = 1
        summed = torch.tensor(counts, dtype=torch.int32)
        self._backend.control_allreduce(summed)
        summed_list = summed.tolist()

        if summed_list[_SHUTDOWN]:
            self._fail(HorovodInternalError(
                "ringtrain was shut down (hvd.shutdown() was called on "
                f"{summed_list[_SHUTDOWN]} rank(s)); call hvd.init() again to continue"))
            return None
        self._peers_joined = bool(summed_list[_JOINED])
        if summed_list[_FULL_EXCHANGE] or summed_list[_JOINED]:
            decision = self._full_exchange()
        else:
            decision = Decision(responses=[
                self._cache.response(bit) for bit in range(len(self._cache))
                if summed_list[_FLAGS + bit] == self._cache.members(bit)])
            if decision.responses:
                # Run by the counts, not by their readiness counters, which some members may
                # not have added to (their units differ): those counters must start even again.
                self._renew_counters(decision)
        self._execute(decision)
        # After the round's work, not before it: releasing bells is a store round trip per round
        # on rank 0, and no rank waits for it.
        self._forget_rounds()
        return bool(decision.responses) or decision.join_done is not None

    def _unit_round(self, tag: str) -> None:
        """Run this rank's requests counted under ``tag``: every member has them queued, or had
        them run by an earlier round on every rank alike."""
        with self._lock:
            self._drained = True
            unit = [r for r in self._queue if r.counted == tag]
            if unit:
                self._queue = collections.deque(r for r in self._queue if r.counted != tag)
            unit += [r for r in self._pending.values() if r.counted == tag]
            for request in unit:
                self._pending[request.name] = request
            if not self._queue:  # as in a negotiation round: a caller blocked later is news
                self._caller_blocked.clear()
        bits = sorted(self._cache.lookup(r.meta) for r in unit)
        decision = Decision(responses=[self._cache.response(bit) for bit in bits])
        self._execute(decision)
        if decision.responses and len(decision.responses[0].set_ranks) == self.size:
            self._forget_rounds()  # every rank took part in the collective: all are past the bell

    def _forget_rounds(self) -> None:
        """Release the bells of the rounds up to this one, which every rank has read (the caller
        just completed a collective of all ranks in this round)."""
        if self.rank == 0:
            for round_ in range(self._forgotten, self._round + 1):
                self._doorbell.forget(round_)
        self._forgotten = self._round + 1

    def _full_exchange(self) -> Decision:
        now = self._clock()
        metas = [replace(r.meta, age_s=now - r.submitted_at) for r in self._pending.values()]
        decision = negotiation.decide(self._backend.control_allgather(metas))
        self._renew_counters(decision)
        stall_error = self._stall.inspect(decision)
        if stall_error is not None:
            raise stall_error
        return decision

    def _renew_counters(self, decision: Decision) -> None:
        """Record a negotiation round's responses in the cache, which gives their names fresh
        readiness counters (on every rank alike: the decision is); waiting requests whose unit's
        counter changed count again. Before the handles complete: a name submitted again must
        count on its new counter."""
        with self._lock:
            for response in decision.responses:
                self._cache.put(response)
            decided = {response.name for response in decision.responses}
            waiting = [r for r in (*self._pending.values(), *self._queue) if r.name not in decided]
            for ring in self._readiness.recount(waiting):
                self._ring_locked(ring)

    def _execute(self, decision: Decision) -> None:
        local: dict[str, Request] = {}
        decided_at = self._clock()
        with self._lock:
            for response in decision.responses:
                request = self._pending.pop(response.name, None)
                if request is not None:
                    local[response.name] = request
                    self._names.discard(response.name)
        if self.timeline.active:
            for request in local.values():
                self.timeline.span(request.name, f"NEGOTIATE_{request.meta.op.value.upper()}",
                                   request.submitted_at, decided_at)
        try:
            self._executor.run(decision.responses, local)
        except BaseException:
            # The collective failed (a peer died): its requests are no longer pending, and must
            # fail with the rest rather than leave their callers waiting.
            with self._lock:
                self._pending.update((n, r) for n, r in local.items() if not r.handle.done())
            raise
        if decision.join_done is not None:
            self._complete_join(decision.join_done)

    def _complete_join(self, last_rank: int) -> None:
        with self._lock:
            joins = [n for n, r in self._pending.items() if r.meta.op is OpType.JOIN]
            requests = [self._pending.pop(n) for n in joins]
            self._names.difference_update(joins)
        for request in requests:
            request.handle.set_result(last_rank)

    def _fail(self, error: HorovodInternalError) -> None:
        with self._lock:
            if self._failure is None:
                self._failure = error
            requests = list(self._pending.values()) + list(self._queue)
            self._pending.clear()
            self._queue.clear()
            self._names.clear()
        for request in requests:
            request.handle.set_error(self._failure)


def _reach_store(call, *args):
    """``call(*args)`` on the rendezvous store, whose loss means a peer (its host) died."""
    try:
        return call(*args)
    except Exception as exc:
        raise HorovodInternalError(
            f"cannot reach the job's rendezvous store; another rank or the launcher has "
            f"probably exited: {exc}") from exc
