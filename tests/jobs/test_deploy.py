"""Deployments end to end: a real job service on loopback runs a job that saves a tiny model,
`ringtrain job deploy` serves it with real `ringtrain serve` replicas, which answer over HTTP,
outlive a restart of the service (found again, not started twice) and stop; `ringtrain serve
JOB_ID` fetches the model through the service. Plus the choice of the model, pure (the state
rules are in test_deploy_failover.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ringtrain.jobs.client.connection import connect, stop_server
from ringtrain.jobs.errors import ConflictError, InvalidRequestError, NotFoundError
from ringtrain.jobs.home import Home
from ringtrain.jobs.models import ClusterSpec, FileInfo, JobInfo, parse_job_spec
from ringtrain.jobs.models.deployment import servable_model
from ringtrain.jobs.service.executors.local import procs

from .conftest import CLI, wait_for
from .test_e2e import spec_file

SAVE_TINY_MODEL = (
    "python -c \"import os, torch; from ringtrain.models.cifar_cnn import CifarCNN; "
    "from ringtrain.models.saved import ModelInfo, save_model; "
    "kw = dict(num_classes=3, in_channels=1, image_size=12); torch.manual_seed(0); "
    "save_model(os.environ['RINGTRAIN_OUTPUT_MODEL'], CifarCNN(**kw), ModelInfo("
    "arch='cifar_cnn', task='classification', classes=['a', 'b', 'c'], kwargs=kw, "
    "input_shape=[1, 12, 12]))\"")
INPUT = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 1, 12, 12],
                     "data": [0.5] * 144}]}


def _job(state: str, serves: str | None = None) -> JobInfo:
    return JobInfo(id="j-000000", cluster="c", spec=parse_job_spec({"node_count": 2,
                                                                    "command": "x"}),
                   state=state, created_at=0.0, serves=serves)


def _files(*paths: str) -> list[FileInfo]:
    return [FileInfo(path=p, size=1, modified_at=0.0) for p in paths]


def test_the_shallowest_model_folder_wins_and_many_outputs_are_walked_not_kept() -> None:
    # A checkpoint deeper than the final model, sorted before it, is not what gets served.
    files = _files("outputs/a/ckpt/model.json", "outputs/a/ckpt/model.pt",
                   "outputs/model/model.json", "outputs/model/model.pt")
    assert servable_model(_job("succeeded"), iter(files)) == "outputs/model"

    def outputs() -> Iterator[FileInfo]:
        for i in range(200_000):
            yield FileInfo(path=f"outputs/o/d{i // 1000:04d}/f{i % 1000:04d}", size=100,
                           modified_at=0.0)
        yield from _files("outputs/zz/model.json", "outputs/zz/model.pt")

    tracemalloc.start()
    try:
        assert servable_model(_job("succeeded"), outputs()) == "outputs/zz"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 5 * 2**20, f"finding the model held {peak / 2**20:.0f} MiB"
    # A job that did not succeed is refused before its outputs are walked.
    walked = []
    with pytest.raises(ConflictError):
        servable_model(_job("running"), (walked.append(f) or f for f in files))
    assert walked == []


def test_the_model_is_a_folder_with_both_files_of_a_succeeded_job() -> None:
    files = _files("outputs/log.txt", "outputs/ckpt/model.pt", "outputs/model/model.json",
                   "outputs/model/model.pt")
    assert servable_model(_job("succeeded"), files) == "outputs/model"
    with pytest.raises(NotFoundError, match="saved no model.*model.json and model.pt"):
        servable_model(_job("succeeded"), files[:3])
    with pytest.raises(ConflictError, match="is running: only a job that succeeded"):
        servable_model(_job("running"), files)
    with pytest.raises(InvalidRequestError, match="is a deployment"):
        servable_model(_job("succeeded", serves="t-123456"), files)


@contextlib.contextmanager
def trained_job(root: Path, nodes: int) -> Iterator[tuple[Home, str]]:
    """A service home under ``root`` with a cluster of ``nodes`` nodes and a job that saved a
    tiny classifier; the server is stopped and every job process killed at the end."""
    home = Home(root / "home")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RINGTRAIN_HOME", str(home.root))
        env.delenv("RINGTRAIN_URL", raising=False)
        env.delenv("RINGTRAIN_TOKEN", raising=False)
        client = connect(home=home)
        try:
            client.create_cluster(ClusterSpec(name="local", nodes=nodes, slots=1))
            job = client.submit("local", parse_job_spec({
                "name": "tiny", "node_count": 1, "command": SAVE_TINY_MODEL,
                "outputs": ["model"]}))
            done = wait_for(lambda: (j := client.get_job(job.id)).state.is_terminal() and j,
                            timeout_s=120, every_s=0.2)
            assert done.state.value == "succeeded", done.message
            yield home, job.id
        finally:
            client.close()
            stop_server(home)
            for job_dir in (home.share_root / "jobs").iterdir():
                for pid in procs.job_pids(job_dir.name):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Home, str]]:
    """A 3-node cluster's service and a job that saved a tiny classifier."""
    with trained_job(tmp_path_factory.mktemp("deploy"), nodes=3) as found:
        yield found


