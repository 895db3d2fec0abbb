"""``--world-file``: each world of an elastic launch, written as it forms, for a supervisor.

The job service runs elastic jobs through ``ringtrain run`` and learns from this file which
nodes the job runs on now and which it lost, and why. The file is replaced atomically, so a
reader never sees half of it::

    {"generation": 2,
     "hosts": {"node0.localhost": [0], "node2.localhost": [2]},
     "lost": [{"worker": 1, "host": "node1.localhost", "generation": 1,
               "reason": "worker 1 on node1.localhost was killed by signal SIGKILL"}]}

``hosts`` lists the world's workers by host in rank order; ``lost`` every worker that failed
since the launch began (workers stopped because their host lost a slot are not lost).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ringtrain.runner.hosts import SlotInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LostWorker:
    """A worker that failed: its id, its host, the world it failed in, and the launcher's
    summary of how."""

    worker: int
    host: str
    generation: int
    reason: str


def write_world(path: str, generation: int, slots: Mapping[int, SlotInfo],
                lost: Sequence[LostWorker]) -> None:
    """Replace the world file with world ``generation``.

    A file that cannot be written is logged, not fatal: the training goes on without it.

    Args:
        path: the file (``--world-file``).
        generation: the world's number (1 for the first).
        slots: the world's workers and their slots (worker id -> slot).
        lost: the workers lost so far, in the order they failed.
    """
    hosts: dict[str, list[int]] = {}
    for worker, slot in sorted(slots.items(), key=lambda item: item[1].rank):
        hosts.setdefault(slot.hostname, []).append(worker)
    text = json.dumps({"generation": generation, "hosts": hosts,
                       "lost": [asdict(w) for w in lost]})
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, target)
    except OSError as e:
        log.warning("--world-file %s: cannot write world %d (%s)", path, generation, e.strerror)
