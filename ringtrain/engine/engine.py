"""The engine: one per process; queues named operations and runs them in agreement with every
other rank, in rounds (see :mod:`ringtrain.engine.round_runner` and docs/engine.md).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from ringtrain.backends.base import CollectiveBackend
from ringtrain.engine.config import EngineConfig
from ringtrain.engine.doorbell import NEGOTIATE, Doorbell
from ringtrain.engine.express import Express
from ringtrain.engine.handle import Handle
from ringtrain.engine.liveness import Liveness
from ringtrain.engine.peers import PeerProcess
from ringtrain.engine.request import Request
from ringtrain.engine.round_runner import RoundRunner
from ringtrain.engine.watch import PendingWatch
from ringtrain.op_types import OpType


class _Batch(threading.local):
    """The requests of a thread's one_round block, while in one (a class default: a missing
    attribute of a thread-local costs an exception on every look)."""

    requests: list[Request] | None = None


class Engine:
    """Queues named requests and runs them in agreement with every other rank.

    This class is the callers' side (submit, wait, close a :meth:`one_round` block, shut down);
    the threads and the records they share: docs/engine.md, "The engine's parts".

    Args:
        backend_name: the library's name in timeline phases (``GLOO_ALLREDUCE``).
        clock: the monotonic clock that requests are stamped and aged by (stall reports, the
            pending watch, gathering); tests pass one they move by hand.
        peers: every rank's process, by rank, so that a failed collective names the rank that
            died (see :mod:`ringtrain.engine.peers`); empty: the error names none.
        inline: a caller's synchronous lone cached operation may run in the caller's own thread
            while the engine is idle (see :mod:`ringtrain.engine.turn`).
    """

    def __init__(self, backend: CollectiveBackend, config: EngineConfig, doorbell: Doorbell,
                 backend_name: str = "GLOO", clock: Callable[[], float] = time.monotonic,
                 peers: Sequence[PeerProcess] = (), inline: bool = False):
        self._runner = runner = RoundRunner(backend, config, doorbell, backend_name, clock, peers,
                                            inline)
        self.rank, self.size, self.timeline = runner.rank, runner.size, runner.timeline
        self._backend, self._doorbell, self._clock = backend, doorbell, clock
        self._executor, self._cache, self._readiness = (runner.executor, runner.cache,
                                                         runner.readiness)
        self._backlog, self._rounds, self._waits, self._turn = (runner.backlog, runner.rounds,
                                                                runner.waits, runner.turn)
        self._batch = _Batch()
        self._express = Express(runner, self)
        self._watch = PendingWatch(self.rank, self._backlog, self._rounds,
                                   Liveness(self.rank, self.size, doorbell, clock), clock,
                                   config.stall_shutdown_s if config.stall_check_enabled else 0.0,
                                   runner.stopped)
        self._thread = threading.Thread(target=runner.run, name="ringtrain-engine", daemon=True)
        self._thread.start()
        self._watch_thread = threading.Thread(target=self._watch.run,
                                              name="ringtrain-pending-watch", daemon=True)
        self._watch_thread.start()

    def submit(self, request: Request, synchronous: bool = False) -> None:
        """Queue a request; its handle completes when every rank has run it.

        ``synchronous``: the caller waits for the result at once (``hvd.allreduce_``), so a lone
        cached request may run in this thread, during this call (see :mod:`ringtrain.engine.turn`;
        a lone allreduce of one CPU tensor: :mod:`ringtrain.engine.express`).

        Raises:
            ValueError: an operation of the same name and process set is already in flight on
                this rank.
            HorovodInternalError: the engine has stopped (shutdown, peer failure, stall).
        """
        if (synchronous and self._batch.requests is None
                and self._express.run(request)):
            return
        claimed = None
        backlog = self._backlog
        # The engine woken by a ring here needs the lock first thing: wake it once it is free.
        with self._doorbell.deferring_wakes(), backlog.lock:
            backlog.add(request, self._clock())  # requests age on the engine's clock
            request.handle.observe(self)
            self._waits.submitted()
            batch = self._batch.requests
            if batch is not None:
                batch.append(request)  # queued once counted, see one_round
                return
            if not backlog.queue and request.key not in backlog.wanted_by_peers:
                # Most likely a lone operation: counted as a unit of one (docs/engine.md, "A
                # lone request is a unit of one").
                claimed = self._claim_locked(request) if synchronous else None
                self._queue_unit_locked([request])
                if claimed is not None and not self._turn.claimed(request.counted):
                    self._turn.give_back(wake=True)  # not counted as claimed: the engine runs it
                    claimed = None
            else:
                backlog.queue.append(request)
                backlog.submitted += 1
                # The rest of a burst, gathered and fused by a negotiation round; so is a name a
                # peer offered uncounted (counted alone here, its counter would never complete).
                backlog.wanted_by_peers.discard(request.key)
                self._rounds.ring(NEGOTIATE)
        if claimed is not None:
            self._run_claimed(request, claimed)

    def _claim_locked(self, request: Request) -> int | None:
        """Take the turn for the round this lone synchronous request, about to be counted, may
        run in, if its caller may run it itself; the round, or None (the engine runs it)."""
        backlog = self._backlog
        if (not self._turn.callers_may_run or backlog.queue or backlog.pending
                or self._rounds.drained or backlog.peers_joined or backlog.failure is not None
                or request.meta.op is OpType.JOIN
                # CUDA tensors keep to the engine thread and the streams it set up.
                or request.meta.on_cuda):
            return None
        bit = self._cache.lookup(request.meta)
        round_ = self._rounds.current
        if bit is None or not self._turn.claim(round_, self._cache.counter_key(bit)):
            return None
        return round_

    def _run_claimed(self, request: Request, round_: int) -> None:
        """Run ``round_`` in this thread if its bell is ``request``'s unit, or leave it to the
        engine. Not noted as a wait (deadlock detection): only a round reads that, and none runs
        on this rank while this thread holds the turn; one that gives the round back waits on
        the handle, noted, as any caller."""
        # counted: see the claim
        self._turn.run_claimed(round_, (request.counted or "").encode(), self._runner.run_claimed)

    def submitting_for_autograd(self) -> contextlib.AbstractContextManager[None]:
        """Mark this thread's submissions in the block as made by autograd's gradient hooks: on
        behalf of a thread inside ``backward()``, so not ones whose waits decide whether the rank
        is blocked (see :mod:`ringtrain.engine.waits`)."""
        return self._waits.submitting_for_autograd()

    def waiting(self, handle: Handle, untimed: bool) -> None:
        """A thread blocks on ``handle`` (see :class:`~ringtrain.engine.handle.WaitObserver`)."""
        with self._backlog.lock:
            if not self._backlog.caller_blocked.is_set():
                self._backlog.caller_blocked.set()  # nothing more from that thread: stop gathering
            if untimed:
                self._waits.began(handle)

    def done_waiting(self, handle: Handle, untimed: bool) -> None:
        """That thread stopped waiting on ``handle``."""
        if untimed:
            with self._backlog.lock:
                self._waits.ended(handle)

    @contextlib.contextmanager
    def one_round(self) -> Iterator[None]:
        """Submit several requests from this thread as one unit, run in one round.

        On exit the unit is counted once (see :mod:`ringtrain.engine.readiness`) and queued.
        Peers must submit the same unit (the same names) for it to complete; a nested block
        joins the outer one.
        """
        if self._batch.requests is not None:
            yield
            return
        self._batch.requests = []
        try:
            yield
        finally:
            batch, self._batch.requests = self._batch.requests, None
            if batch:
                with self._doorbell.deferring_wakes(), self._backlog.lock:
                    self._queue_unit_locked(batch)

    def _queue_unit_locked(self, batch: list[Request]) -> None:
        backlog = self._backlog
        if backlog.failure is not None:
            backlog.keys.difference_update(r.key for r in batch)
            for request in batch:
                request.handle.set_error(backlog.failure)
            return
        # Counted before the engine can see it: a queued request has always been counted, so a
        # unit's tag rings only once every member's requests are in its queue. The count and
        # the ring it may complete share one hold of the doorbell's lock, which the peers'
        # counts wait for: what can be worked out before it, is.
        unit = self._readiness.unit(batch)
        with self._doorbell.holding():
            ring = self._readiness.count_unit(batch, unit)
            if backlog.peers_joined:  # counters cannot complete while a rank submits nothing
                ring = NEGOTIATE
            if ring is not None:
                self._rounds.ring(ring)
        backlog.queue.extend(batch)
        backlog.submitted += len(batch)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the engine on every rank; pending operations fail. Idempotent."""
        with self._backlog.lock:
            self._backlog.shutdown_requested = True
            if self._backlog.failure is None:
                self._rounds.ring(NEGOTIATE)
            self._backlog.caller_blocked.set()  # this thread now waits for the engine
        if threading.current_thread() is not self._thread:
            deadline = time.monotonic() + timeout
            self._thread.join(timeout)
            # The watch ends once the engine has (it waits on ``stopped``), but may be inside a
            # store call: a daemon thread still in C++ when the interpreter finalizes aborts the
            # process ("terminate called without an active exception", exit 134) after a
            # training run that succeeded.
            if not self._thread.is_alive():
                self._watch_thread.join(max(deadline - time.monotonic(), 0.0))
        self.timeline.stop()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def set_cycle_time(self, cycle_time_ms: float) -> None:
        """Change how long a negotiation round gathers (the cycle time) from the next round on.
        Safe at any moment: it only paces this rank's rounds, peers need not agree on it.

        Raises:
            ValueError: a negative time.
        """
        if cycle_time_ms < 0:
            raise ValueError(f"cycle time must not be negative, got {cycle_time_ms}")
        self._runner.gather_s = cycle_time_ms / 1000.0