@pytest.mark.timeout(600)  # with the module's job: processes that import torch, on a busy host
def test_two_replicas_serve_survive_a_restart_and_stop(
        trained: tuple[Home, str], cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    home, job_id = trained
    monkeypatch.setenv("RINGTRAIN_HOME", str(home.root))
    rc, out, err = cli("job", "deploy", job_id, "--replicas", "2", "--wait", "300", "-o", "json")
    assert rc == 0, err
    deployment = json.loads(out)
    assert deployment["state"] == "ready" and deployment["serves"] == job_id
    urls = deployment["urls"]
    assert len(urls) == 2 and len(set(urls)) == 2
    assert all(u.startswith("http://127.0.0.1:") for u in urls)
    for url in urls:
        r = httpx.post(f"{url}/v2/models/model/infer", json=INPUT, timeout=30)
        assert r.status_code == 200 and r.json()["outputs"][0]["shape"] == [1, 3]
    dep_id = deployment["id"]
    rc, out, _ = cli("job", "list", "-o", "json")  # listed beside the jobs, marked
    assert {j["id"]: j["serves"] for j in json.loads(out)} == {job_id: None, dep_id: job_id}

    # The service restarts (it may come back on another port): the replicas keep serving and are
    # found again, not started a second time.
    servers = sorted(procs.job_pids(dep_id))
    stop_server(home)
    assert httpx.get(f"{urls[1]}/v2/health/ready", timeout=10).json() == {"ready": True}
    rc, out, _ = cli("deployment", "list", "-o", "json")
    (again,) = json.loads(out)
    assert (again["id"], again["state"], again["urls"]) == (dep_id, "ready", urls)
    assert sorted(procs.job_pids(dep_id)) == servers

    rc, out, _ = cli("deployment", "logs", dep_id, "--replica", "1")
    assert rc == 0 and f"at {urls[1]}" in out
    rc, out, _ = cli("deployment", "stop", dep_id, "-o", "json")
    assert rc == 0 and json.loads(out)["state"] in ("stopping", "stopped")
    wait_for(lambda: cli("deployment", "show", dep_id, "-o", "json")[1].find('"stopped"') > 0,
             timeout_s=30, every_s=0.2)
    assert wait_for(lambda: not procs.job_pids(dep_id), timeout_s=10)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{urls[0]}/v2/health/live", timeout=5)
    rc, _, err = cli("deployment", "show", job_id)
    assert rc == 1 and "is a job, not a deployment" in err


def test_deploy_refuses_what_cannot_be_served(trained: tuple[Home, str], cli: CLI,
                                              monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    home, job_id = trained
    monkeypatch.setenv("RINGTRAIN_HOME", str(home.root))
    rc, out, _ = cli("job", "submit", spec_file(tmp_path, "nomodel", node_count=1,
                                                command="true"), "--cluster", "local", "--follow")
    nomodel = out.splitlines()[0]
    assert rc == 0
    rc, _, err = cli("job", "deploy", nomodel)
    assert rc == 1 and f"job {nomodel} saved no model in its outputs" in err
    rc, out, _ = cli("job", "submit", spec_file(tmp_path, "busy", node_count=1,
                                                command="sleep 60"), "--cluster", "local")
    busy = out.strip()
    rc, _, err = cli("job", "deploy", busy)
    assert rc == 1 and f"job {busy} is " in err and "only a job that succeeded" in err
    cli("job", "terminate", busy)
    rc, _, err = cli("job", "deploy", job_id, "--replicas", "0")
    assert rc == 2 and "replicas" in err


def test_serve_job_id_fetches_the_model_and_names_a_port_in_use(trained: tuple[Home, str]) -> None:
    home, job_id = trained
    env = {**os.environ, "RINGTRAIN_HOME": str(home.root), "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "ringtrain.cli", "serve", job_id,
                                 "--port", str(port)], capture_output=True, text=True,
                                env=env, timeout=120, check=False)
    assert result.returncode == 2, result.stderr
    assert f"fetched the model of job {job_id}" in result.stdout
    assert f"port {port} of 127.0.0.1 is in use" in result.stderr
    result = subprocess.run([sys.executable, "-m", "ringtrain.cli", "serve", "nosuch-abcdef"],
                            capture_output=True, text=True, env=env, timeout=120, check=False)
    assert result.returncode == 2 and "no job with id 'nosuch-abcdef'" in result.stderr


def test_serve_job_id_leaves_no_copy_of_the_model_after_sigterm(trained: tuple[Home, str],
                                                               tmp_path: Path) -> None:
    home, job_id = trained
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "RINGTRAIN_HOME": str(home.root), "TMPDIR": str(scratch),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                          os.environ.get("PYTHONPATH", "")])}
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([sys.executable, "-m", "ringtrain.cli", "serve", job_id, "--port",
                             "0", "--ready-file", str(ready)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(ready.exists, timeout_s=120)
        url = json.loads(ready.read_text())["url"]
        assert httpx.get(f"{url}/v2/health/ready", timeout=10).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert f"fetched the model of job {job_id}" in out, err
    assert list(scratch.iterdir()) == []  # the fetched copy is gone


def test_a_replica_that_cannot_load_the_model_fails_the_deployment_and_says_why(
        trained: tuple[Home, str], cli: CLI, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    home, _ = trained
    monkeypatch.setenv("RINGTRAIN_HOME", str(home.root))
    broken = ('cd "$RINGTRAIN_OUTPUT_MODEL" && echo \'{"arch": "nonesuch"}\' > model.json '
              '&& echo junk > model.pt')
    rc, out, _ = cli("job", "submit", spec_file(tmp_path, "broken", node_count=1, command=broken,
                                                outputs=["model"]), "--cluster", "local",
                     "--follow")
    assert rc == 0
    rc, out, err = cli("job", "deploy", out.splitlines()[0], "--wait", "120")
    assert rc == 1 and "state:       failed" in out
    assert "end of replica 0's stderr" in err and "ringtrain serve:" in err
    assert "is not a model's metadata" in err
