"""The backends a cluster can run on: where its nodes come from."""

from __future__ import annotations

from enum import Enum


class Backend(str, Enum):
    """A cluster's backend; each has an executor that runs the cluster's jobs.

    ``local``: the service makes the nodes, process slots on its own host. ``ray``: the service
    attaches to a Ray cluster at an address, whose machines are the nodes.
    """

    LOCAL = "local"
    RAY = "ray"

    @property
    def attached(self) -> bool:
        """Whether a cluster of this backend is attached to machines run by someone else, at an
        address (and may take all of them: ``nodes`` 0), rather than made by the service."""
        return self is Backend.RAY
