"""The express round: a cached lone allreduce agreed on and run in its caller's thread.

On one host, once every rank's response cache holds an operation, agreeing on it is a few
shared-memory flag updates: its caller takes the turn, claims the round its engine waits for,
counts the operation as a unit of one (the last member to count rings the unit's tag), reads the
round's bell and, if it is that tag, runs the collective itself (docs/engine.md, "The express
round"). These steps are the general ones of :class:`~ringtrain.engine.engine.Engine` and
:class:`~ringtrain.engine.round_runner.RoundRunner`, laid out in one pass for the common case
(one CPU tensor, not Adasum): a lone small allreduce costs its Python, and the general form's
choices (units of several requests, responses, fusion plans, batches) are most of it.
"""

from __future__ import annotations

import functools

from ringtrain.engine.doorbell import NEGOTIATE, reach_store
from ringtrain.engine.handle import WaitObserver
from ringtrain.engine.request import Request
from ringtrain.engine.round_runner import RoundRunner
from ringtrain.op_types import OpType, ReduceOp


class Express:
    """Runs a synchronous cached lone allreduce in its caller's thread when it can.

    Args:
        runner: the engine's round runner, whose parts (backlog, rounds, turn, cache, doorbell,
            executor) the express round uses as a round of the engine thread would.
        observer: told when the caller blocks on the handle (when the engine runs it after all).
    """

    def __init__(self, runner: RoundRunner, observer: WaitObserver):
        self._runner = runner
        self._observer = observer
        self._backlog, self._rounds, self._turn = runner.backlog, runner.rounds, runner.turn
        self._cache, self._readiness, self._waits = runner.cache, runner.readiness, runner.waits
        self._executor, self._timeline = runner.executor, runner.timeline
        self._doorbell, self._clock, self._size = runner.doorbell, runner.clock, runner.size

    def run(self, request: Request) -> bool:
        """Submit ``request``, whose caller waits for it at once, and run it in this thread if
        its round's bell is its own; whether it was submitted (its handle completes here, or
        later on the engine thread, which runs any other bell first). False: nothing was done,
        it needs the general path (not a lone cached allreduce of one CPU tensor, or the engine
        is not idle).

        Raises:
            ValueError: an operation of the same name and process set is in flight here.
            HorovodInternalError: the engine has stopped, or the doorbell cannot be reached.
        """
        meta = request.meta
        turn = self._turn
        if (meta.op is not OpType.ALLREDUCE or meta.reduce_op is ReduceOp.ADASUM
                or len(request.outputs) != 1 or meta.on_cuda or not turn.callers_may_run
                or not turn.lock.acquire(blocking=False)):
            return False
        try:
            queued = self._queue(request)
        except BaseException:
            # Without a wake, which would take the doorbell's lock again (held by a stopped
            # rank?): the engine thread reads the bell within a second anyway.
            turn.give_back(wake=False)
            raise
        if queued is None:
            turn.lock.release()
            return False
        round_, bit = queued
        # counted: see _queue
        turn.run_claimed(round_, request.counted.encode(),  # type: ignore[union-attr]
                         functools.partial(self._run, request, bit))
        return True

    def _queue(self, request: Request) -> tuple[int, int] | None:
        """Count and queue ``request`` if the engine is idle and has it cached, and claim the
        round it may run in: that round and the request's cache bit, or None."""
        backlog, rounds, cache, doorbell = self._backlog, self._rounds, self._cache, self._doorbell
        with backlog.lock:
            if (backlog.queue or backlog.pending or rounds.drained or backlog.peers_joined
                    or backlog.failure is not None or request.key in backlog.wanted_by_peers):
                return None
            bit = cache.lookup(request.meta)
            if bit is None:
                return None
            backlog.add(request, self._clock())
            request.handle.observe(self._observer)
            self._waits.submitted()
            key, round_ = cache.counter_key(bit), rounds.current
            try:
                # The claim before the count: the ring that completes the count then finds
                # every rank's claim, and wakes only the callers.
                reach_store(doorbell.claim, round_, key)
                with doorbell.holding():
                    unit = (key, len(request.meta.set_ranks))  # as Readiness.unit has it
                    ring = self._readiness.count_unit([request], unit)
                    if ring is not None:
                        rounds.ring(ring)
            except BaseException:
                backlog.keys.discard(request.key)
                raise
            # Counted before it is queued, as every unit (Engine._queue_unit_locked).
            backlog.queue.append(request)
            backlog.submitted += 1
        return round_, bit

    def _run(self, request: Request, bit: int, bell: bytes) -> None:
        """The claimed round, its bell ``request``'s tag: run ``request`` and finish the round
        (in the thread that holds the turn). A failure fails the engine, as on its thread."""
        try:
            self._round(request, bit, bell)
        except BaseException as exc:
            self._runner.fail(exc)

    def _round(self, request: Request, bit: int, bell: bytes) -> None:
        rounds, backlog = self._rounds, self._backlog
        now = self._clock()
        rounds.start(now, bell)
        with backlog.lock:
            rounds.drained = True
            backlog.take_running(request)  # the bell is its tag: the claimed unit is this one
        if self._timeline.active:
            self._timeline.span(request.name, "NEGOTIATE_ALLREDUCE", request.submitted_at, now)
        response = self._cache.response(bit)  # the cache changes only in rounds: it is bit's
        try:
            self._executor.run_lone_allreduce(response, request)
        except BaseException:
            with backlog.lock:  # as a round's failure: fails with the rest rather than wait
                if not request.handle.done():
                    backlog.pending[request.key] = request
            raise
        if len(response.set_ranks) == self._size:
            rounds.forget()
        with backlog.lock:
            rounds.finish()
            if backlog.peers_joined and backlog.queue:
                rounds.ring(NEGOTIATE)
