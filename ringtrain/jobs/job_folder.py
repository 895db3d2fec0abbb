"""A job's folder on the share: the one place that names its sub-folders and files.

Layout::

    wd/                       the working_dir copied at submit time (the ranks' cwd)
    inputs/<name>             a remote client's uploaded input (ringtrain.jobs.files.upload_tar)
    stdouterr/rank.N/{stdout,stderr,output}
                              each rank's streams, as ``ringtrain run --output-filename`` writes
                              them (:func:`ringtrain.run_files.rank_log`)
    prep/node.K.{stdout,stderr}
                              node K's preparation command
    outputs/<name>/           one folder per spec output
    launcher/                 the job runner's launch, status, result and world files
    attempts/<n>/             the stdouterr/, prep/ and launcher/ of earlier attempts

Standard library only: the job runner and a Ray node use it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ringtrain.run_files import rank_log

WORKING_DIR = "wd"
LOGS = "stdouterr"
PREP = "prep"
OUTPUTS = "outputs"
LAUNCHER = "launcher"
ATTEMPTS = "attempts"
#: The folders one attempt writes: made empty before it starts, kept per attempt on a retry.
ATTEMPT_FOLDERS = (LOGS, PREP, LAUNCHER)
#: A node's preparation streams.
PREP_STREAMS = ("stdout", "stderr")


def rank_log_path(rank: int | str, stream: str) -> str:
    """A rank's log relative to the job's folder, as a client names it:
    ``stdouterr/rank.N/STREAM`` (``rank`` a string: a placeholder, in a message)."""
    return rank_log(LOGS, rank, stream).as_posix()


def prep_log_path(node: int, stream: str) -> str:
    """Node ``node``'s preparation log relative to the job's folder: ``prep/node.K.STREAM``."""
    return f"{PREP}/node.{node}.{stream}"


@dataclass(frozen=True)
class JobFolder:
    """The folder of one job, and the paths of its parts.

    Attributes:
        root: the job's folder (``<share>/jobs/<id>``).
    """

    root: Path

    @property
    def working_dir(self) -> Path:
        """The copy of the working dir: the ranks' current directory."""
        return self.root / WORKING_DIR

    @property
    def logs(self) -> Path:
        """Where ``ringtrain run`` writes each rank's streams (its ``--output-filename``)."""
        return self.root / LOGS

    @property
    def outputs(self) -> Path:
        """The folder of the spec's outputs."""
        return self.root / OUTPUTS

    def output(self, name: str) -> Path:
        """The folder of the spec's output ``name``."""
        return self.outputs / name

    def prep_log(self, node: int, stream: str) -> Path:
        """One stream of node ``node``'s preparation command (``stdout`` or ``stderr``)."""
        return self.root / prep_log_path(node, stream)

    def attempt(self, attempt: int) -> Path:
        """Where an earlier attempt's :data:`ATTEMPT_FOLDERS` are kept."""
        return self.root / ATTEMPTS / str(attempt)
