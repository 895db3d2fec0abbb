"""Staging jobs in the background: a few worker threads that copy working dirs.

A submit records the job in state ``staging`` and returns at once; copying a large working dir
can take minutes, and a client must never take that for a failure. The copies run here, a few at
a time so that many submits do not fight over the disk, in daemon threads: a server that stops
mid-copy leaves the job ``staging``, and the next server stages it again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from ringtrain.jobs.models import JobInfo

log = logging.getLogger(__name__)


class Stager:
    """Runs ``stage(job)`` for every job put in, on up to ``workers`` threads.

    Args:
        stage: copies one job's files and moves it on; exceptions are logged, not raised.
        workers: copies at a time.
    """

    def __init__(self, stage: Callable[[JobInfo], None], workers: int = 2):
        self._stage = stage
        self._workers = workers
        self._queue: queue.Queue[JobInfo] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._pending = 0  # put in and not finished
        self._idle = threading.Condition()

    def put(self, job: JobInfo) -> None:
        """Stage ``job`` soon (the threads start on the first call)."""
        with self._idle:
            self._pending += 1
            if len(self._threads) < self._workers:
                thread = threading.Thread(target=self._work, name="stager", daemon=True)
                self._threads.append(thread)
                thread.start()
        self._queue.put(job)

    def join(self, timeout_s: float) -> bool:
        """Wait until every job put in is staged; False if that took longer than ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            try:
                self._stage(job)
            except Exception:  # one job's failure must not stop the others' staging
                log.exception("job %s: staging failed", job.id)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()
