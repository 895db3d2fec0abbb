"""The phases of an attempt, as executors report them and the job runner writes them.

A module of its own, needing only the standard library, so that the job runner (which must start
quickly) and the Executor protocol share one definition.
"""

from __future__ import annotations

from enum import Enum


class Phase(Enum):
    """Where an attempt is. A job runner's status file holds one of the first three."""

    PREPARING = "preparing"  # the preparation command runs on the nodes
    RUNNING = "running"  # the workers run
    UPLOADING = "uploading"  # the workers ended; the outputs go to their URL
    EXITED = "exited"  # it ended and reported an exit code
    LOST = "lost"  # its processes are gone without having reported one
