"""``ringtrain serve JOB_ID``: fetch the saved model a job left, through the job service.

The job service is found as the job CLI finds it (``--url``/``RINGTRAIN_URL``, else the server of
``RINGTRAIN_HOME`` when it is set, else the service of ``ringtrain login``, else the server of
``~/.ringtrain``; the token and pin with it), never started here: a model server has no business
starting a job service. The model is copied over HTTP, so the job
may have run on another machine.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from ringtrain.jobs.client.connection import connect
from ringtrain.jobs.errors import NotFoundError
from ringtrain.jobs.job_folder import OUTPUTS
from ringtrain.jobs.models.deployment import servable_model


def fetch_job_model(job_id: str, dest: Path, url: str | None = None) -> Path:
    """Download the saved model of a succeeded job into the existing folder ``dest``, from the
    job service at ``url`` (default: as the job CLI finds it; its token too); returns
    ``dest/<the model folder's name>``.

    Raises:
        ServiceUnavailableError: no job service runs or answers.
        NotFoundError: no such job, or no saved model in its outputs.
        ConflictError: the job has not succeeded.
        InvalidRequestError: the job is a deployment.
    """
    client = connect(url=url, autostart=False)
    try:
        job = client.get_job(job_id)
        try:
            outputs = client.list_files(job_id, OUTPUTS)
        except NotFoundError:  # a job without outputs
            outputs = []
        folder = servable_model(job, outputs)
        client.download(job_id, folder, dest)
    finally:
        client.close()
    return dest / posixpath.basename(folder)
