"""The names of the job path's environment variables, defined once.

Two groups. The service's own settings, read by the CLI and the server (in
:mod:`ringtrain.jobs.home`): ``RINGTRAIN_HOME``, ``RINGTRAIN_URL``, ``RINGTRAIN_TOKEN`` (or
``RINGTRAIN_TOKEN_FILE``), ``RINGTRAIN_FINGERPRINT``. And what
the service sets for every process of a job (in
:meth:`ringtrain.jobs.service.share.Share.job_environ` and the job runner), which the job's own
commands read: the job id, its folders, its inputs and outputs. ``RINGTRAIN_JOB_ID`` also marks a
job's processes, so that the service finds them in /proc.

The launcher-to-worker contract (``RINGTRAIN_RUN_ID``, ``HOROVOD_RANK``, ...) is not here: it
belongs to ``ringtrain run``, which jobs only call, and lives in :mod:`ringtrain.contract.env`.
This module imports nothing, so that the job runner can use it and still start quickly.
"""

from __future__ import annotations

#: Every name the job path uses starts with this; a job spec may not set such variables.
PREFIX = "RINGTRAIN_"

HOME = "RINGTRAIN_HOME"  # the service's home (database, share, server.json)
URL = "RINGTRAIN_URL"  # talk to this server instead of the one of RINGTRAIN_HOME
TOKEN = "RINGTRAIN_TOKEN"  # the bearer token of the server
TOKEN_FILE = "RINGTRAIN_TOKEN_FILE"  # a file holding it (kept out of the environment, of `ps`)
FINGERPRINT = "RINGTRAIN_FINGERPRINT"  # the certificate an https RINGTRAIN_URL must present

JOB_ID = "RINGTRAIN_JOB_ID"
SHARE_ROOT = "RINGTRAIN_SHARE_ROOT"
JOB_DIR = "RINGTRAIN_JOB_DIR"
NODE_INDEX = "RINGTRAIN_NODE_INDEX"  # in job_preparation only: the node, 0..node_count-1


def input_var(name: str) -> str:
    """The variable holding the path of the spec's input ``name``."""
    return f"{PREFIX}INPUT_{name.upper()}"


def output_var(name: str) -> str:
    """The variable holding the folder of the spec's output ``name``."""
    return f"{PREFIX}OUTPUT_{name.upper()}"
