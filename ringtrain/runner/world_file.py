"""``--world-file``: each world of an elastic launch, written as it forms, for a supervisor.

The job service runs elastic jobs through ``ringtrain run`` and learns from this file which
nodes the job runs on now and which it lost, and why. Its format is
:class:`ringtrain.run_files.WorldReport`, which the service reads it with.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from ringtrain.contract.slots import SlotInfo
from ringtrain.run_files import LostWorker, WorldReport, write_json

log = logging.getLogger(__name__)


def write_world(path: str, generation: int, slots: Mapping[int, SlotInfo],
                lost: Sequence[LostWorker]) -> None:
    """Replace the world file with world ``generation``, atomically.

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
    report = WorldReport(generation, {h: tuple(w) for h, w in hosts.items()}, tuple(lost))
    try:
        write_json(path, report.to_json())
    except OSError as e:
        log.warning("--world-file %s: cannot write world %d (%s)", path, generation, e.strerror)
