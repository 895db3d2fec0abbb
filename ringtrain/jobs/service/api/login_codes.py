"""Single-use codes that sign a browser in to the dashboard without the token in its address.

``ringtrain dashboard --open`` starts a browser, and a browser's command line is readable by
every local account (``ps``): a URL with the token in it would hand the service's key to all of
them. So the CLI asks the service for a code (``POST /v1/dashboard/login-codes``, with its
token) and opens ``/dashboard/login?code=...`` instead, as ``gh auth login`` and Jupyter's
login links do. The guard (:mod:`ringtrain.jobs.service.api.guard`) exchanges the code once for
the caller's cookie; a code read from ``ps`` is worth nothing once the browser has used it, and
one never used stops working after :data:`LOGIN_CODE_TTL_S`.

Codes live in the server's memory only: a restart forgets them, which costs a second
``--open`` at worst.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: Seconds a code may wait for its browser: enough to start one, short enough that a code
#: seen on a command line is stale by the time anyone could use it.
LOGIN_CODE_TTL_S = 60.0
#: Codes kept at most: past it the oldest is dropped, so a caller asking in a loop cannot make
#: the server's memory grow (codes expire within a minute anyway).
MAX_OUTSTANDING = 1024


@dataclass(frozen=True)
class Grant:
    """Who a redeemed code signs in as.

    Args:
        token_id: the scoped token's id; ``None`` for the admin token.
    """

    token_id: str | None


class LoginCodes:
    """The outstanding codes, each redeemable once before it expires.

    Args:
        clock: monotonic seconds (injectable for tests).
        ttl_s: a code's lifetime.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 ttl_s: float = LOGIN_CODE_TTL_S):
        self.clock = clock
        self.ttl_s = ttl_s
        # Issued from the API's worker threads, redeemed on the event loop: a short lock.
        self._lock = threading.Lock()
        self._codes: dict[str, tuple[Grant, float]] = {}  # by the code's hash: expiry

    def issue(self, grant: Grant) -> str:
        """A new code that signs a browser in as ``grant``'s caller."""
        code = secrets.token_urlsafe(32)
        now = self.clock()
        with self._lock:
            for key in [k for k, (_, expires) in self._codes.items() if expires <= now]:
                del self._codes[key]
            while len(self._codes) >= MAX_OUTSTANDING:
                del self._codes[next(iter(self._codes))]  # the oldest (dicts keep order)
            self._codes[_key(code)] = (grant, now + self.ttl_s)
        return code

    def redeem(self, code: str) -> Grant | None:
        """The grant of ``code``, which is then used up; ``None`` for an unknown, used or
        expired one."""
        now = self.clock()
        with self._lock:
            found = self._codes.pop(_key(code), None)
        if found is None or found[1] <= now:
            return None
        return found[0]


def _key(code: str) -> str:
    # Codes are looked up by their hash, so the dict's timing says nothing about their text.
    return hashlib.sha256(code.encode("utf-8", "replace")).hexdigest()
