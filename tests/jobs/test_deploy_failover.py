"""One dead replica does not take a deployment down (issue 35).

End to end, through a real job service on loopback and real `ringtrain serve` replicas: under
clients posting inferences through the front, `kill -9` of one replica's server fails no request
(the front sends those it had in flight to the other replica), leaves the other replica
running, reads `degraded` with 1 of 2 healthy, and the replica serves again on its port; a
replica that keeps dying spends its restart budget and fails, the deployment stays up on the
other until that one fails too, and then reads `failed` saying why. The ports a deployment asks
for are used, or refused naming the port.

Faster tiers: the keeper of one replica against a fake server (restarts, backoff, budget, a
server that refuses to start, a port in use, a stop), the front against a replica that drops
a request mid-way, and the state rules, pure.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import socketserver
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from ringtrain.jobs.cli.output import deployment_text
from ringtrain.jobs.errors import InvalidRequestError
from ringtrain.jobs.files.record_file import read_record
from ringtrain.jobs.home import Home
from ringtrain.jobs.models import JobInfo, parse_job_spec
from ringtrain.jobs.models.deployment import (
    DeploymentInfo,
    DeploymentState,
    check_ports,
    deployment_message,
    deployment_state,
    replica_statuses,
)
from ringtrain.jobs.replica_record import ReplicaRecord, ReplicaState
from ringtrain.jobs.service.front_proxy import Backends, create_front
from ringtrain.jobs.service.replica_keeper import ReplicaKeeper, backoff_s

from .conftest import CLI, wait_for
from .test_deploy import INPUT, trained_job
from .test_deploy_front import _served, _server_pid, deployed, deployment_api

# -- the state rules, pure --------------------------------------------------------------------

SERVING = ReplicaRecord(ReplicaState.SERVING, "http://127.0.0.1:1")
RESTARTING = ReplicaRecord(ReplicaState.RESTARTING, "http://127.0.0.1:2", 1, 5,
                           "`ringtrain serve` was killed by SIGKILL; restart 1 of 5 in 0.5 s")
FAILED = ReplicaRecord(ReplicaState.FAILED, "http://127.0.0.1:2", 5, 5, "it died 6 times")


def _job(state: str, message: str = "") -> JobInfo:
    return JobInfo(id="j-000000", cluster="c", spec=parse_job_spec({"node_count": 2,
                                                                    "command": "x"}),
                   state=state, created_at=0.0, serves="t-000000", message=message)


def _state(job_state: str, *records: ReplicaRecord | None,
           out: tuple[str, ...] = ()) -> DeploymentState:
    return deployment_state(_job(job_state), replica_statuses(records, out))


def test_a_deployment_is_degraded_while_a_replica_is_down_and_failed_once_none_is_left() -> None:
    assert _state("running", None, None) == DeploymentState.STARTING
    assert _state("running", SERVING, None) == DeploymentState.STARTING  # 1 of 2 loading
    assert _state("running", SERVING, SERVING) == DeploymentState.READY
    assert _state("running", SERVING, RESTARTING) == DeploymentState.DEGRADED
    assert _state("running", None, RESTARTING) == DeploymentState.DEGRADED
    assert _state("running", SERVING, FAILED) == DeploymentState.DEGRADED
    assert _state("running", FAILED, FAILED) == DeploymentState.FAILED
    # Serving, but out of the front's turns (it failed its last health check): not ready.
    assert _state("running", SERVING, SERVING, out=(SERVING.url or "",)) == \
        DeploymentState.DEGRADED
    assert _state("terminating", SERVING, SERVING) == DeploymentState.STOPPING
    assert _state("terminated") == DeploymentState.STOPPED
    assert _state("failed") == DeploymentState.FAILED
    assert _state("succeeded") == DeploymentState.FAILED  # the keepers gave up
    # The message says why each replica that does not serve does not, once it matters.
    said = deployment_message(_job("running"), DeploymentState.DEGRADED, [SERVING, RESTARTING])
    assert said == f"replica 1 restarting: {RESTARTING.message}"
    assert deployment_message(_job("terminated", "stopped"), DeploymentState.STOPPED,
                              [SERVING, RESTARTING]) == "stopped"


def test_deployment_show_says_how_many_are_healthy_and_why_one_is_not() -> None:
    job = _job("running")
    statuses = replica_statuses([SERVING, RESTARTING])
    info = DeploymentInfo(id=job.id, serves="t-000000", state=DeploymentState.DEGRADED,
                          replicas=2, urls=[SERVING.url or ""], url="http://127.0.0.1:9",
                          healthy=[SERVING.url or ""], replica_status=statuses,
                          message="m", job=job)
    text = deployment_text(info)
    assert "state:       degraded" in text
    assert "(front: each request to the next healthy replica; 1 of 2 healthy)" in text
    assert f"replica 0:   {SERVING.url}   (healthy)" in text
    assert f"replica 1:   {RESTARTING.url}   (restarting: {RESTARTING.message})" in text


def test_a_replica_record_round_trips_and_an_old_announcement_reads_as_serving(
        tmp_path: Path) -> None:
    RESTARTING.write(tmp_path / "r.json")
    assert read_record(tmp_path, "r.json", "r", ReplicaRecord.from_json) == RESTARTING
    (tmp_path / "old.json").write_text(json.dumps({"url": "http://127.0.0.1:5", "pid": 7}))
    assert read_record(tmp_path, "old.json", "old", ReplicaRecord.from_json) == \
        ReplicaRecord(ReplicaState.SERVING, "http://127.0.0.1:5")


def test_ports_out_of_range_or_colliding_are_refused_naming_them() -> None:
    check_ports(2, 8000, 8001)
    check_ports(1, 0, 65535)
    with pytest.raises(InvalidRequestError, match="ports 65535..65536 must lie within"):
        check_ports(2, 0, 65535)
    with pytest.raises(InvalidRequestError, match=r"front's port must be 1..65535.*got 70000"):
        check_ports(2, 70000, 0)
    with pytest.raises(InvalidRequestError, match="port 8001 cannot be both the front's and "
                                                  "replica 1's"):
        check_ports(3, 8001, 8000)
    with pytest.raises(InvalidRequestError, match="one replica has no front"):
        check_ports(1, 8000, 0)


# -- the keeper of one replica, against a fake server ----------------------------------------

FAKE_SERVER = """
import json, os, socket, sys, time
mode, opts = sys.argv[1], dict(zip(sys.argv[2::2], sys.argv[3::2]))
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(opts["--port"] + "\\n")
if mode == "refuse":
    print("ringtrain serve: no model here", file=sys.stderr)
    sys.exit(2)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((opts["--host"], int(opts["--port"])))
