"""The one launch path: how every executor starts a node's ranks, and what it reads back.

Whatever runs a node (the local executor's job runner, a Ray machine's agent, a Kubernetes pod),
it starts that node's ranks with :func:`node_argv`: ``ringtrain run`` in its per-node mode.
Node 0 serves the rendezvous, drives the job and writes the attempt's result file (and an
elastic attempt's world file) in the format of :mod:`ringtrain.run_files`; the executor reads
them back with :func:`run_outcome` and :func:`with_world`. An executor that built ``RANK`` or
``MASTER_ADDR`` itself would have forked the launcher.

Standard library only: the job runner and a Ray node import it.
"""

from __future__ import annotations

import logging
import re
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ringtrain.jobs.errors import RecordError
from ringtrain.jobs.files.record_file import read_record
from ringtrain.jobs.job_folder import LAUNCHER, JobFolder, rank_log_path
from ringtrain.jobs.service.executors.base import NodeLoss, Observation
from ringtrain.jobs.service.executors.phase import Phase
from ringtrain.run_files import RunReport, WorldReport

if TYPE_CHECKING:
    from ringtrain.jobs.models import JobInfo

log = logging.getLogger(__name__)

#: ``ringtrain run``'s files, relative to the job's folder: how the attempt ended, and an elastic
#: attempt's worlds as they form.
RESULT_FILE = f"{LAUNCHER}/result.json"
WORLD_FILE = f"{LAUNCHER}/world.json"
#: The exit code of an attempt whose command could not be started at all (as a shell's).
EXIT_NOT_STARTED = 127
#: An elastic attempt's node N is the host ``nodeN.localhost`` of its ranks (a name of this
#: machine, RFC 6761; a Ray node's is ``nodeN``), as its world file reports them.
NODE_HOST = "node{}.localhost"
_NODE_HOST_PATTERN = re.compile(r"node(\d+)(\.localhost)?")


def node_argv(runner: Sequence[str], job_dir: Path, node: int, node_count: int,
              process_count_per_node: int, endpoint: str, command: str,
              node_range: tuple[int, int] | None = None, name: str | None = None) -> list[str]:
    """The command line that starts node ``node``'s ranks of an attempt: ``ringtrain run`` in
    its per-node mode, the same for every executor. Node 0 serves the rendezvous at
    ``endpoint`` and writes the attempt's result file (and an elastic attempt's world file);
    every node writes its ranks' logs into ``job_dir/stdouterr``.

    Args:
        node_range: an elastic attempt's fewest and most nodes.
        name: the host name of the node's ranks (default ``node<node>``); an elastic attempt
            names its nodes after the cluster's, as its world file reports them.
    """
    per_node = process_count_per_node
    argv = [*runner, "--nnodes", str(node_count), "--node-rank", str(node),
            "--nproc-per-node", str(per_node), "--rdzv-endpoint", endpoint,
            "--node-name", name or f"node{node}", "--output-filename", str(JobFolder(job_dir).logs)]
    if node_range is not None:
        argv += ["--min-np", str(node_range[0] * per_node),
                 "--max-np", str(node_range[1] * per_node)]
    if node == 0:
        argv += ["--result-file", str(job_dir / RESULT_FILE)]
        if node_range is not None:
            argv += ["--world-file", str(job_dir / WORLD_FILE)]
    return [*argv, "sh", "-c", command]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, for node 0's rendezvous (it binds it with SO_REUSEADDR
    moments later; another process may take it before)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def read_result(job_dir: Path) -> RunReport | None:
    """The result file ``ringtrain run`` wrote, or ``None`` if it wrote none (it could not
    start). Raises RecordError if the file is not JSON or lacks a field."""
    return read_record(job_dir, RESULT_FILE, f"the result file {job_dir / RESULT_FILE}",
                       RunReport.from_json)


def read_world(job_dir: Path) -> WorldReport | None:
    """An elastic attempt's latest world, or ``None`` before the first one formed. Raises
    RecordError if the file is not JSON or lacks a field."""
    return read_record(job_dir, WORLD_FILE, f"the world file {job_dir / WORLD_FILE}",
                       WorldReport.from_json)


def run_outcome(code: int, job_dir: Path) -> tuple[int, str]:
    """The attempt's exit code and message from ``ringtrain run``'s exit status ``code`` and
    the result file it wrote into ``job_dir`` (a failing rank's own exit code, not 1)."""
    if code == 0:
        return 0, ""
    try:
        report = read_result(job_dir)
    except RecordError as e:
        print(f"job runner: {e}", file=sys.stderr)
        report = None
    cause = report.root_causes[0] if report is not None and report.root_causes else None
    if report is not None and cause is not None and cause.exit_status is not None:
        # The user's own code, not `ringtrain run`'s 1 for "a rank failed".
        return cause.exit_status, f"{report.message}; see {rank_log_path(cause.rank, 'stderr')}"
    if report is not None and report.message:
        return code, report.message
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return code, f"`ringtrain run` {how}; see {rank_log_path('N', 'stderr')}"


def with_world(job: JobInfo, seen: Observation) -> Observation:
    """``seen`` with the elastic attempt's current world and lost nodes, from its world file;
    ``seen`` itself for a fixed job, a lost attempt, or a world file that cannot be read (the
    attempt goes on; only its world is not known, which is logged)."""
    if not job.spec.elastic or seen.phase is Phase.LOST:
        return seen
    try:
        world = read_world(Path(job.job_dir))
    except RecordError as e:
        log.warning("job %s: %s", job.id, e)
        return seen
    if world is None:
        return seen
    first_failure: dict[str, str] = {}
    for worker in world.lost:
        first_failure.setdefault(worker.host, worker.reason)
    lost = tuple(NodeLoss(_node_of(h), first_failure[h]) for h in world.lost_hosts())
    gone = {loss.node for loss in lost}
    nodes = tuple(n for n in map(_node_of, world.hosts) if n not in gone)
    return Observation(seen.phase, seen.exit_code, seen.message, nodes, lost)


def _node_of(host: str) -> int:
    """The node index of an elastic launch's host (``node3.localhost`` -> 3). Raises
    RecordError if the host is not one the executor named."""
    match = _NODE_HOST_PATTERN.fullmatch(host)
    if match is None:
        raise RecordError(f"the world file names the host {host!r}, which is no node of the "
                          "job (nodeN.localhost)")
    return int(match.group(1))
