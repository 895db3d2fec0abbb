"""The backlog: this rank's requests from submission until they run or fail, and the flags
that decide how the next submission rings.

A request is *queued* once submitted (a unit's once counted), *pending* from the round that takes
it until a response runs or fails it, and its key (its name in its process set,
:class:`~ringtrain.engine.request.OpKey`) is *in flight* all along. :attr:`Backlog.lock`
guards it and the engine's other shared state (docs/engine.md, "The engine's parts"); every
method expects it held but :meth:`Backlog.fail`.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable

from ringtrain.engine.negotiation import Response
from ringtrain.engine.request import OpKey, Request
from ringtrain.errors import HorovodInternalError


class Backlog:
    """Queued and pending requests, their keys, and the engine's shared flags."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queue: collections.deque[Request] = collections.deque()
        self.pending: dict[OpKey, Request] = {}
        self.keys: set[OpKey] = set()
        self.submitted = 0  # requests queued so far: gathering ends once this stops growing
        #: operations peers offered in the last negotiation round that this rank had not
        #: submitted (submitted later, one rings for a negotiation: its counter can no longer
        #: complete)
        self.wanted_by_peers: set[OpKey] = set()
        self.shutdown_requested = False
        #: the last negotiation saw a joined rank: readiness counters cannot complete (written
        #: without the lock by the thread running rounds, which re-checks the queue after each)
        self.peers_joined = False
        self.failure: HorovodInternalError | None = None
        self.caller_blocked = threading.Event()  # a submitter waits: stop gathering

    def add(self, request: Request, now: float) -> None:
        """Put ``request``'s key in flight, stamped with the engine's clock.

        Raises:
            HorovodInternalError: the engine has stopped.
            ValueError: an operation of that name is in flight already in that process set.
        """
        if self.failure is not None:
            raise self.failure
        if request.key in self.keys:
            raise ValueError(
                f"an operation named {request.name!r} is already in flight on this rank (in "
                f"process set {list(request.key.set_ranks)}); synchronize() it before submitting "
                "that name again, or use another name")
        request.submitted_at = now
        self.keys.add(request.key)

    def take_queue(self, round_: int) -> None:
        """A negotiation round ``round_`` takes every queued request."""
        while self.queue:
            request = self.queue.popleft()
            request.offered_round = round_
            self.pending[request.key] = request

    def take_unit(self, tag: str, round_: int) -> list[Request]:
        """Unit round ``round_`` takes the requests counted under ``tag``: queued, or pending
        since a negotiation round took them (an earlier round ran those everywhere alike)."""
        queue = self.queue
        if len(queue) == 1 and queue[0].counted == tag and not self.pending:
            unit = [queue.popleft()]  # a lone operation (most often a synchronous one)
        else:
            unit = [r for r in queue if r.counted == tag]
            if unit:
                self.queue = collections.deque(r for r in queue if r.counted != tag)
            unit += [r for r in self.pending.values() if r.counted == tag]
        for request in unit:
            if request.offered_round < 0:
                request.offered_round = round_
            self.pending[request.key] = request
        if not self.queue and self.caller_blocked.is_set():
            self.caller_blocked.clear()  # as in a negotiation round: a later block is news
        return unit

    def take_decided(self, responses: Iterable[Response]) -> dict[OpKey, Request]:
        """This rank's requests of ``responses``, by key, no longer in flight."""
        local = {}
        for response in responses:
            key = response.key
            request = self.pending.pop(key, None)
            if request is not None:
                local[key] = request
                self.keys.discard(key)
            self.wanted_by_peers.discard(key)
        return local

    def take_running(self, request: Request) -> None:
        """The express round takes its own request, which it runs at once: out of the queue
        (where it was alone when counted; others may have come since), and no longer in
        flight."""
        queue = self.queue
        if queue[0] is request:
            queue.popleft()
        else:
            queue.remove(request)
        self.keys.discard(request.key)
        self.wanted_by_peers.discard(request.key)
        if not queue and self.caller_blocked.is_set():
            self.caller_blocked.clear()  # as take_unit

    def fail(self, error: HorovodInternalError) -> None:
        """Stop: every queued and pending request fails, and so will every later submission,
        with the first error given (takes the lock)."""
        with self.lock:
            if self.failure is None:
                self.failure = error
            requests = list(self.pending.values()) + list(self.queue)
            self.pending.clear()
            self.queue.clear()
            self.keys.clear()
        for request in requests:
            request.handle.set_error(self.failure)
