"""The files ``ringtrain run`` leaves for whoever supervises it: one definition, writer and reader.

``ringtrain run`` writes them (the runner); the job service reads them (its job runner and local
executor). Both import this module, so a field is named in one place, and the reader's checks
are the format's own. A leaf: standard library only.

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

#: The streams ``--output-filename`` writes per rank.
OUTPUT_STREAMS = ("stdout", "stderr")
#: The file of both streams in the order they arrived (what a follower reads).
COMBINED_STREAM = "output"
RANK_STREAMS = (*OUTPUT_STREAMS, COMBINED_STREAM)


class RunFileError(ValueError):
    """A run file is not JSON, or lacks a field, or has one of the wrong type."""


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
        """The report :meth:`to_json` gave.

        Raises:
            RunFileError: ``data`` lacks a field or has one of the wrong type.
        """
        data = _object(data)
        causes = [_object(c) for c in _field(data, "root_causes", list)]
        return cls(exit_code=_field(data, "exit_code", int),
                   message=_field(data, "message", str),
                   root_causes=tuple(RootCause(
                       rank=_field(c, "rank", int), hostname=_field(c, "hostname", str),
                       state=_field(c, "state", str),
                       exit_code=_field(c, "exit_code", (int, type(None)), None),
                       signal=_field(c, "signal", (int, type(None)), None)) for c in causes))


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
        """The report :meth:`to_json` gave.

        Raises:
            RunFileError: ``data`` lacks a field or has one of the wrong type.
        """
        data = _object(data)
        hosts = _object(_field(data, "hosts", dict))
        lost = [_object(item) for item in _field(data, "lost", list)]
        return cls(generation=_field(data, "generation", int),
                   hosts={host: _ints(hosts, host) for host in hosts},
                   lost=tuple(LostWorker(worker=_field(e, "worker", int),
                                         host=_field(e, "host", str),
                                         generation=_field(e, "generation", int),
                                         reason=_field(e, "reason", str)) for e in lost))


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


def parse_json(text: str | bytes) -> Any:
    """The JSON value of a run file's text.

    Raises:
        RunFileError: it is not JSON.
    """
    try:
        return json.loads(text)
    except ValueError as e:
        raise RunFileError(f"not valid JSON ({e})") from None


_REQUIRED = object()


def _object(data: Any) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise RunFileError(f"must be a JSON object, not {type(data).__name__}")
    return data


def _field(data: Mapping[str, Any], key: str, kinds: type | tuple[type, ...],
           default: Any = _REQUIRED) -> Any:
    """``data[key]`` if it has one of ``kinds``; ``default`` if absent (when there is one)."""
    if key not in data:
        if default is _REQUIRED:
            raise RunFileError(f"lacks the field {key!r}")
        return default
    value = data[key]
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    # JSON's true and false are ints to isinstance, but never a rank or a count.
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        wanted = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise RunFileError(f"field {key!r} must be {wanted}, not {value!r}")
    return value


def _ints(data: Mapping[str, Any], key: str) -> tuple[int, ...]:
    value = _field(data, key, list)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise RunFileError(f"field {key!r} must be a list of int, not {value!r}")
    return tuple(value)
