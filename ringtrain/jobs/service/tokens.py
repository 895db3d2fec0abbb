"""Scoped tokens: made, listed, revoked, and recognised on each request.

A token is ``rt_<id>_<secret>`` with 256 random bits of secret. The store keeps the SHA-256 of
the whole text: a plain hash, not a slow password hash, because the secret is random and far too
large to guess, so a stolen database gives nobody a token. A request's token is found by its id
and its hash compared in constant time; a revoked or expired one is refused saying so, and only
once the secret matched, so that nobody learns a token's state without holding it.

A token's record is read on every request it makes, so a revoke takes effect with the next
request; a stream it opened before (a followed log, the dashboard's events) ends at its next
chunk (:meth:`Tokens.ended`, which the scope guard asks). Its "last used" time is written at
most once a minute per token: a write on every request would make the store's writers (the
scheduler) wait for readers' bookkeeping.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable

from ringtrain.jobs.errors import AuthError, ConflictError, DiskFullError
from ringtrain.jobs.models.tokens import (
    TOKEN_PREFIX,
    NewToken,
    TokenInfo,
    TokenRequest,
    token_id_of,
)
from ringtrain.jobs.service.store.token_table import TokenTable

#: Seconds between two writes of a token's "last used" time.
TOUCH_EVERY_S = 60.0
_DAY_S = 86400.0


def token_hash(text: str) -> str:
    """What the store keeps of a token: the SHA-256 of its text, in hex."""
    return hashlib.sha256(text.encode()).hexdigest()


class Tokens:
    """The scoped tokens of one service.

    Args:
        table: their records (:attr:`ringtrain.jobs.service.store.Store.tokens`).
        clock: the time (injectable: expiry and "last used" follow it).
    """

    def __init__(self, table: TokenTable, clock: Callable[[], float] = time.time):
        self.table = table
        self.clock = clock
        # Revoked by this server (the only writer of its store): what open streams look up.
        self._revoked: set[str] = set()

    def create(self, request: TokenRequest) -> NewToken:
        """Make a token; its text is in the answer and nowhere else."""
        now = self.clock()
        for _ in range(100):  # 48-bit ids collide, rarely
            token_id = secrets.token_hex(6)
            text = f"{TOKEN_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
            info = TokenInfo(id=token_id, scope=request.scope, experiment=request.experiment,
                             label=request.label, created_at=now,
                             expires_at=(None if request.expires_days is None
                                         else now + request.expires_days * _DAY_S))
            try:
                self.table.add(info, token_hash(text))
            except ConflictError:
                continue
            return NewToken(token=text, info=info)
        raise ConflictError("no free token id; try again")

    def list(self) -> list[TokenInfo]:
        """Every token's record, revoked and expired ones too."""
        return self.table.list()

    def revoke(self, token_id: str) -> TokenInfo:
        """Revoke a token: its next request is refused. Raises NotFoundError."""
        info = self.table.revoke(token_id, self.clock())
        self._revoked.add(token_id)
        return info

    def ended(self, info: TokenInfo) -> bool:
        """Whether a token that authenticated a request has been revoked or has expired since:
        asked for every chunk of a stream, so it reads no database (a set and the clock)."""
        return info.id in self._revoked or (info.expires_at is not None
                                            and self.clock() >= info.expires_at)

    def authenticate(self, text: str) -> TokenInfo | None:
        """The record of the token whose text a request carries, or ``None`` if it is no token
        of this service.

        Raises:
            AuthError: it is one, but revoked or expired (the message says which).
        """
        token_id = token_id_of(text)
        if token_id is None:
            return None
        stored = self.table.get(token_id)
        if stored is None or not hmac.compare_digest(stored.hash, token_hash(text)):
            return None
        return self._usable(stored.info)

    def active(self, token_id: str) -> TokenInfo | None:
        """The record of a token the caller proved otherwise (the dashboard's signed cookie),
        or ``None`` if there is none.

        Raises:
            AuthError: it was revoked or has expired.
        """
        stored = self.table.get(token_id)
        return None if stored is None else self._usable(stored.info)

    def _usable(self, info: TokenInfo) -> TokenInfo:
        now = self.clock()
        state = info.state(now)
        if state == "revoked":
            raise AuthError(f"this token (id {info.id}) was revoked at {_when(info.revoked_at)}; "
                            "ask the service's owner for a new one")
        if state == "expired":
            raise AuthError(f"this token (id {info.id}) expired at {_when(info.expires_at)}; "
                            "ask the service's owner for a new one")
        if info.last_used_at is None or now - info.last_used_at >= TOUCH_EVERY_S:
            try:
                self.table.mark_used(info.id, now)
            except DiskFullError:
                pass  # last use is a note to within a minute: a full disk refuses no request
        return info


def _when(t: float | None) -> str:
    return "?" if t is None else time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t))
