"""The stall inspector: reports operations that some ranks submitted and others never did.

A rank whose oldest pending request has waited past the warning time asks for a full exchange of
metas (at most once a second), which tells every rank which names wait on which ranks. Each rank
logs that once per warning period; past the shutdown time (if set) the engine stops on every rank
with that report as the error instead of hanging.
"""

from __future__ import annotations

import logging
import time

from ringtrain.engine.config import EngineConfig
from ringtrain.engine.negotiation import Decision
from ringtrain.engine.request import Request
from ringtrain.errors import StallError

log = logging.getLogger(__name__)

_REPORT_INTERVAL_S = 1.0


class StallInspector:
    """Decides when to look for stalls and what to do about them."""

    def __init__(self, rank: int, config: EngineConfig, clock=time.monotonic):
        self._rank = rank
        self._enabled = config.stall_check_enabled
        self._warning_s = config.stall_warning_s
        self._shutdown_s = config.stall_shutdown_s
        self._clock = clock
        self._last_request = float("-inf")
        self._last_warning = float("-inf")

    def wants_report(self, pending: list[Request]) -> bool:
        """Whether this rank should ask for a full exchange to learn who is missing."""
        if not self._enabled or not pending:
            return False
        now = self._clock()
        if now - self._last_request < min(_REPORT_INTERVAL_S, self._warning_s):
            return False
        oldest = min(r.submitted_at for r in pending)
        if now - oldest < self._warning_s:
            return False
        self._last_request = now
        return True

    def inspect(self, decision: Decision) -> StallError | None:
        """Log stalled operations; return the error to stop with once past the shutdown time."""
        if not self._enabled:
            return None
        stalled = {k: w for k, w in decision.waiting.items() if w.age_s >= self._warning_s}
        if not stalled:
            return None
        # The ranks listed are the process set's: the name alone tells the operation.
        lines = [f"  {key.name}: submitted by ranks {list(w.submitted)}, waiting for ranks "
                 f"{list(w.missing)} for {w.age_s:.1f} s" for key, w in sorted(stalled.items())]
        report = ("some ranks submitted operations that others have not (a rank may be stuck, "
                  "or ranks take different code paths):\n" + "\n".join(lines))
        oldest = max(w.age_s for w in stalled.values())
        if self._shutdown_s > 0 and oldest >= self._shutdown_s:
            return StallError(f"stalled for more than {self._shutdown_s:g} s, shutting down: "
                              + report)
        now = self._clock()
        if now - self._last_warning >= self._warning_s:
            self._last_warning = now
            log.warning("rank %d: %s", self._rank, report)
        return None
