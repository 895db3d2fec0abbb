"""A deployment replica's record: the file its keeper writes and the service reads.

Each replica of a deployment is kept by :mod:`ringtrain.jobs.service.replica_keeper`, which
writes ``outputs/endpoints/replica.<rank>.json`` whenever the replica changes: serving (with its
URL), restarting after its server died, or failed for good. The service reads the file for the
deployment's state and its front's replicas (:mod:`ringtrain.jobs.service.deployments`). One
definition for both sides; standard library only, so that the keeper starts quickly.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from ringtrain.record_fields import FieldError, field, json_object

#: The restarts in a row a replica may make unless its deployment says otherwise.
DEFAULT_MAX_RESTARTS = 5


class ReplicaState(str, Enum):
    """Where one replica is. Only ``failed`` is final (``starting``: no record yet)."""

    STARTING = "starting"  # its first server is loading the model
    SERVING = "serving"  # its server listens at ``url``
    RESTARTING = "restarting"  # its server died; another starts after a backoff
    FAILED = "failed"  # its server died and the keeper gave up: the record says why


@dataclass(frozen=True)
class ReplicaRecord:
    """One replica's last announced state.

    Attributes:
        state: serving, restarting or failed (a replica that has no record is starting).
        url: where its server listens, or listened last (``None`` before it first served).
        restarts: its server's restarts in a row so far, the one it waits for included (a
            long good run sets it back to 0).
        max_restarts: how many in a row it may restart before it fails.
        message: why it is not serving: how its server ended, and its last stderr line.
    """

    state: ReplicaState
    url: str | None = None
    restarts: int = 0
    max_restarts: int = 0
    message: str = ""

    def write(self, path: Path) -> None:
        """Replace the record at ``path`` atomically (a reader never sees half of it)."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({**asdict(self), "state": self.state.value}))
        os.replace(tmp, path)

    @classmethod
    def from_json(cls, data: Any) -> ReplicaRecord:
        """The record in ``data``, a parsed JSON object. A file with only ``url`` (and ``pid``),
        as ``ringtrain serve --ready-file`` wrote it for deployments made before keepers, is a
        replica serving there.

        Raises:
            FieldError: a field is missing, of the wrong type, or an unknown state.
        """
        data = json_object(data)
        raw = field(data, "state", str, ReplicaState.SERVING.value)
        try:
            state = ReplicaState(raw)
        except ValueError:
            raise FieldError(f"field 'state' must be a replica's state, not {raw!r}") from None
        url = field(data, "url", (str, type(None)), None)
        if state is ReplicaState.SERVING and not (url or "").startswith("http"):
            raise FieldError(f"a serving replica needs an http(s) URL, not {url!r}")
        return cls(state, url, field(data, "restarts", int, 0), field(data, "max_restarts", int, 0),
                   field(data, "message", str, ""))
