"""The records that cross process boundaries on the job path: launch handle, launch file, status
file and server.json. Each round-trips, reads the files of the version before it, and refuses a
malformed one with a RecordError naming the file and the field."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from ringtrain import proc_stat
from ringtrain.jobs.errors import RecordError
from ringtrain.jobs.models import JobInfo, JobState, parse_job_spec
from ringtrain.jobs.server_info import ServerInfo
from ringtrain.jobs.service.executors.local import jobrunner
from ringtrain.jobs.service.executors.local.executor import LocalExecutor
from ringtrain.jobs.service.executors.local.records import (
    LAUNCH_FILE,
    STATUS_FILE,
    LaunchSpec,
    RunnerHandle,
    RunnerStatus,
)
from ringtrain.jobs.service.executors.node_launch import (
    RESULT_FILE,
    WORLD_FILE,
    read_result,
    read_world,
)
from ringtrain.jobs.service.executors.phase import Phase
from ringtrain.jobs.service.share import Share
from ringtrain.run_files import LostWorker, RootCause, RunReport
from ringtrain.runner.cli import _write_result
from ringtrain.runner.elastic_agent import write_world
from ringtrain.runner.hosts import HostInfo, assign
from ringtrain.runner.result import RankOutcome, RankState, RunResult


def job_dir(tmp_path: Path) -> Path:
    (tmp_path / "job" / "launcher").mkdir(parents=True)
    return tmp_path / "job"


def test_launch_handle_round_trip_and_the_stored_form() -> None:
    handle = RunnerHandle(pid=41, start_ticks=900, attempt=2)
    assert handle.to_json() == {"pid": 41, "start_ticks": 900, "attempt": 2, "cgroup": None}
    assert RunnerHandle.from_json(json.loads(json.dumps(handle.to_json()))) == handle
    # start_ticks was read with a default before it was a record: a handle may lack it.
    assert RunnerHandle.from_json({"pid": 41, "attempt": 0}).start_ticks is None
    # Handles stored before attempts had cgroups have none.
    assert RunnerHandle.from_json({"pid": 41, "start_ticks": 9, "attempt": 0}).cgroup is None
    with_cgroup = RunnerHandle(41, 900, 2, "/sys/fs/cgroup/ringtrain-x-j-2")
    assert RunnerHandle.from_json(with_cgroup.to_json()) == with_cgroup


@pytest.mark.parametrize("data, why", [
    ({"start_ticks": 1, "attempt": 0}, "lacks the field 'pid'"),
    ({"pid": "41", "attempt": 0}, "field 'pid' must be int, not '41'"),
    ({"pid": True, "attempt": 0}, "field 'pid' must be int, not True"),
    ({"pid": 41, "start_ticks": 1.5, "attempt": 0}, "'start_ticks' must be int or null"),
    ([41, 0], "must be a JSON object, not list"),
])
def test_malformed_launch_handle(data: object, why: str) -> None:
    with pytest.raises(RecordError, match="the launch handle stored with the job") as raised:
        RunnerHandle.from_json(data)
    assert why in str(raised.value)


def launch_spec(directory: Path) -> LaunchSpec:
    return LaunchSpec(job_dir=str(directory), attempt=1, command="python t.py", node_count=2,
                      process_count_per_node=3, job_preparation=None,
                      runner=("python", "-m", "ringtrain.cli", "run"), nodes=(0, 2))


def test_launch_file_round_trip(tmp_path: Path) -> None:
    spec = launch_spec(job_dir(tmp_path))
    path = tmp_path / "job" / LAUNCH_FILE
    spec.write(path)
    assert LaunchSpec.read(path) == spec
    assert json.loads(path.read_text())["runner"] == ["python", "-m", "ringtrain.cli", "run"]
    old = {k: v for k, v in asdict(spec).items() if k != "cgroup"}  # before cgroups
    path.write_text(json.dumps(old))
    assert LaunchSpec.read(path) == spec


def test_result_file_as_the_runner_writes_it_for_a_failed_rank_a_killed_one_and_none(
        tmp_path: Path) -> None:
    directory = job_dir(tmp_path)
    assert read_result(directory) is None
    path = str(directory / RESULT_FILE)
    failed = RankOutcome(1, "localhost", RankState.FAILED, exit_code=7)
    ok = RankOutcome(0, "localhost", RankState.STOPPED)
    _write_result(path, RunResult((ok, failed), (failed,), None, 1))
    report = read_result(directory)
    assert report == RunReport(1, "rank 1 on localhost exited with code 7; stopped the other 1 "
                               "rank", (RootCause(1, "localhost", "failed", 7, None),))
    assert report.root_causes[0].exit_status == 7
    killed = RankOutcome(1, "localhost", RankState.FAILED, signal=9)
    _write_result(path, RunResult((killed,), (killed,), None, 0))
    assert read_result(directory).root_causes[0].exit_status == 137
    _write_result(path, RunResult((ok,), (), 15, 1))
    assert read_result(directory) == RunReport(143, "interrupted by signal SIGTERM; stopped 1 "
                                               "rank", ())
    (directory / RESULT_FILE).write_text('{"exit_code": 1, "message": "m"}')
    with pytest.raises(RecordError, match="result file .* lacks the field 'root_causes'"):
        read_result(directory)
    (directory / RESULT_FILE).write_text('{"exit_code": 1, "message": "m", "root_causes": [{"ra')
    with pytest.raises(RecordError, match="result file .*: not valid JSON"):
        read_result(directory)


@pytest.mark.parametrize("content, why", [
    (None, "does not exist"),
    ("{not json", "not valid JSON"),
    ('{"job_dir": "/j"}', "lacks the field 'attempt'"),
    ("runner", "not valid JSON"),
])
def test_malformed_launch_file(tmp_path: Path, content: str | None, why: str) -> None:
    path = tmp_path / "launch.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(RecordError, match=f"the launch file {path}") as raised:
        LaunchSpec.read(path)
    assert why in str(raised.value)


def test_launch_file_with_a_wrong_list(tmp_path: Path) -> None:
    data = {**asdict(launch_spec(tmp_path)), "nodes": ["0"]}
    (tmp_path / "launch.json").write_text(json.dumps(data))
    with pytest.raises(RecordError, match=r"field 'nodes' must be a list of int, not \['0'\]"):
        LaunchSpec.read(tmp_path / "launch.json")


def test_job_runner_refuses_a_malformed_launch_file(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "launch.json"
    path.write_text('{"job_dir": "/j", "attempt": "first"}')
    assert jobrunner.main([str(path)]) == 2
    assert "field 'attempt' must be int, not 'first'" in capsys.readouterr().err


def test_job_runner_and_its_records_load_no_third_party_package() -> None:
    # The job runner must start quickly, and the records it shares with the executor come along.
    code = ("import sys, ringtrain.jobs.service.executors.local.jobrunner; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'pydantic', 'fastapi', 'httpx', 'yaml', 'torch', 'numpy'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_status_round_trip_and_absence(tmp_path: Path) -> None:
    directory = job_dir(tmp_path)
    assert RunnerStatus.read(directory) is None
    for status in (RunnerStatus(Phase.RUNNING, attempt=0, pid=7),
                   RunnerStatus(Phase.EXITED, 1, 7, exit_code=3, message="see x", stopped=True)):
        status.write(directory)
        assert RunnerStatus.read(directory) == status
    assert json.loads((directory / STATUS_FILE).read_text())["phase"] == "exited"


def test_status_files_of_the_previous_version_read(tmp_path: Path) -> None:
    # What the job runner wrote before the status became a record.
    directory = job_dir(tmp_path)
    (directory / STATUS_FILE).write_text('{"phase": "preparing", "attempt": 0, "pid": 12}')
    assert RunnerStatus.read(directory) == RunnerStatus(Phase.PREPARING, 0, 12)
    (directory / STATUS_FILE).write_text(json.dumps(
        {"phase": "exited", "attempt": 0, "pid": 12, "exit_code": 1, "message": "m",
         "stopped": False}))
    assert RunnerStatus.read(directory) == RunnerStatus(Phase.EXITED, 0, 12, 1, "m")


@pytest.mark.parametrize("content, why", [
    ('{"phase": "done", "attempt": 0, "pid": 1}', "unknown phase 'done'"),
    ('{"phase": "lost", "attempt": 0, "pid": 1}', "never reports itself lost"),
    ('{"phase": "exited", "attempt": 0, "pid": 1}', "an exited status needs an exit code"),
    ('{"attempt": 0, "pid": 1}', "lacks the field 'phase'"),
    ('{"phase": "running", "pid": 1}', "lacks the field 'attempt'"),
    ("", "not valid JSON"),
])
def test_malformed_status_file(tmp_path: Path, content: str, why: str) -> None:
    directory = job_dir(tmp_path)
    (directory / STATUS_FILE).write_text(content)
    with pytest.raises(RecordError, match="the job runner's status file") as raised:
        RunnerStatus.read(directory)
    assert why in str(raised.value)


def test_malformed_status_file_ends_the_attempt_with_the_reason(tmp_path: Path) -> None:
    share = Share(tmp_path / "share")
    job = JobInfo(id="j1", cluster="c", spec=parse_job_spec({"node_count": 1, "command": "true"}),
                  state=JobState.RUNNING, created_at=0.0, job_dir=str(job_dir(tmp_path)))
    (Path(job.job_dir) / STATUS_FILE).write_text('{"phase": "running"}')
    # This very process stands in for a live job runner.
    live = RunnerHandle(os.getpid(), proc_stat.start_ticks(os.getpid()), attempt=0)
    seen = LocalExecutor(share).poll(job, live)
    assert seen.phase is Phase.LOST
    assert "status file" in seen.message and "lacks the field 'attempt'" in seen.message


def test_server_info_round_trip_private_and_previous_version(tmp_path: Path) -> None:
    path = tmp_path / "server.json"
    assert ServerInfo.read(path) is None
    info = ServerInfo(pid=5, url="http://127.0.0.1:8000", host="127.0.0.1", port=8000,
                      token="s3", home="/h", started_at=1.5)
    info.write(path)
    assert ServerInfo.read(path) == info
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # `server status -o json` prints these keys, in this order, as it always did; a file of a
    # server older than TLS (no fingerprint) is read as plain HTTP, and the new key comes last.
    old = {"pid": 5, "url": "http://127.0.0.1:8000", "host": "127.0.0.1", "port": 8000,
           "token": None, "home": "/h", "started_at": 1.5}
    path.write_text(json.dumps(old))
    assert ServerInfo.read(path).model_dump(mode="json") == {**old, "fingerprint": None}
    assert list(ServerInfo.read(path).model_dump()) == [*old, "fingerprint"]


@pytest.mark.parametrize("content, why", [
    ('{"url": "http://x"}', "pid: Field required"),
    ('{"pid": "me", "url": "u", "host": "h", "port": 1, "home": "/h", "started_at": 0}',
     "pid: Input should be a valid integer"),
    ("[]", "Input should be an object"),
    ("{", "Invalid JSON"),
])
def test_malformed_server_file(tmp_path: Path, content: str, why: str) -> None:
    path = tmp_path / "server.json"
    path.write_text(content)
    with pytest.raises(RecordError, match="is not a job server record") as raised:
        ServerInfo.read(path)
    assert why in str(raised.value) and "delete the file" in str(raised.value)


def test_record_file_that_cannot_be_read(tmp_path: Path) -> None:
    (tmp_path / "server.json").mkdir()
    with pytest.raises(RecordError, match="cannot read .*server.json: .*is a folder"):
        ServerInfo.read(tmp_path / "server.json")


def test_world_file_as_the_runner_writes_it_and_the_hosts_it_lost(tmp_path: Path) -> None:
    folder = job_dir(tmp_path)
    assert read_world(folder) is None  # before the first world formed
    slots = assign([HostInfo("n0", 2), HostInfo("n1", 1), HostInfo("n2", 1)], 4)
    lost = [LostWorker(2, "n1", 1, "worker 2 on n1 exited with code 3"),
            LostWorker(3, "n2", 1, "worker 3 on n2 was killed by signal SIGKILL")]
    # The loss is written before the world re-forms: n1 and n2 have no live worker left.
    write_world(str(folder / WORLD_FILE), 1, dict(enumerate(slots)), lost[:1])
    world = read_world(folder)
    assert world.hosts == {"n0": (0, 1), "n1": (2,), "n2": (3,)}
    assert world.lost_hosts() == ["n1"]
    # World 2 left n1 out; n2's worker failed in it, and a new one (4) joined n1 again later.
    write_world(str(folder / WORLD_FILE), 2, {0: slots[0], 1: slots[1], 3: slots[3]}, lost)
    assert read_world(folder).lost_hosts() == ["n1", "n2"]
    write_world(str(folder / WORLD_FILE), 3, {0: slots[0], 1: slots[1], 4: slots[2]}, lost)
    assert read_world(folder).lost_hosts() == ["n2"]
    (folder / WORLD_FILE).write_text('{"generation": 1, "hosts": {"n0": [0]}, "lost": [{}]}')
    with pytest.raises(RecordError, match="lacks the field 'worker'"):
        read_world(folder)


def test_one_checker_names_the_field_in_every_kind_of_record(tmp_path: Path) -> None:
    """`ringtrain run`'s files, the job runner's records and the worker env go through one field
    checker (ringtrain/record_fields.py): the same wrong value is refused in the same words,
    whichever record it is in, and each reader adds which record that was."""
    from ringtrain.contract.env import read_worker_env
    from ringtrain.errors import ConfigError
    from ringtrain.record_fields import FieldError

    with pytest.raises(FieldError, match=r"^field 'exit_code' must be int, not True$"):
        RunReport.from_json({"exit_code": True, "message": "", "root_causes": []})
    with pytest.raises(RecordError, match=r"^the launch handle stored with the job: field 'pid' "
                                          r"must be int, not True$"):
        RunnerHandle.from_json({"pid": True, "attempt": 0})
    folder = job_dir(tmp_path)
    (folder / RESULT_FILE).write_text('{"exit_code": 1, "message": "m"}')
    with pytest.raises(RecordError, match=r"the result file .*result\.json: lacks the field "
                                          r"'root_causes'$"):
        read_result(folder)
    (folder / STATUS_FILE).write_text('{"phase": "gone", "attempt": 0, "pid": 1}')
    with pytest.raises(RecordError, match=r"status\.json: has an unknown phase 'gone'$"):
        RunnerStatus.read(folder)
    with pytest.raises(ConfigError, match=r"^environment variable HOROVOD_RANK='x' is not an "
                                          r"integer$"):
        read_worker_env({"HOROVOD_RANK": "x", "HOROVOD_SIZE": "2"})
    with pytest.raises(ConfigError, match=r"^environment variable HOROVOD_SIZE is required but "
                                          r"not set$"):
        read_worker_env({"HOROVOD_RANK": "0", "HOROVOD_SIZE": " "})


def test_a_status_file_behind_a_linked_folder_is_refused(tmp_path: Path) -> None:
    """Records are read through the one safe open: a link is refused in any component below the
    job's folder (here `launcher/` itself), not only at the file's own name."""
    folder = tmp_path / "job"
    folder.mkdir()
    elsewhere = job_dir(tmp_path / "elsewhere")
    RunnerStatus(Phase.RUNNING, attempt=0, pid=7).write(elsewhere)
    assert RunnerStatus.read(elsewhere) is not None
    (folder / "launcher").symlink_to(elsewhere / "launcher")
    with pytest.raises(RecordError, match="goes through the symbolic link 'launcher'"):
        RunnerStatus.read(folder)
