"""The files ``ringtrain run`` leaves for whoever supervises it: one definition, writer and reader.

``ringtrain run`` writes them (the runner); the job service reads them (its job runner and local
executor). Both import this module, so a field is named in one place, and the reader's checks
are the format's own (:mod:`ringtrain.record_fields`, which raises
:class:`~ringtrain.record_fields.FieldError`). A leaf: standard library only.

- ``--output-filename DIR``: each rank's streams, ``DIR/rank.N/{stdout,stderr,output}``
  (:func:`rank_log`), as written, ``output`` holding both streams in the order they arrived;
- ``--result-file FILE``: how the launch ended (:class:`RunReport`);
- ``--world-file FILE``: an elastic launch's current world and every worker it lost
  (:class:`WorldReport`), replaced atomically as each world forms::

    {"generation": 2,
     "hosts": {"node0.localhost": [0], "node2.localhost": [2]},
     "lost": [{"worker": 1, "host": "node1.localhost", "generation": 1,
               "reason": "worker 1 on node1.localhost was killed by signal SIGKILL"}]}

A supervisor may read a file a launcher of an older version wrote, so the field names never
change, and fields added later need a default.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ringtrain.record_fields import field, items, json_object

#: The streams ``--output-filename`` writes per rank.
OUTPUT_STREAMS = ("stdout", "stderr")
#: The file of both streams in the order they arrived (what a follower reads).
COMBINED_STREAM = "output"
RANK_STREAMS = (*OUTPUT_STREAMS, COMBINED_STREAM)


def rank_log(directory: str | Path, rank: int | str, stream: str) -> Path:
    """Where ``--output-filename DIR`` puts one stream of one rank: ``DIR/rank.N/STREAM``
    (``rank`` a string: a placeholder for any rank, in a message)."""
    return Path(directory) / f"rank.{rank}" / stream


@dataclass(frozen=True)
class RootCause:
    """A rank that failed first: its rank (in an elastic launch, its worker number), host,
    state (``failed``, ``start_failed``), and its exit code or the signal that killed it."""

    rank: int
    hostname: str
    state: str
    exit_code: int | None = None
    signal: int | None = None

    @property
    def exit_status(self) -> int | None:
        """The rank's exit status as a shell reports it: its code, or ``128 + N`` if signal N
        killed it; ``None`` if it has neither (it did not start)."""
        if self.exit_code is not None:
            return self.exit_code
        return None if self.signal is None else 128 + self.signal


@dataclass(frozen=True)
class RunReport:
    """The result file: ``ringtrain run``'s exit status, its summary line, and the root causes
    (empty on success or interruption)."""

    exit_code: int
    message: str
    root_causes: tuple[RootCause, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The file's JSON object."""
        return {"exit_code": self.exit_code, "message": self.message,
                "root_causes": [asdict(c) for c in self.root_causes]}

    @classmethod
    def from_json(cls, data: Any) -> RunReport:
        """The report :meth:`to_json` gave (``FieldError``: a field is missing or mistyped)."""
        data = json_object(data)
        causes = [json_object(c) for c in field(data, "root_causes", list)]
        return cls(exit_code=field(data, "exit_code", int),
                   message=field(data, "message", str),
                   root_causes=tuple(RootCause(
                       rank=field(c, "rank", int), hostname=field(c, "hostname", str),
                       state=field(c, "state", str),
                       exit_code=field(c, "exit_code", (int, type(None)), None),
                       signal=field(c, "signal", (int, type(None)), None)) for c in causes))


@dataclass(frozen=True)
class LostWorker:
    """A worker that failed: its id, its host, the world it failed in, and the launcher's
    summary of how."""

    worker: int
    host: str
    generation: int
    reason: str


@dataclass(frozen=True)
class WorldReport:
    """The world file: an elastic launch's current world and every worker it lost.

    Attributes:
        generation: the world's number (1 for the first).
        hosts: the world's workers by host, in rank order.
        lost: every worker that failed since the launch began, in the order they failed
            (workers stopped because their host lost a slot are not lost).
    """

    generation: int
    hosts: Mapping[str, tuple[int, ...]]
    lost: tuple[LostWorker, ...] = ()

    def lost_hosts(self) -> list[str]:
        """The hosts where a worker failed that have no live worker in the current world: left
        out of it, or all of their workers in it failed."""
        failed = {w.worker for w in self.lost}
        hosts = dict.fromkeys(w.host for w in self.lost)
        return [h for h in hosts if set(self.hosts.get(h, ())) <= failed]

    def to_json(self) -> dict[str, Any]:
        """The file's JSON object."""
        return {"generation": self.generation,
                "hosts": {host: list(workers) for host, workers in self.hosts.items()},
                "lost": [asdict(w) for w in self.lost]}

    @classmethod
    def from_json(cls, data: Any) -> WorldReport:
        """The report :meth:`to_json` gave (``FieldError``: a field is missing or mistyped)."""
        data = json_object(data)
        hosts = json_object(field(data, "hosts", dict))
        lost = [json_object(item) for item in field(data, "lost", list)]
        return cls(generation=field(data, "generation", int),
                   hosts={host: items(hosts, host, int) for host in hosts},
                   lost=tuple(LostWorker(worker=field(e, "worker", int),
                                         host=field(e, "host", str),
                                         generation=field(e, "generation", int),
                                         reason=field(e, "reason", str)) for e in lost))


def write_json(path: str | Path, data: Mapping[str, Any]) -> None:
    """Replace ``path`` with ``data`` as JSON, atomically: a reader sees the old file or the new
    one, never half of one.

    Raises:
        OSError: the file could not be written.
    """
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, target)