s.listen()
ready = opts["--ready-file"]
with open(ready + ".tmp", "w") as f:
    json.dump({"url": f"http://127.0.0.1:{s.getsockname()[1]}"}, f)
os.replace(ready + ".tmp", ready)
if mode == "crash":
    sys.exit("boom")
if mode == "taken":  # as a server refused its port on a restart
    sys.exit(2)
time.sleep(120)
"""


@pytest.fixture
def fake_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A fake `ringtrain serve` script and the file where it logs the port of each start."""
    script, log = tmp_path / "fake_serve.py", tmp_path / "starts.log"
    script.write_text(FAKE_SERVER)
    monkeypatch.setenv("FAKE_LOG", str(log))
    return script, log


def _keeper(script: Path, mode: str, record: Path, **kw: Any) -> ReplicaKeeper:
    return ReplicaKeeper([sys.executable, str(script), mode], record, **kw)


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff_s(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert backoff_s(20) == 30.0


@pytest.mark.timeout(120)
def test_a_server_that_keeps_dying_is_restarted_on_its_port_with_backoff_until_the_budget_is_spent(
        fake_server: tuple[Path, Path], tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    script, log = fake_server
    record = tmp_path / "replica.0.json"
    keeper = _keeper(script, "crash", record, max_restarts=3, first_backoff_s=0.01)
    assert keeper.run() == 0  # given up, but not failing: the launcher would stop the others
    got = ReplicaRecord.from_json(json.loads(record.read_text()))
    assert got.state is ReplicaState.FAILED and got.restarts == 3
    assert got.message.startswith("`ringtrain serve` exited with code 1 (boom); it died 4 times "
                                  "in a row, and its restart budget is 3")
    ports = log.read_text().split()
    port = got.url.rsplit(":", 1)[1] if got.url else ""
    assert ports == ["0", port, port, port]  # a free port first, then the same one
    err = capfd.readouterr().err
    assert "boom" in err  # the server's stderr still reaches the replica's log
    assert [line.rsplit("restart ", 1)[1] for line in err.splitlines()
            if "restarting:" in line] == ["1 of 3 in 0.01 s", "2 of 3 in 0.02 s",
                                          "3 of 3 in 0.04 s"]


@pytest.mark.timeout(120)
def test_a_server_that_refuses_to_start_or_a_port_in_use_is_not_restarted(
        fake_server: tuple[Path, Path], tmp_path: Path) -> None:
    script, log = fake_server
    record = tmp_path / "replica.0.json"
    assert _keeper(script, "refuse", record, first_backoff_s=0.01).run() == 0
    got = ReplicaRecord.from_json(json.loads(record.read_text()))
    assert got.state is ReplicaState.FAILED and got.url is None
    assert got.message == ("`ringtrain serve` exited with code 2 (ringtrain serve: no model "
                           "here) before it served: starting it again cannot help")
    assert log.read_text().split() == ["0"]  # started once
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert _keeper(script, "serve", record, port=port).run() == 0
    got = ReplicaRecord.from_json(json.loads(record.read_text()))
    assert got.state is ReplicaState.FAILED
    assert got.message.startswith(f"port {port} of 127.0.0.1 is in use: choose other replica "
                                  "ports (`ringtrain job deploy --replica-port`)")
    assert log.read_text().split() == ["0"]  # never started
    # A server refused on a restart (it served before) is started again; on a free port if
    # its port was a free one, which any connection may have taken meanwhile.
    log.unlink()
    assert _keeper(script, "taken", record, max_restarts=1, first_backoff_s=0.01).run() == 0
    assert log.read_text().split() == ["0", "0"]


@pytest.mark.timeout(120)
def test_a_stopped_keeper_stops_its_server_and_starts_no_other(
        fake_server: tuple[Path, Path], tmp_path: Path) -> None:
    script, log = fake_server
    record = tmp_path / "replica.0.json"
    keeper = _keeper(script, "serve", record, first_backoff_s=0.01)
    outcome: list[int] = []
    thread = threading.Thread(target=lambda: outcome.append(keeper.run()), daemon=True)
    thread.start()
    wait_for(lambda: record.exists(), timeout_s=60)
    assert ReplicaRecord.from_json(json.loads(record.read_text())).state is ReplicaState.SERVING
    keeper.on_signal(signal.SIGTERM, None)
    thread.join(60)
    assert outcome == [0] and log.read_text().split() == ["0"]


# -- the front, against a replica that drops a request mid-way -------------------------------

class _Replica(socketserver.ThreadingTCPServer):
    """A raw HTTP replica: answers its health checks; answers requests, or (``drops``) closes
    the connection without an answer, as a server killed mid-request does."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, drops: bool):
        self.drops = drops
        self.requests = 0
        super().__init__(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(socketserver.StreamRequestHandler):
    server: _Replica

    def handle(self) -> None:
        line = self.rfile.readline().decode()
        length = 0
        while (header := self.rfile.readline().decode().strip()):
            name, _, value = header.partition(":")
            length = int(value) if name.lower() == "content-length" else length
        self.rfile.read(length)
        if not line.startswith("GET /v2/health"):
            self.server.requests += 1
            if self.server.drops:
                return  # closed, no answer
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")


@contextmanager
def _front(backends: Backends) -> Iterator[str]:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    # Health checks far apart: the replica that drops is found out by a request, not a check.
    server = uvicorn.Server(uvicorn.Config(create_front(backends, health_every_s=60),
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout_s=30)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.mark.timeout(120)
def test_the_front_sends_a_request_a_replica_dropped_to_the_next_one() -> None:
    dropping, good = _Replica(drops=True), _Replica(drops=False)
    try:
        with _front(Backends([dropping.url, good.url])) as front:
            for _ in range(6):
                r = httpx.post(f"{front}/v2/models/model/infer", json=INPUT, timeout=30)
                assert r.status_code == 200, r.text
        assert (dropping.requests, good.requests) == (1, 6)  # tried once, then out
    finally:
        dropping.shutdown()
        good.shutdown()


# -- end to end: a real service, real replicas ------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Home, str]]:
    """A 2-node cluster's service and a job that saved a tiny classifier."""
    with trained_job(tmp_path_factory.mktemp("failover"), nodes=2) as found:
        yield found


def _live(home: Home, dep_id: str) -> dict[str, Any]:
    """The deployment, which must still serve (the test fails at once if it went down)."""
    d = deployment_api(home, dep_id)
    assert d["state"] in ("starting", "ready", "degraded"), \
        f"the deployment went down: {d['state']}: {d['message']}"
    return d


def _front_log(home: Home) -> list[str]:
    """What the deployment's front logged in the service's log."""
    return [line for line in home.server_log.read_text().splitlines() if "front" in line]


def _free_ports(count: int) -> int:
    """A base port with ``count`` free ports from it, below the system's ephemeral ports (which
    any connection may take at any time), as a user picks ports."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for base in range(max(1024, low - 8000), low - count, count):
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
                    s.listen()
            return base
        except OSError:
            continue
    raise AssertionError(f"no {count} free ports in a row below {low}")


class _Clients:
    """``count`` threads posting inferences to ``url`` one after another until stopped; every
    answer but a 200 is kept as a failure."""

    def __init__(self, url: str, count: int):
        self.url = url
        self.ok = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._post, daemon=True) for _ in range(count)]
        for t in self._threads:
            t.start()

    def _post(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                try:
                    r = client.post(f"{self.url}/v2/models/model/infer", json=INPUT)
                    failure = None if r.status_code == 200 else f"{r.status_code} {r.text}"
                except httpx.HTTPError as e:
                    failure = repr(e)
                with self._lock:
                    if failure is None:
                        self.ok += 1
                    else:
                        self.failures.append(failure)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(90)


@pytest.mark.timeout(600)  # processes that import torch, on a busy host
def test_a_killed_replica_fails_no_request_and_serves_again_on_its_port(
        trained: tuple[Home, str], cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    home, job_id = trained
    monkeypatch.setenv("RINGTRAIN_HOME", str(home.root))
    base = _free_ports(3)
    port = base + 2
    with deployed(cli, home, job_id, "--port", str(port), "--replica-port", str(base)) as \
            deployment:
        dep_id, front, urls = deployment["id"], deployment["url"], deployment["urls"]
        assert front == f"http://127.0.0.1:{port}"  # the ports asked for
        assert urls == [f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"]
        survivor = _server_pid(dep_id, 0)
        clients = _Clients(front, 4)
        try:
            wait_for(lambda: clients.ok >= 20 or clients.failures, timeout_s=120)
            assert clients.failures == [], clients.failures  # before any kill
            os.kill(_server_pid(dep_id, 1), signal.SIGKILL)
            # Down: degraded, 1 of 2 healthy, the other replica alone in the front's turns.
            down = wait_for(lambda: (d := _live(home, dep_id))["replica_status"][1]["state"]
                            == "restarting" and d, timeout_s=60, every_s=0.02)
            assert down["state"] == "degraded" and down["healthy"] == [urls[0]], down
            assert "replica 1 restarting: `ringtrain serve` was killed by SIGKILL; restart 1 " \
                "of 5" in down["message"], down
            # Back: ready, 2 of 2, on the same port, after one restart.
            back = wait_for(lambda: (d := _live(home, dep_id))["state"] == "ready" and d,
                            timeout_s=120, every_s=0.1)
            assert sorted(back["healthy"]) == sorted(urls) and back["urls"] == urls
            assert back["replica_status"][1]["restarts"] == 1
            before = clients.ok
            wait_for(lambda: _served(urls[1]) >= 3 and clients.ok >= before + 20,
                     timeout_s=120)
        finally:
            clients.stop()
        # the front retried those in flight (its own account of each 503 is in the log)
        assert clients.failures == [], (clients.failures, _front_log(home))
        assert _server_pid(dep_id, 0) == survivor  # the healthy replica ran throughout


@pytest.mark.timeout(600)
def test_a_replica_that_keeps_dying_fails_and_the_deployment_fails_when_none_is_left(
        trained: tuple[Home, str], cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    home, job_id = trained
    monkeypatch.setenv("RINGTRAIN_HOME", str(home.root))
    with deployed(cli, home, job_id, "--max-restarts", "1") as deployment:
        dep_id, front, urls = deployment["id"], deployment["url"], deployment["urls"]

        def kill_until_failed(replica: int) -> dict[str, Any]:
            os.kill(_server_pid(dep_id, replica), signal.SIGKILL)
            wait_for(lambda: (r := _live(home, dep_id)["replica_status"][replica])["state"]
                     == "serving" and r["restarts"] == 1, timeout_s=120, every_s=0.1)
            os.kill(_server_pid(dep_id, replica), signal.SIGKILL)
            return wait_for(lambda: (d := deployment_api(home, dep_id))["replica_status"][replica]
                            ["state"] == "failed" and d, timeout_s=60, every_s=0.1)

        one_left = kill_until_failed(1)
        assert one_left["state"] == "degraded" and one_left["healthy"] == [urls[0]], one_left
        assert "replica 1 failed: `ringtrain serve` was killed by SIGKILL; it died 2 times in " \
               "a row, and its restart budget is 1" in one_left["message"]
        r = httpx.post(f"{front}/v2/models/model/infer", json=INPUT, timeout=60)
        assert r.status_code == 200  # still served, by the replica left
        kill_until_failed(0)
        gone = wait_for(lambda: (d := deployment_api(home, dep_id))["state"] == "failed" and d,
                        timeout_s=60)
        assert "replica 0 failed:" in gone["message"] and "replica 1 failed:" in gone["message"]
        rc, out, _ = cli("deployment", "show", dep_id)
        assert rc == 0 and "state:       failed" in out and "restart budget is 1" in out
        # The job ends by itself (every keeper gave up) and the deployment stays failed.
        wait_for(lambda: deployment_api(home, dep_id)["job"]["state"] in ("succeeded", "failed"),
                 timeout_s=60, every_s=0.2)
        assert deployment_api(home, dep_id)["state"] == "failed"


@pytest.mark.timeout(300)
def test_ports_in_use_are_refused_naming_them(trained: tuple[Home, str], cli: CLI,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    home, job_id = trained
    monkeypatch.setenv("RINGTRAIN_HOME", str(home.root))
    before = cli("deployment", "list", "-o", "json")[1]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc, _, err = cli("job", "deploy", job_id, "--replicas", "2", "--port", str(port))
        assert rc == 1 and f"the front cannot listen on port {port} of 127.0.0.1" in err, err
        assert cli("deployment", "list", "-o", "json")[1] == before  # nothing was made
        rc, _, err = cli("job", "deploy", job_id, "--replicas", "2", "--replica-port", "65535")
        assert rc == 2 and "ports 65535..65536 must lie within 1..65535" in err, err
        # A replica's port is its node's: the replica refuses it there, before loading.
        rc, out, err = cli("job", "deploy", job_id, "--replica-port", str(port), "--wait", "120")
    assert rc == 1 and "state:       failed" in out, out + err
    assert f"port {port} of 127.0.0.1 is in use" in err, err
