"""A deployment of several replicas through a real job service on loopback: the service runs a
front for it on its own port, whose URL is in the deployment's record (`deployment show`,
`deployment list`, the REST API); requests through it take turns at the real `ringtrain serve`
replicas; a replica that stops answering is taken out and put back once healthy; the front
comes back on its port after the service restarts and stops with the deployment. One replica
needs no front: its own URL is the deployment's."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from ringtrain.jobs.client.connection import stop_server
from ringtrain.jobs.home import Home
from ringtrain.jobs.server_info import ServerInfo
from ringtrain.jobs.service.executors.local import procs

from .conftest import CLI, bearer, wait_for
from .test_deploy import INPUT, trained_job


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Home, str]]:
    """A 2-node cluster's service and a job that saved a tiny classifier."""
    with trained_job(tmp_path_factory.mktemp("front"), nodes=2) as found:
        yield found


def _show(cli: CLI, dep_id: str) -> dict[str, Any]:
    rc, out, err = cli("deployment", "show", dep_id, "-o", "json")
    assert rc == 0, err
    return json.loads(out)


def _infer(url: str) -> None:
    r = httpx.post(f"{url}/v2/models/model/infer", json=INPUT, timeout=60)
    assert r.status_code == 200 and r.json()["outputs"][0]["shape"] == [1, 3], r.text


def _served(url: str) -> int:
    """Inference requests a replica answered, from its own Prometheus metrics."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("ringtrain_serve_requests_total{") and "infer" in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def _server_pid(dep_id: str, replica: int) -> int:
    """The `ringtrain serve` process of one replica of a deployment."""
    for pid in procs.job_pids(dep_id):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in cmdline and f"HOROVOD_RANK={replica}".encode() in environ:
            return pid
    raise AssertionError(f"no server process of replica {replica} of {dep_id}")


def deployment_api(home: Home, dep_id: str) -> dict[str, Any]:
    """The deployment as the REST API answers it (faster than the CLI, to catch a state)."""
    url = ServerInfo.read(home.server_file).url
    r = httpx.get(f"{url}/v1/deployments/{dep_id}", headers=bearer(home), timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


@contextmanager
def deployed(cli: CLI, home: Home, job_id: str, *options: str,
             replicas: int = 2) -> Iterator[dict[str, Any]]:
    """A ready deployment of ``replicas`` of ``job_id``, made with ``options``; stopped at the
    end whatever happened, its nodes free again for the next test (a test that failed with
    its deployment running left the next one waiting for nodes)."""
    rc, out, err = cli("job", "deploy", job_id, "--replicas", str(replicas), *options,
                       "--wait", "300", "-o", "json")
    deployment = json.loads(out)
    try:
        assert rc == 0, err
        yield deployment
    finally:
        cli("deployment", "stop", deployment["id"])  # refused if it ended already
        wait_for(lambda: deployment_api(home, deployment["id"])["job"]["state"] in
                 ("terminated", "failed", "succeeded"), timeout_s=120, every_s=0.2)


@pytest.mark.timeout(600)  # processes that import torch, on a busy host
def test_the_service_runs_a_front_for_several_replicas(
        trained: tuple[Home, str], cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    home, job_id = trained
    monkeypatch.setenv("RINGTRAIN_HOME", str(home.root))
    with deployed(cli, home, job_id) as deployment:
        dep_id, front, urls = deployment["id"], deployment["url"], deployment["urls"]
        assert deployment["state"] == "ready" and len(urls) == 2
        assert front.startswith("http://127.0.0.1:") and front not in urls  # a port of its own
        # In the record, through the REST API as it is, and in `deployment list`.
        server = ServerInfo.read(home.server_file)
        rest = httpx.get(f"{server.url}/v1/deployments/{dep_id}", headers=bearer(home),
                         timeout=30)
        assert rest.json()["url"] == front and rest.json()["job"]["front"] == front
        rc, out, _ = cli("deployment", "list")
        assert rc == 0 and front in out.splitlines()[1]

        # Both replicas pass their health checks, and take turns.
        wait_for(lambda: sorted(_show(cli, dep_id)["healthy"]) == sorted(urls), timeout_s=30,
                 every_s=0.2)
        rc, out, _ = cli("deployment", "show", dep_id)
        assert f"url:         {front}   (front: each request to the next healthy replica; 2 of " \
               "2 healthy)" in out
        before = [_served(u) for u in urls]
        for _ in range(6):
            _infer(front)
        gained = [_served(u) - b for u, b in zip(urls, before)]
        assert sum(gained) == 6 and min(gained) >= 1, gained

        # Replica 1 stops answering: it is taken out, every request goes to replica 0, and it is
        # put back once it answers again.
        stopped = _server_pid(dep_id, 1)
        os.kill(stopped, signal.SIGSTOP)
        try:
            wait_for(lambda: _show(cli, dep_id)["healthy"] == [urls[0]], timeout_s=60,
                     every_s=0.2)
            rc, out, _ = cli("deployment", "show", dep_id)
            assert f"replica 1:   {urls[1]}   (out: failed its last health check)" in out
            before_0 = _served(urls[0])
            for _ in range(4):
                _infer(front)
            assert _served(urls[0]) - before_0 == 4
        finally:
            os.kill(stopped, signal.SIGCONT)
        wait_for(lambda: sorted(_show(cli, dep_id)["healthy"]) == sorted(urls), timeout_s=60,
                 every_s=0.2)
        before = [_served(u) for u in urls]
        for _ in range(4):
            _infer(front)
        assert min(_served(u) - b for u, b in zip(urls, before)) >= 1  # back in the turns

        # The service stops: so does the front (the replicas keep serving); back with the
        # service, on the same port.
        stop_server(home)
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{front}/v2/health/ready", timeout=10)
        assert httpx.get(f"{urls[0]}/v2/health/ready", timeout=10).status_code == 200
        assert _show(cli, dep_id)["url"] in (front, None)  # this call starts the service again
        wait_for(lambda: _show(cli, dep_id)["url"] == front, timeout_s=60, every_s=0.2)
        wait_for(lambda: len(_show(cli, dep_id)["healthy"]) == 2, timeout_s=60, every_s=0.2)
        _infer(front)

        # Stopped, the deployment takes its front with it.
        rc, out, _ = cli("deployment", "stop", dep_id, "-o", "json")
        assert rc == 0 and json.loads(out)["url"] is None
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{front}/v2/health/live", timeout=5)
        wait_for(lambda: _show(cli, dep_id)["state"] == "stopped", timeout_s=60, every_s=0.2)


@pytest.mark.timeout(300)
def test_one_replica_needs_no_front(trained: tuple[Home, str], cli: CLI,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    home, job_id = trained
    monkeypatch.setenv("RINGTRAIN_HOME", str(home.root))
    with deployed(cli, home, job_id, replicas=1) as deployment:
        assert deployment["url"] == deployment["urls"][0] and deployment["job"]["front"] is None
        _infer(deployment["url"])
        rc, out, _ = cli("deployment", "stop", deployment["id"])
        assert rc == 0
