"""The one way the SQLite store's tables write: a ``BEGIN IMMEDIATE`` transaction, rolled back
on any error, a full disk turned into a :class:`~ringtrain.jobs.errors.DiskFullError`.

A ``COMMIT`` that finds the disk full may leave its transaction open (SQLite then rolls back
only what it must), and the connection, kept per thread, would refuse every later ``BEGIN``
("cannot start a transaction within a transaction"): so the rollback covers a failed commit
too. Nothing of a refused write is kept, as in PostgreSQL; the same write succeeds once there
is room again.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ringtrain.jobs.disk_space import disk_full_error, is_disk_full


@contextmanager
def write_transaction(db: sqlite3.Connection, folder: Path,
                      on_full: Callable[[Path], None] | None = None
                      ) -> Iterator[sqlite3.Connection]:
    """One write transaction on ``db``, committed when the block ends without an error.

    Args:
        folder: the database's folder, which a full disk's error names.
        on_full: called with ``folder`` when the disk is full, after the rollback (the service
            gives up its reserve then, and logs it).

    Raises:
        DiskFullError: the disk holding the database has no room for the write.
    """
    try:
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
    except sqlite3.OperationalError as e:
        if not is_disk_full(e):
            raise
        error = disk_full_error(folder)  # measured before a reserve given up adds its room
        if on_full is not None:
            on_full(folder)
        raise error from None
