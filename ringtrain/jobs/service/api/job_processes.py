"""The dashboard's routes about running jobs' processes and progress: each rank's CPU and
memory, a rank's stack dump, and the progress of every running job (the jobs list's column).

Ranks are found in ``/proc`` below the job's runner
(:mod:`ringtrain.jobs.service.monitor.job_usage`), so only jobs whose backend names a runner on the
service host (local clusters) have them; the others answer an empty list with the reason. A stack
dump changes nothing but pauses the rank for a moment, so it is a POST: with the dashboard's cookie
it needs the page's header, and a page of another site cannot make the browser ask for one
(:mod:`ringtrain.jobs.service.api.guard`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ringtrain.jobs.errors import ConflictError, NotFoundError, RecordError
from ringtrain.jobs.models import JobInfo, JobState
from ringtrain.jobs.service.api.caller import CallerDep
from ringtrain.jobs.service.api.params import JobIdPath, RankPath
from ringtrain.jobs.service.job_service import JobService
from ringtrain.jobs.service.monitor.job_usage import RankUsageSampler, find_ranks
from ringtrain.jobs.service.monitor.progress import ProgressCache
from ringtrain.jobs.service.monitor.stack_dump import dump_stack

#: The states in which a job may have processes.
ACTIVE = (JobState.PREPARING, JobState.RUNNING, JobState.UPLOADING, JobState.TERMINATING)


def leader_pid(service: JobService, job: JobInfo) -> int | None:
    """The pid of ``job``'s runner on the service host, or ``None`` (not started yet, gone, or
    a backend whose processes run elsewhere)."""
    try:
        data = service.store.get_launch(job.id)
        if data is None:  # not started yet
            return None
        launch = service.backends.load_handle(data)
    except (RecordError, NotFoundError):  # unreadable, or gone meanwhile
        return None
    backend = service.backends.find(launch.backend)
    return None if backend is None else backend.leader_pid(launch.handle)


def add_process_routes(r: APIRouter, service: JobService) -> None:
    """Add ``/jobs/{id}/ranks``, ``/jobs/{id}/ranks/{rank}/stack`` and ``/progress`` to
    ``r``."""
    ranks = RankUsageSampler()
    progress = ProgressCache()

    @r.get("/jobs/{job_id}/ranks")
    def job_ranks(job_id: JobIdPath) -> dict[str, Any]:
        """Each rank of a running job of a local cluster: ``ranks`` is ``[{"rank", "pid",
        "cpu_percent", "memory", "processes"}]`` (CPU in percent of one core since the
        previous call, ``None`` on the first; resident memory in bytes; ``pid`` the rank's
        Python process); ``reason`` says why the list is empty."""
        job = service.get_job(job_id)
        if job.state not in ACTIVE:
            return {"ranks": [], "reason": f"the job is {job.state.value}: no processes"}
        pid = leader_pid(service, job)
        if pid is None:
            return {"ranks": [], "reason": "no runner of this job on the service host (not "
                                           "started yet, or its cluster's machines are elsewhere)"}
        return {"ranks": ranks.sample(job_id, pid), "reason": ""}

    @r.post("/jobs/{job_id}/ranks/{rank}/stack")
    def rank_stack(job_id: JobIdPath, rank: RankPath) -> dict[str, Any]:
        """The stack of every thread of a rank's Python process, as ``py-spy dump`` prints it:
        ``{"rank", "pid", "text"}``. 409 if the job has no processes or py-spy fails, 404 if
        no such rank runs, 503 if py-spy is not installed (the message says how)."""
        job = service.get_job(job_id)
        pid = leader_pid(service, job) if job.state in ACTIVE else None
        if pid is None:
            raise ConflictError(f"job {job_id} is {job.state.value} and has no processes on the "
                                "service host: a stack dump needs a running rank of a local "
                                "cluster's job")
        found = [x for x in find_ranks(pid) if x.rank == rank and x.main is not None]
        if not found:
            raise NotFoundError(f"rank {rank} of job {job_id} does not run now")
        main = found[-1].main
        assert main is not None  # filtered above
        return {"rank": rank, "pid": main, "text": dump_stack(main)}

    @r.get("/progress")
    def jobs_progress(caller: CallerDep) -> dict[str, dict[str, Any]]:
        """Each running job's progress, from its step scalars: ``{job id: {"step",
        "steps_per_s", "total_steps", "eta_s", "source"}}`` (jobs that logged no step are left
        out; ``total_steps`` and ``eta_s`` need the job to log a ``total_steps`` scalar or
        step profiler field)."""
        running = {j.id: service.share.job_dir(j.id)
                   for j in service.store.list_jobs(states=[JobState.RUNNING],
                                                    experiment=caller.experiment)}
        return progress.sample(running)
