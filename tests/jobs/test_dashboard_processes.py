"""What the dashboard shows of running jobs besides their curves: progress from their step
scalars (step, rate, ETA when they declare a total), each rank's CPU and memory, and a rank's
stack dump by py-spy. Real files, real process trees, and a real server on loopback running a
real 2-rank job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ringtrain.jobs.client.connection import connect, read_server_file
from ringtrain.jobs.errors import ConflictError, ServiceUnavailableError
from ringtrain.jobs.home import Home
from ringtrain.jobs.models import ClusterSpec, parse_job_spec
from ringtrain.jobs.service.api.auth import home_token
from ringtrain.jobs.service.api.guard import cookie_name, cookie_value
from ringtrain.jobs.service.monitor.job_usage import find_ranks
from ringtrain.jobs.service.monitor.progress import MAX_READS_PER_LOOK, JobProgress
from ringtrain.jobs.service.monitor.stack_dump import dump_stack, find_py_spy
from tests.clock import FakeClock

from .conftest import bearer, wait_for

# A rank of the job below: step profiler records (declaring 1000 steps) every 0.05 s, inside a
# function whose name the stack dump must show, until the test creates `release`.
RANK_SCRIPT = '''
import json, os, time
from pathlib import Path

job = Path(os.environ["RINGTRAIN_JOB_DIR"])
rank = int(os.environ["HOROVOD_RANK"])


def train_in_a_function_named_for_the_test():
    (job / "metrics").mkdir(exist_ok=True)
    with open(job / "metrics" / f"steps.rank{rank}.jsonl", "a") as f:
        for step in range(1000):
            f.write(json.dumps({"step": step, "time": time.time(), "step_ms": 50.0,
                                "total_steps": 1000}) + "\\n")
            f.flush()
            if (job / "release").exists():
                return
            time.sleep(0.05)


train_in_a_function_named_for_the_test()
'''

needs_py_spy = pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed "
                                  "(pip install py-spy; the jobs extra has it)")


def _steps(path: Path, records: list[dict]) -> None:
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def test_progress_is_the_largest_step_its_rate_and_an_eta_once_a_total_is_declared(
        tmp_path: Path) -> None:
    (tmp_path / "metrics").mkdir()
    steps = tmp_path / "metrics" / "steps.rank0.jsonl"
    clock = FakeClock()
    progress = JobProgress(tmp_path, clock)
    assert progress.read() is None  # nothing logged yet
    _steps(steps, [{"step": i, "time": 1000.0 + i * 0.5, "step_ms": 500.0} for i in range(11)])
    got = progress.read()  # found at once: no wait for the next scan while nothing was there
    assert got == {"step": 10, "steps_per_s": 2.0, "total_steps": None, "eta_s": None,
                   "source": "metrics/steps.rank0.jsonl"}
    reads = progress.reads
    assert progress.read() == got and progress.reads == reads  # unchanged file: not read again
    # The job declares its total (the step profiler's `note(total_steps=...)`).
    _steps(steps, [{"step": 11, "time": 1005.5, "step_ms": 500.0, "total_steps": 111}])
    got = progress.read()
    assert progress.reads == reads + 1
    assert got is not None and got["step"] == 11 and got["total_steps"] == 111
    assert got["eta_s"] == pytest.approx(100 / 2.0)
    # A half-written record is not taken, and the file is read again once it is whole.
    with open(steps, "a") as f:
        f.write('{"step": 12, "time": 1006.0, "st')
    assert progress.read()["step"] == 11
    with open(steps, "a") as f:
        f.write('ep_ms": 500.0}\n')
    assert progress.read()["step"] == 12


def test_one_look_reads_a_bounded_number_of_files_and_the_rest_next_time(tmp_path: Path) -> None:
    (tmp_path / "metrics").mkdir()
    ranks = MAX_READS_PER_LOOK + 8
    for rank in range(ranks):  # rank r reached step r
        _steps(tmp_path / "metrics" / f"steps.rank{rank}.jsonl",
               [{"step": rank, "time": 1.0, "step_ms": 1.0}])
    progress = JobProgress(tmp_path, FakeClock())
    first = progress.read()
    assert progress.reads == MAX_READS_PER_LOOK and first is not None
    assert first["step"] < ranks - 1
    assert progress.read()["step"] == ranks - 1 and progress.reads == ranks  # the others' turn
    assert progress.read()["step"] == ranks - 1 and progress.reads == ranks  # nothing new


def test_progress_reads_tensorboard_steps_and_the_total_steps_tag(tmp_path: Path) -> None:
    from ringtrain.torch.summary_writer import without_tensorflow

    without_tensorflow()  # the stub writes the same file without TensorFlow's import
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(tmp_path / "outputs" / "tb"))

    def scalar(tag: str, step: int, wall: float, value: float) -> None:
        v = summary_pb2.Summary.Value(tag=tag, simple_value=value)
        writer.add_event(event_pb2.Event(wall_time=wall, step=step,
                                         summary=summary_pb2.Summary(value=[v])))

    scalar("total_steps", 0, 100.0, 5000.0)
    for step in range(0, 401, 100):  # 100 steps every 10 s
        scalar("loss", step, 100.0 + step / 10, 1.0)
    writer.close()
    got = JobProgress(tmp_path, FakeClock()).read()
    assert got is not None and got["step"] == 400 and got["steps_per_s"] == 10.0
    assert got["total_steps"] == 5000 and got["eta_s"] == 460.0
    assert got["source"].startswith("outputs/tb/events.out.tfevents")


def test_ranks_are_found_below_the_runner_by_the_task_wrapper_and_their_environment() -> None:
    # A "runner" starting one rank as the launcher does: the task wrapper, with the rank's
    # variables, running `sh -c` and Python below it.
    rank_cmd = f"{sys.executable} -c 'import time; time.sleep(60)'; true"
    runner = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.run(sys.argv[1:])",
         sys.executable, "-m", "ringtrain.runner.task", "--token", "t", "--",
         "sh", "-c", rank_cmd],
        env={**os.environ, "HOROVOD_RANK": "3", "RANK": "3"}, stdin=subprocess.PIPE,
        start_new_session=True)
    try:
        ranks = wait_for(lambda: [r for r in find_ranks(runner.pid) if len(r.pids) >= 2],
                         timeout_s=30)
        assert [r.rank for r in ranks] == [3]
        main = ranks[0].main
        assert main is not None and main != ranks[0].pids[0]  # the Python below `sh -c`
        assert b"time.sleep(60)" in Path(f"/proc/{main}/cmdline").read_bytes()
        assert find_ranks(main) == []  # nothing below the rank's own process
    finally:
        os.killpg(runner.pid, signal.SIGKILL)
        runner.wait(timeout=30)


@needs_py_spy
def test_a_stack_dump_names_the_function_a_process_is_in() -> None:
    script = ("import time\n"
              "def waiting_in_a_function_named_for_the_test():\n"
              "    time.sleep(120)\n"
              "print('ready', flush=True)\n"
              "waiting_in_a_function_named_for_the_test()\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    other = subprocess.Popen(["sleep", "120"])
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        text = dump_stack(proc.pid)
        assert "waiting_in_a_function_named_for_the_test" in text and "Thread" in text
        with pytest.raises(ConflictError, match=f"could not dump process {other.pid}"):
            dump_stack(other.pid)  # not Python
    finally:
        for p in (proc, other):
            p.kill()
            p.wait(timeout=30)


def test_without_py_spy_the_dump_says_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(ServiceUnavailableError, match="pip install py-spy"):
        dump_stack(os.getpid(), py_spy=str(tmp_path / "no-py-spy"))


@needs_py_spy
@pytest.mark.timeout(300)
def test_a_running_jobs_progress_ranks_and_stack_dump_through_the_api(
        home: Home, tmp_path: Path) -> None:
    client = connect(home=home)
    client.create_cluster(ClusterSpec(name="c", nodes=1, slots=2))
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "rank.py").write_text(RANK_SCRIPT)
    job = client.submit("c", parse_job_spec({
        "name": "prog", "node_count": 1, "process_count_per_node": 2,
        "command": f"{sys.executable} rank.py", "working_dir": str(wd)}))
    info = read_server_file(home)
    with httpx.Client(base_url=info.url, headers=bearer(home), timeout=60) as http:
        def progress() -> dict | None:
            got = http.get("/v1/progress").json().get(job.id)
            return got if got and got["eta_s"] is not None else None

        p = wait_for(progress)
        assert p["total_steps"] == 1000 and 0 < p["step"] < 1000 and p["steps_per_s"] > 0
        assert p["eta_s"] == pytest.approx((1000 - p["step"]) / p["steps_per_s"], rel=0.01)

        def two_ranks() -> list | None:
            got = http.get(f"/v1/jobs/{job.id}/ranks").json()["ranks"]
            return got if len(got) == 2 and all(r["pid"] for r in got) else None

        first = wait_for(two_ranks)
        assert [r["rank"] for r in first] == [0, 1]
        assert all(r["memory"] > 1 << 20 and r["processes"] >= 1 for r in first)
        def shares() -> list | None:  # past the sampler's period, a sample has CPU shares
            got = http.get(f"/v1/jobs/{job.id}/ranks").json()["ranks"]
            return got if all(r["cpu_percent"] is not None for r in got) else None

        second = wait_for(shares, timeout_s=30, every_s=0.2)
        assert len(second) == 2 and all(r["cpu_percent"] >= 0 for r in second)

        r = http.post(f"/v1/jobs/{job.id}/ranks/1/stack")
        assert r.status_code == 200, r.text
        assert r.json()["pid"] == first[1]["pid"]
        assert "train_in_a_function_named_for_the_test" in r.json()["text"]
        assert http.post(f"/v1/jobs/{job.id}/ranks/7/stack").status_code == 404
        # The dashboard's cookie alone (a form of another local page) cannot ask for one.
        token = home_token(home)
        cookie = {"Cookie": f"{cookie_name(token)}={cookie_value(token)}"}
        assert httpx.post(f"{info.url}/v1/jobs/{job.id}/ranks/0/stack", headers=cookie,
                          timeout=30).status_code == 403

        (Path(client.get_job(job.id).job_dir) / "release").write_text("")
        wait_for(lambda: client.get_job(job.id).state.is_terminal(), timeout_s=120)
        assert job.id not in http.get("/v1/progress").json()  # only running jobs
        ended = http.get(f"/v1/jobs/{job.id}/ranks").json()
        assert ended["ranks"] == [] and "no processes" in ended["reason"]
        r = http.post(f"/v1/jobs/{job.id}/ranks/0/stack")
        assert r.status_code == 409 and "no processes" in r.json()["detail"]
        assert http.get("/v1/jobs/nope-000000/ranks").status_code == 404
    client.close()
