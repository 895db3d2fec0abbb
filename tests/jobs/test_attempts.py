"""How an attempt ends, as the job runner and the local executor see it: the user's own exit code,
a start failure's cause, and no process outliving its job. Real jobs through `ringtrain run`, run
by a real service (store, share, local executor) ticked in this process, or by the CLI."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ringtrain.jobs.home import Home
from ringtrain.jobs.models import ClusterSpec, JobInfo, parse_job_spec
from ringtrain.jobs.service.executors.local import cgroups
from ringtrain.jobs.service.executors.local.backend import LocalBackend
from ringtrain.jobs.service.executors.local.executor import DEFAULT_RUNNER, LocalExecutor
from ringtrain.jobs.service.executors.local.records import LAUNCH_FILE, LaunchSpec, RunnerStatus
from ringtrain.jobs.service.executors.phase import Phase
from ringtrain.jobs.service.job_service import JobService
from ringtrain.jobs.service.share import Share
from ringtrain.jobs.service.store import SQLiteStore

from .conftest import CLI, end_unfinished_jobs, pids_running, wait_for

HAS_CGROUPS = cgroups.JobCgroups.detect(Path("/probe")) is not None


class Service:
    """A job service ticked by the test: real store, share and local executor, no HTTP."""

    def __init__(self, root: Path, use_cgroups: bool):
        self.store = SQLiteStore(root / "jobs.sqlite")
        self.executor = LocalExecutor(Share(root / "share"), use_cgroups=use_cgroups)
        self.service = JobService(self.store, self.executor.share,
                                  [LocalBackend(self.executor)])
        self.service.create_cluster(ClusterSpec(name="c", nodes=2))

    def submit(self, command: str, **spec: object) -> JobInfo:
        return self.service.submit("c", parse_job_spec({"node_count": 1, "command": command,
                                                        **spec}))

    def tick_until(self, job_id: str, predicate, timeout_s: float = 90.0) -> JobInfo:
        def check():
            self.service.tick()
            job = self.store.get_job(job_id)
            return job if predicate(job) else None
        return wait_for(check, timeout_s=timeout_s, every_s=0.1)

    def run_to_end(self, job_id: str) -> JobInfo:
        return self.tick_until(job_id, lambda j: j.state.is_terminal())


@pytest.fixture(params=["cgroup", "process-tree"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Service]:
    use_cgroups = request.param == "cgroup"
    if use_cgroups and not HAS_CGROUPS:
        pytest.skip("no writable cgroup v2 hierarchy here")
    s = Service(tmp_path, use_cgroups)
    yield s
    end_unfinished_jobs(s)


@pytest.fixture
def escapee() -> Iterator[str]:
    """A `sleep` argument no other process has; whatever still runs it is killed afterwards."""
    marker = f"45.{secrets.randbelow(10**9):09d}"
    yield marker
    for pid in pids_running(f"sleep {marker}"):
        os.kill(pid, signal.SIGKILL)


def _escape(marker: str) -> str:
    # A new session, and without the job's marker variable: neither the process group nor
    # the environment sweep finds it.
    return (f"setsid env -u RINGTRAIN_JOB_ID sh -c 'touch escaped; exec sleep {marker}' & "
            "while [ ! -e escaped ]; do sleep 0.05; done; sleep 0.2; echo started")


def test_a_process_that_left_the_job_ends_with_it(service: Service, escapee: str) -> None:
    job = service.submit(_escape(escapee))
    done = service.run_to_end(job.id)
    assert done.state.value == "succeeded", done.message
    wait_for(lambda: not pids_running(f"sleep {escapee}"), timeout_s=5)


def test_terminate_kills_a_process_that_left_the_job(service: Service, escapee: str) -> None:
    job = service.submit(_escape(escapee) + "; sleep 120")
    log = Path(job.job_dir) / "stdouterr/rank.0/stdout"
    service.tick_until(job.id, lambda _: log.exists() and b"started" in log.read_bytes())
    assert pids_running(f"sleep {escapee}")
    service.service.terminate(job.id)
    assert service.run_to_end(job.id).state.value == "terminated"
    wait_for(lambda: not pids_running(f"sleep {escapee}"), timeout_s=5)


@pytest.mark.skipif(not HAS_CGROUPS, reason="no writable cgroup v2 hierarchy here")
def test_each_attempt_has_a_cgroup_removed_at_its_end(tmp_path: Path) -> None:
    s = Service(tmp_path, use_cgroups=True)
    job = s.submit("cat /proc/self/cgroup; sleep 1")
    running = s.tick_until(job.id, lambda j: j.state.value == "running")
    group = Path(s.store.get_launch(running.id)["cgroup"])
    assert group.is_dir()
    s.run_to_end(job.id)
    log = (Path(job.job_dir) / "stdouterr/rank.0/stdout").read_text()
    assert log.strip().endswith(group.name)
    assert not group.exists()
    # A runner killed with no server to release its attempt leaves its cgroup; a sweep ends it.
    job = s.submit("sleep 60")
    running = s.tick_until(job.id, lambda j: j.state.value == "running")
    group = Path(s.store.get_launch(running.id)["cgroup"])
    os.kill(s.store.get_launch(running.id)["pid"], signal.SIGKILL)
    assert cgroups.pids(group)  # the rank lives on, in the cgroup
    assert cgroups.JobCgroups.detect(s.executor.share.root).sweep() == 1
    assert not group.exists()
    s.service.tick()  # the service sees the attempt lost
    assert s.store.get_job(job.id).state.value == "failed"
    s.store.close()


def test_the_users_exit_code_is_the_jobs(home: Home, cli: CLI, tmp_path: Path) -> None:
    assert cli("cluster", "create", "c", "--nodes", "2")[0] == 0
    spec = tmp_path / "seven.yaml"
    spec.write_text(yaml.safe_dump({"name": "seven", "node_count": 2, "command":
                                    'if [ "$HOROVOD_RANK" = 1 ]; then exit 7; fi; sleep 30'}))
    rc, out, _ = cli("job", "submit", str(spec), "--cluster", "c")
    job_id = out.strip()
    assert rc == 0
    job = wait_for(lambda: (j := json.loads(cli("job", "show", job_id, "-o", "json")[1]))[
        "state"] in ("succeeded", "failed") and j, timeout_s=90)
    assert (job["state"], job["exit_code"]) == ("failed", 7)
    assert "rank 1 on node1 exited with code 7" in job["message"]
    assert "exit code:   7" in cli("job", "show", job_id)[1]


def test_a_command_the_kernel_cannot_pass_is_refused_at_submit(home: Home, cli: CLI,
                                                               tmp_path: Path) -> None:
    assert cli("cluster", "create", "c", "--nodes", "1")[0] == 0
    spec = tmp_path / "huge.yaml"
    spec.write_text(yaml.safe_dump({"node_count": 1, "command": "true " + "x" * 300_000}))
    rc, out, err = cli("job", "submit", str(spec), "--cluster", "c")
    assert rc == 2 and "Traceback" not in err
    assert "command:" in err and "300005" in err and "131071" in err
    assert json.loads(cli("job", "list", "-o", "json")[1]) == []


def test_a_runner_that_cannot_start_the_ranks_reports_why(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    (job_dir / "launcher").mkdir(parents=True)
    launch = LaunchSpec(job_dir=str(job_dir), attempt=0, command="true " + "x" * 200_000,
                        node_count=1, process_count_per_node=1, job_preparation=None,
                        runner=DEFAULT_RUNNER, nodes=(0,))
    launch.write(job_dir / LAUNCH_FILE)
    runner = subprocess.run([sys.executable, "-m",
                             "ringtrain.jobs.service.executors.local.jobrunner",
                             str(job_dir / LAUNCH_FILE)], capture_output=True, text=True,
                            timeout=60)
    status = RunnerStatus.read(job_dir)
    assert "Traceback" not in runner.stderr
    assert runner.returncode != 0 and status.phase is Phase.EXITED
    assert status.exit_code == runner.returncode
    assert "could not start `ringtrain run`: Argument list too long" in status.message
