"""The scoped tokens' table of the SQLite store: each token's record and the SHA-256 of its text,
never the text itself (the store's schema creates the table,
:mod:`ringtrain.jobs.service.store.sqlite`).

Its writes do not count in the store's change log: that log tells the dashboards which jobs
changed, and a token's "last used" changes with the requests themselves.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from ringtrain.jobs.errors import ConflictError, NotFoundError
from ringtrain.jobs.models.tokens import TokenInfo, TokenScope

#: The table, created with the store's other tables (schema version 7).
TOKENS_SCHEMA = """
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY, hash TEXT NOT NULL, scope TEXT NOT NULL, experiment TEXT,
    label TEXT NOT NULL DEFAULT '', created_at REAL NOT NULL, expires_at REAL,
    revoked_at REAL, last_used_at REAL);
"""


@dataclass(frozen=True)
class StoredToken:
    """A token's record with the hash that proves it (which never leaves the service)."""

    info: TokenInfo
    hash: str


class TokenTable:
    """The ``tokens`` table, through the store's connections.

    Args:
        connect: the calling thread's connection to the store's database.
        transaction: one write transaction on it, the store's own (which turns a full disk
            into a DiskFullError).
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection],
                 transaction: Callable[[], AbstractContextManager[sqlite3.Connection]]):
        self._connect = connect
        self._tx = transaction

    def add(self, info: TokenInfo, token_hash: str) -> None:
        """Record a new token. Raises ConflictError if its id is taken."""
        with self._tx() as db:
            if db.execute("SELECT 1 FROM tokens WHERE id=?", (info.id,)).fetchone():
                raise ConflictError(f"token id {info.id} already exists")
            db.execute("INSERT INTO tokens (id, hash, scope, experiment, label, created_at, "
                       "expires_at) VALUES (?,?,?,?,?,?,?)",
                       (info.id, token_hash, info.scope.value, info.experiment, info.label,
                        info.created_at, info.expires_at))

    def get(self, token_id: str) -> StoredToken | None:
        """One token's record and hash, or ``None``."""
        row = self._connect().execute("SELECT * FROM tokens WHERE id=?", (token_id,)).fetchone()
        return None if row is None else StoredToken(_info(row), row["hash"])

    def list(self) -> list[TokenInfo]:
        """Every token, revoked and expired ones too, oldest first."""
        return [_info(r) for r in self._connect().execute(
            "SELECT * FROM tokens ORDER BY created_at, id")]

    def revoke(self, token_id: str, now: float) -> TokenInfo:
        """Mark a token revoked at ``now`` (once: a second revoke keeps the first time)."""
        with self._tx() as db:
            if db.execute("SELECT 1 FROM tokens WHERE id=?", (token_id,)).fetchone() is None:
                raise NotFoundError(f"no token with id {token_id!r} (see `ringtrain token list`)")
            db.execute("UPDATE tokens SET revoked_at=? WHERE id=? AND revoked_at IS NULL",
                       (now, token_id))
            return _info(db.execute("SELECT * FROM tokens WHERE id=?", (token_id,)).fetchone())

    def mark_used(self, token_id: str, now: float) -> None:
        """Record that the token authenticated a request at ``now``."""
        with self._tx() as db:
            db.execute("UPDATE tokens SET last_used_at=? WHERE id=?", (now, token_id))


def _info(row: sqlite3.Row) -> TokenInfo:
    return TokenInfo(id=row["id"], scope=TokenScope(row["scope"]), experiment=row["experiment"],
                     label=row["label"], created_at=row["created_at"],
                     expires_at=row["expires_at"], revoked_at=row["revoked_at"],
                     last_used_at=row["last_used_at"])
