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

A round is run by whichever thread holds the engine's *turn*: normally the engine thread, but a
caller that submits a cached operation on its own and waits for it at once (``hvd.allreduce_``)
while the engine is idle takes the turn itself. It counts the operation, waits for the next
round's bell and, if the bell is that operation's tag, runs the unit round in its own thread: no
hand-off to the engine thread and back. Any other bell (a negotiation, another unit) and the
caller gives the turn back and waits for its handle as usual. Which thread runs a round changes
nothing that peers see: the bell alone decides what every rank runs in it.
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
from typing import Any

import torch

from ringtrain.backends.base import CollectiveBackend
from ringtrain.engine import deadlock, negotiation
from ringtrain.engine.config import EngineConfig
from ringtrain.engine.doorbell import NEGOTIATE, Doorbell
from ringtrain.engine.execute import Executor
from ringtrain.engine.handle import Handle
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

#: The control vector of a negotiation round: these flags, then one wait-state slot per rank
#: (see ``_wait_slot_locked``), then one count per cached response.
_FULL_EXCHANGE, _SHUTDOWN, _JOINED, _PROBE, _FLAGS = 0, 1, 2, 3, 4
#: The engine waits this long for the doorbell before checking again that it should go on;
#: rounds only start when a rank rings.
_BELL_WAIT_S = 3600.0
#: An engine whose callers may run rounds themselves checks this often whether one of them
#: failed it (a collective of theirs found a peer dead): nobody rings for that.
_INLINE_BELL_WAIT_S = 1.0
#: A caller running its own round waits for its bell in slices this long (a signal handler runs
#: between them), and gives the round back to the engine after this long in all: by then the
#: pending watch has rung a negotiation for it, which the engine runs (stall reports, deadlock
#: checks).
_INLINE_SLICE_S = 0.2
_INLINE_GIVE_UP_S = 3.0
#: A pause in submissions this long ends a round's gathering before the cycle time is up.
_QUIET_S = 0.0002
#: How often requests waiting on peers trigger a round (liveness and stall checks).
_PROBE_S = 1.0
#: A rank blocked in the same wait since the previous round asks for a deadlock check at least
#: this often, even when the members it waits for do not all look blocked.
_DEADLOCK_PROBE_S = 5.0


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
    ``_negotiating``         the round in progress is a negotiation:    engine, without the lock;
                             once drained, the watch leaves the         the watch reads it
                             requests it took to it
    ``_waiters``             threads blocked with no timeout on a       callers, entering and
                             handle, with how many such waits each      leaving waits (``_lock``)
    ``_awaited``             handles such threads are blocked on        callers (``_lock``)
    ``_submitters``          threads that submitted (not from autograd  callers (``_lock``); the
                             hooks): all must wait for the rank to      engine prunes dead ones
                             count as blocked
    ``_wait_state``          bumped by every submission and every       callers (``_lock``)
                             change of waits: an unchanged value means
                             nothing happened on this rank
    ``_prev_slots``          every rank's wait state in the previous    engine (its own)
                             negotiation round (identical everywhere)
    ``_wanted_by_peers``     names a peer offered in the last            engine (``_lock``); a
                             negotiation round that this rank had not   caller's submission
                             submitted: submitting one rings for a      removes its name
                             negotiation, never counts it alone
    ``_turn``                held by the thread that runs a round (the  engine or a caller (a
                             engine, or a caller running its own), so   Lock of its own; callers
                             rounds run one at a time, in order         take it only when free)
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
        inline: a caller's synchronous lone cached operation may run in the caller's own thread
            while the engine is idle (see the module's docstring); off, every round runs on the
            engine thread.
    """

    def __init__(self, backend: CollectiveBackend, config: EngineConfig, doorbell: Doorbell,
                 backend_name: str = "GLOO", clock: Callable[[], float] = time.monotonic,
                 peers: Sequence[PeerProcess] = (), inline: bool = False):
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
        # --no-stall-check (HOROVOD_STALL_CHECK_DISABLE) turns deadlock detection off too: this
        # rank then never counts as blocked, so nobody waiting for it is taken for deadlocked.
        self._detect_deadlocks = config.stall_check_enabled
        self._liveness = Liveness(self.rank, self.size, doorbell, clock)
        self._peers = Peers(self.rank, peers)
        self._round_since: float | None = None
        self._negotiating = False  # the round in progress is a negotiation
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
        self._wanted_by_peers: set[str] = set()
        self._shutdown_requested = False
        self._failure: HorovodInternalError | None = None
        self._batch = threading.local()  # requests of this thread's one_round block
        self._readiness = Readiness(self._cache, functools.partial(_reach_store, doorbell.count),
                                    functools.partial(_reach_store, doorbell.read))
        self._stopped = threading.Event()
        self._caller_blocked = threading.Event()  # a submitter waits for a result: stop gathering
        self._waiters: dict[int, int] = {}
        self._awaited: dict[Handle, int] = {}
        self._submitters: dict[int, threading.Thread] = {}
        self._for_autograd = threading.local()  # submissions from autograd's hooks
        self._wait_state = 0
        self._prev_slots: list[int] | None = None
        self._last_probe = float("-inf")
        self._inline = inline
        self._turn = threading.Lock()
        self._claimed_key = ""  # the counter key of the unit the turn's holder claimed
        self._thread = threading.Thread(target=self._run, name="ringtrain-engine", daemon=True)
        self._thread.start()
        self._watch = threading.Thread(target=self._watch_pending, name="ringtrain-pending-watch",
                                       daemon=True)
        self._watch.start()

    # -- the caller's side ----------------------------------------------------------------------

    def submit(self, request: Request, synchronous: bool = False) -> None:
        """Queue a request; its handle completes when every rank has run it.

        ``synchronous``: the calling thread waits for the result right after submitting
        (``hvd.allreduce_``), so a lone cached request may run in this thread, during this call,
        instead of on the engine thread (see the module's docstring).

        Raises:
            ValueError: an operation of the same name is already in flight on this rank.
            HorovodInternalError: the engine has stopped (shutdown, peer failure, stall).
        """
        claimed = None
        # The engine woken by a ring here needs the lock first thing: wake it once it is free.
        with self._doorbell.deferring_wakes(), self._lock:
            if self._failure is not None:
                raise self._failure
            if request.name in self._names:
                raise ValueError(
                    f"an operation named {request.name!r} is already in flight on this rank; "
                    "synchronize() it before submitting that name again, or use another name")
            request.submitted_at = self._clock()  # requests age on the engine's clock
            self._names.add(request.name)
            request.handle.observe(self)
            self._wait_state += 1
            if not getattr(self._for_autograd, "active", False):
                self._submitters[threading.get_ident()] = threading.current_thread()
            batch = getattr(self._batch, "requests", None)
            if batch is not None:
                batch.append(request)  # queued once counted, see one_round
                return
            if not self._queue and request.name not in self._wanted_by_peers:
                # Most likely a lone operation (a synchronous collective, or the first of a
                # burst): counted as a unit of one, it costs a store round trip more than a
                # ring, but runs with no control collective, and no peer's engine wakes for it
                # before every member has submitted it (a round that would find it missing
                # there and decide nothing).
                claimed = self._claim_locked(request) if synchronous else None
                self._queue_unit_locked([request])
                if claimed is not None and not (request.counted or "").startswith(
                        f"{self._claimed_key}@"):
                    self._unclaim(wake=True)  # not counted as claimed: the engine runs it
                    claimed = None
            else:
                self._queue.append(request)
                self._submitted += 1
                # The rest of a burst: counting each operation would cost a store round trip
                # per tensor; they ring for a negotiation round that gathers and fuses them.
                # A name a peer offered uncounted is negotiated too: counted alone here, its
                # counter would never reach the member count and nobody would ring for it.
                self._wanted_by_peers.discard(request.name)
                self._ring_locked(NEGOTIATE)
        if claimed is not None:
            self._run_claimed(request, claimed)

    def _claim_locked(self, request: Request) -> int | None:
        """Take the turn for the round this lone synchronous request, about to be counted, may
        run in, if its caller may run it itself; the round, or None (the engine runs it).
        Claimed before counting: the peer whose count completes the unit rings it knowing that
        this rank's engine need not wake. Caller holds the lock."""
        if (not self._inline or self._queue or self._pending or self._drained
                or self._peers_joined or self._failure is not None or request.meta.op is OpType.JOIN
                # CUDA tensors keep to the engine thread and the streams it set up.
                or any(t.device != "cpu" for t in request.meta.tensors)):
            return None
        bit = self._cache.lookup(request.meta)
        if bit is None or not self._turn.acquire(blocking=False):
            return None
        # With the turn free the engine is between rounds, waiting for ``_round``'s bell.
        self._claimed_key = self._cache.counter_key(bit)
        _reach_store(self._doorbell.claim, self._round, self._claimed_key)
        return self._round

    def _unclaim(self, wake: bool) -> None:
        """Give the turn back; ``wake``: wake the engine, which a ring may have spared."""
        try:
            _reach_store(self._doorbell.unclaim, wake)
        finally:
            self._turn.release()

    def _run_claimed(self, request: Request, round_: int) -> None:
        """Run ``round_`` in this thread if its bell is ``request``'s unit; otherwise give the
        turn back to the engine, which runs it (and ``request`` in its own round). This thread
        holds the turn; it counts as blocked on the request (deadlock detection) meanwhile."""
        handle = request.handle
        tag = (request.counted or "").encode()  # counted: _claim_locked checked
        self.waiting(handle, True)
        ran = False
        try:
            if self._claimed_bell(round_, tag):
                ran = True
                self._run_round_inline(tag)
        except HorovodInternalError as exc:  # the doorbell's (its lock held by a stopped rank)
            self._fail(exc)  # as on the engine thread; the handle now holds the error
        finally:
            self._unclaim(wake=not ran)
            self.done_waiting(handle, True)

    def _claimed_bell(self, round_: int, tag: bytes) -> bool:
        """Wait for the claimed round's bell: whether it is the claimed unit's (False when
        another bell came, the engine failed, or the wait went on too long: the engine then
        runs the round)."""
        give_up = time.monotonic() + _INLINE_GIVE_UP_S
        while self._failure is None:
            left = give_up - time.monotonic()
            if left <= 0:
                break
            bell = self._doorbell.wait(round_, min(_INLINE_SLICE_S, left), claimed=True)
            if bell is not None:
                return bell == tag
        return False

    def _run_round_inline(self, tag: bytes) -> None:
        """Run the claimed unit round in this thread (holding the turn). A failed collective
        fails the engine as it would on the engine thread, naming the rank that died."""
        try:
            self._run_round(tag)
        except HorovodInternalError as exc:
            self._fail(exc)
        except Exception as exc:  # a peer died or the network broke
            self._fail(self._collective_failure(exc))
        except BaseException as exc:
            # A signal handler raised inside the collective (Ctrl-C): this rank's part of it is
            # lost, and so is its place in the sequence of rounds.
            self._fail(HorovodInternalError(
                f"rank {self.rank} was interrupted ({exc!r}) in the middle of a collective; "
                "call hvd.init() again to continue"))
            raise

    @contextlib.contextmanager
    def submitting_for_autograd(self) -> Iterator[None]:
        """Mark this thread's submissions in the block as made by autograd's gradient hooks.

        Autograd runs hooks on its own device threads (CUDA) on behalf of a thread inside
        ``backward()``; such a thread is not one whose waits decide whether the rank is blocked
        (see :mod:`ringtrain.engine.deadlock`), since it only submits while another thread
        computes.
        """
        previous = getattr(self._for_autograd, "active", False)
        self._for_autograd.active = True
        try:
            yield
        finally:
            self._for_autograd.active = previous

    def waiting(self, handle: Handle, untimed: bool) -> None:
        """A thread blocks on ``handle`` (see :class:`~ringtrain.engine.handle.WaitObserver`)."""
        with self._lock:
            if not self._caller_blocked.is_set():
                self._caller_blocked.set()  # nothing more comes from that thread: stop gathering
            if untimed:
                ident = threading.get_ident()
                self._waiters[ident] = self._waiters.get(ident, 0) + 1
                self._awaited[handle] = self._awaited.get(handle, 0) + 1
                self._wait_state += 1

    def done_waiting(self, handle: Handle, untimed: bool) -> None:
        """That thread stopped waiting on ``handle``."""
        if not untimed:
            return
        with self._lock:
            ident = threading.get_ident()
            # Any: one table is keyed by thread ids, the other by handles
            tables: tuple[tuple[dict[Any, int], Any], ...] = (
                (self._waiters, ident), (self._awaited, handle))
            for table, key in tables:
                left = table.get(key, 0) - 1
                if left > 0:
                    table[key] = left
                else:
                    table.pop(key, None)
            self._wait_state += 1

    def _wait_slot_locked(self) -> tuple[int, set[str]]:
        """This rank's wait state for the control vector, and the names its threads wait for.

        The slot is 0 unless the rank is blocked: some thread waits with no timeout for a
        pending request, and every live thread that submits operations is waiting too. Then it
        is ``_wait_state`` (plus one, never 0), so that a peer sees whether anything happened
        on this rank between two rounds.
        """
        awaited = {r.name for r in self._pending.values() if r.handle in self._awaited}
        if not awaited or not self._detect_deadlocks:
            return 0, awaited
        for ident, thread in list(self._submitters.items()):
            if not thread.is_alive():
                del self._submitters[ident]
            elif ident not in self._waiters:
                return 0, awaited
        return (self._wait_state & 0x3FFFFFFF) + 1, awaited

    def _wants_deadlock_check(self, slot: int, awaited: set[str]) -> bool:
        """Whether this rank asks the round for a deadlock check: it is blocked in the same
        wait as in the previous round, and every member of a set it waits on was blocked then
        too (or it has not asked for a while)."""
        prev = self._prev_slots
        if not slot or prev is None or prev[self.rank] != slot:
            return False
        now = self._clock()
        members = [self._pending[name].meta.set_ranks for name in awaited]
        if (any(all(prev[m] for m in ranks) for ranks in members)
                or now - self._last_probe >= _DEADLOCK_PROBE_S):
            self._last_probe = now
            return True
        return False

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
                with self._doorbell.deferring_wakes(), self._lock:
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

    def set_cycle_time(self, cycle_time_ms: float) -> None:
        """Change the time between cycles from the next cycle on (autotuning). Safe at any
        moment: the cycle time only paces this rank's engine, peers need not agree on it.

        Raises:
            ValueError: a negative time.
        """
        if cycle_time_ms < 0:
            raise ValueError(f"cycle time must not be negative, got {cycle_time_ms}")
        self._cycle_s = cycle_time_ms / 1000.0

    # -- the background threads -----------------------------------------------------------------

    def _run(self) -> None:
        serialize_this_thread()  # see intraop: a team of this thread's own would fight training
        bell_wait_s = _INLINE_BELL_WAIT_S if self._inline else _BELL_WAIT_S
        try:
            while self._failure is None:
                # Read afresh: callers may have run rounds while this thread slept (their
                # claims spare it the wake-up), and a bell that old may have been reused.
                round_ = self._round
                bell = self._doorbell.wait(round_, bell_wait_s)
                if bell is None:
                    continue
                with self._turn:
                    if self._failure is not None:
                        break
                    if self._round != round_:  # a caller ran that round itself
                        continue
                    if not self._run_round(bell):
                        break
        except HorovodInternalError as exc:  # the stall inspector gave up
            self._fail(exc)
        except Exception as exc:  # a collective failed: a peer died or the network broke
            self._fail(self._collective_failure(exc))
        finally:
            self._stopped.set()
            self.timeline.stop()

    def _run_round(self, bell: bytes) -> bool:
        """Run round ``_round`` (its bell read) and move on to the next; False once every rank
        must stop. The calling thread holds the turn."""
        self._round_since = self._clock()
        self._negotiating = bell == NEGOTIATE
        if bell == NEGOTIATE:
            self._gather()
            if self._cycle() is None:
                return False
        else:
            self._unit_round(bell.decode())
        self._round_since = None
        self._negotiating = False
        with self._lock:
            self._round += 1
            self._drained = False
            if self._peers_joined and self._queue:
                self._ring_locked(NEGOTIATE)
        return True

    def _collective_failure(self, exc: BaseException) -> HorovodInternalError:
        """The error a failed collective fails the engine with, naming the rank that died."""
        log.debug("engine stopped by %r", exc)
        dead = self._peers.wait_for_dead()
        cause = (f"because {self._peers.failure_cause(dead)}" if dead else
                 "most likely because another rank failed or exited")
        return HorovodInternalError(f"a collective failed on rank {self.rank}, {cause}: {exc}")

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
                    # Not while a negotiation round that took every waiting request runs: it
                    # decides them, and a ring now would add a round after it in which this
                    # rank might offer its peers' next submissions before they make them (a
                    # round that splits what one round would have fused); the next probe rings
                    # for whatever still waits.
                    decided_now = self._negotiating and self._drained and not self._queue
                    if (waiting and not decided_now
                            and self._clock() - min(r.submitted_at for r in waiting) > _PROBE_S):
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
                request.offered_round = self._round
                self._pending[request.name] = request
            shutting_down = self._shutdown_requested
            self._drained = True
            # Callers blocked so far wait for requests this round takes; a later one is news.
            self._caller_blocked.clear()
            slot, awaited = self._wait_slot_locked()
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
        bits_at = _FLAGS + self.size
        counts = [0] * (bits_at + len(self._cache))
        counts[_FULL_EXCHANGE] = int(missed or self._stall.wants_report(
            list(self._pending.values())))
        counts[_SHUTDOWN] = int(shutting_down)
        counts[_JOINED] = int(joined)
        counts[_PROBE] = int(self._wants_deadlock_check(slot, awaited))
        counts[_FLAGS + self.rank] = slot
        for bit in bits:
            counts[bits_at + bit] = 1
        summed = torch.tensor(counts, dtype=torch.int32)
        self._backend.control_allreduce(summed)
        summed_list = summed.tolist()
        slots = summed_list[_FLAGS:bits_at]
        prev_slots, self._prev_slots = self._prev_slots, slots

        if summed_list[_SHUTDOWN]:
            self._fail(HorovodInternalError(
                "ringtrain was shut down (hvd.shutdown() was called on "
                f"{summed_list[_SHUTDOWN]} rank(s)); call hvd.init() again to continue"))
            return None
        self._peers_joined = bool(summed_list[_JOINED])
        if summed_list[_FULL_EXCHANGE] or summed_list[_JOINED] or summed_list[_PROBE]:
            # Ranks blocked in the same wait in both rounds cannot have submitted anything
            # in between: only they count as blocked for deadlock detection.
            blocked = [r for r, s in enumerate(slots)
                       if s and prev_slots is not None and prev_slots[r] == s]
            decision = self._full_exchange(awaited, blocked)
        else:
            decision = Decision(responses=[
                self._cache.response(bit) for bit in range(len(self._cache))
                if summed_list[bits_at + bit] == self._cache.members(bit)])
            if decision.responses:
                # Run by the counts, not by their readiness counters, which some members may
                # not have added to (their units differ): those counters must start even again.
                self._renew_counters(decision)
        self._note_wanted(decision, summed_list[bits_at:], bits)
        self._execute(decision)
        # After the round's work, not before it: releasing bells is a store round trip per round
        # on rank 0, and no rank waits for it.
        self._forget_rounds()
        return bool(decision.responses) or decision.join_done is not None

    def _note_wanted(self, decision: Decision, offered: list[int], mine: set[int]) -> None:
        """Remember the operations peers offered in this round that this rank has not submitted.

        A peer that offered one uncounted (the rest of its burst) rang for this round, which
        leaves it waiting; submitted here later, it must ring for a negotiation too, or nothing
        rings for it (its readiness counter can no longer complete). One submitted while this
        round ran, and counted without completing its counter, rings now. A name leaves the set
        when its operation runs here (see :meth:`_execute`), or with the next negotiation.
        """
        if decision.waiting:  # a full exchange says who is missing
            wanted = {name for name, w in decision.waiting.items() if self.rank in w.missing}
        else:  # the counts do: offered by some members, not by this rank
            wanted = {self._cache.response(bit).name for bit, n in enumerate(offered)
                      if n and bit not in mine and n < self._cache.members(bit)}
        with self._lock:
            self._wanted_by_peers = wanted
            if wanted and any(r.name in wanted and not self._readiness.completed(r)
                              for r in self._queue):
                self._ring_locked(NEGOTIATE)

    def _unit_round(self, tag: str) -> None:
        """Run this rank's requests counted under ``tag``: every member has them queued, or had
        them run by an earlier round on every rank alike."""
        with self._lock:
            self._drained = True
            queue = self._queue
            if len(queue) == 1 and queue[0].counted == tag and not self._pending:
                unit = [queue.popleft()]  # a lone operation (most often a synchronous one)
            else:
                unit = [r for r in queue if r.counted == tag]
                if unit:
                    self._queue = collections.deque(r for r in queue if r.counted != tag)
                unit += [r for r in self._pending.values() if r.counted == tag]
            for request in unit:
                if request.offered_round < 0:
                    request.offered_round = self._round
                self._pending[request.name] = request
            if not self._queue and self._caller_blocked.is_set():
                self._caller_blocked.clear()  # as in a negotiation round: a later block is news
        bits = []
        for request in unit:
            bit = self._cache.lookup(request.meta)
            assert bit is not None  # a request is counted under a tag only once it is cached
            bits.append(bit)
        bits.sort()
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

    def _full_exchange(self, awaited: set[str], blocked: list[int]) -> Decision:
        now = self._clock()
        metas = [replace(r.meta, age_s=now - r.submitted_at, waited=r.name in awaited,
                         offered_round=r.offered_round)
                 for r in self._pending.values()]
        gathered = self._backend.control_allgather(metas)
        decision = negotiation.decide(gathered)
        failed = deadlock.find(gathered, decision, blocked)
        if failed:
            log.error("rank %d: %s", self.rank, failed[0].error)
            decision.responses.extend(failed)
            for response in failed:
                decision.waiting.pop(response.name, None)
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
                self._wanted_by_peers.discard(response.name)
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
    except HorovodInternalError:  # the shared-memory doorbell's own, naming the rank at fault
        raise
    except Exception as exc:
        raise HorovodInternalError(
            f"cannot reach the job's rendezvous store; another rank or the launcher has "
            f"probably exited: {exc}") from exc
