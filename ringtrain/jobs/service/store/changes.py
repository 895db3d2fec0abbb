"""Which records changed since a revision: what the dashboard's event stream pushes.

An in-memory counter, bumped after each committed write, with the last revision at which each
job changed. It starts at 0 with every server, so a client that reconnects after a restart
gets a full snapshot (its revision is then ahead of the server's, or far behind).
"""

from __future__ import annotations

import threading


class ChangeLog:
    """A revision counter and the revision each job last changed at."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._revision = 0
        self._jobs: dict[str, int] = {}

    @property
    def revision(self) -> int:
        """The number of writes so far."""
        return self._revision

    def touch(self, job_id: str | None) -> None:
        """Record one committed write, of ``job_id`` (``None``: clusters or nodes only)."""
        with self._lock:
            self._revision += 1
            if job_id is not None:
                self._jobs[job_id] = self._revision

    def since(self, revision: int) -> tuple[int, list[str]]:
        """The current revision and the jobs changed after ``revision``, oldest change first."""
        with self._lock:
            changed = sorted((rev, job) for job, rev in self._jobs.items() if rev > revision)
            return self._revision, [job for _, job in changed]
