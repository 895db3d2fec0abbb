"""Connection floods (issue 35) against real server processes on loopback, the job service and
``ringtrain serve`` alike: connections that never finish their request header are closed after
the header timeout; one address over its cap loses its oldest waiting connection, not the new
one; when every connection under the cap holds a request the next gets 503 with
``Retry-After`` at once; and a flood far beyond the caps, on a server with few descriptors,
leaves health answering and the log with counted lines, not a traceback per connection.

Every client is this process, so every connection comes from 127.0.0.1, as on a machine whose
local clients and a local flood share that address.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch

from ringtrain.models.cifar_cnn import CifarCNN
from ringtrain.models.saved import ModelInfo, save_model
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"

# Each server runs in a process of its own, with its connection limits given to its `serve`.
JOB_SERVICE = f"""
import json, logging, sys
from pathlib import Path
from ringtrain.jobs.home import Home
from ringtrain.jobs.service.api.server import serve
from ringtrain.web.connection_limits import ConnectionLimits
logging.basicConfig(level=logging.INFO, format={LOG_FORMAT!r})
serve(Home(Path(sys.argv[1])), limits=ConnectionLimits(**json.loads(sys.argv[2])))
"""
MODEL_SERVER = f"""
import json, logging, sys
from pathlib import Path
from ringtrain.serve.config import ServeConfig
from ringtrain.serve.server import serve
from ringtrain.web.connection_limits import ConnectionLimits
logging.basicConfig(level=logging.INFO, format={LOG_FORMAT!r})
config = ServeConfig(port=0, connections=ConnectionLimits(**json.loads(sys.argv[2])))
serve(Path(sys.argv[1]), config, on_ready=lambda url: print("READY", url, flush=True))
"""


@dataclass(frozen=True)
class Server:
    """A server process under test: where it listens, how to ask its health, its log."""

    port: int
    health: str  # the health route
    token: str | None
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get_health(self) -> httpx.Response:
        """Health over a new connection (bounded; never a speed goal)."""
        return httpx.get(self.url + self.health, headers=self.headers, timeout=30)

    def raw_request(self, head: str) -> bytes:
        """A request's first line and headers as bytes, with this server's Host and token."""
        lines = [head, f"Host: 127.0.0.1:{self.port}"]
        lines += [f"{k}: {v}" for k, v in self.headers.items()]
        return ("\r\n".join(lines) + "\r\n").encode()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kwargs = {"num_classes": 3, "in_channels": 1, "image_size": 12}
    out = tmp_path_factory.mktemp("model")
    torch.manual_seed(0)
    save_model(out, CifarCNN(**kwargs), ModelInfo(arch="cifar_cnn", task="classification",
                                                  classes=["a", "b", "c"], kwargs=kwargs,
                                                  input_shape=[1, 12, 12]))
    return out


Start = Callable[..., Server]


@pytest.fixture(params=["jobs", "serve"])
def start(request: pytest.FixtureRequest, tmp_path: Path, model_dir: Path) -> Iterator[Start]:
    """Starts the job service or the model server with the connection limits given as keyword
    arguments (``open_files``: its ``ulimit -n``); stops it at the end."""
    with ExitStack() as stack:
        def starter(open_files: int | None = None, **limits: object) -> Server:
            return stack.enter_context(_server(request.param, tmp_path, model_dir, open_files,
                                               limits))
        yield starter


@contextmanager
def _server(kind: str, tmp: Path, model_dir: Path, open_files: int | None,
            limits: dict[str, object]) -> Iterator[Server]:
    script, target = (JOB_SERVICE, tmp / "home") if kind == "jobs" else (MODEL_SERVER, model_dir)
    log_path = tmp / f"{kind}.log"
    command = [sys.executable, "-c", script, str(target), json.dumps(limits)]
    if open_files is not None:  # the server's own descriptor limit, not this process's
        command = ["sh", "-c", f'ulimit -n {open_files} && exec "$@"', "sh", *command]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RINGTRAIN_HOME": str(tmp / "home")}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        def listening() -> Server | None:
            assert proc.poll() is None, f"the server exited:\n{log_path.read_text()[-3000:]}"
            if kind == "jobs":
                info = tmp / "home" / "server.json"
                if not info.exists():
                    return None
                record = json.loads(info.read_text())
                return Server(record["port"], "/v1/health", record["token"], log_path)
            ready = [line for line in log_path.read_text().splitlines()
                     if line.startswith("READY ")]
            return Server(int(ready[0].rsplit(":", 1)[1]), "/v2/health/live", None,
                          log_path) if ready else None

        server = wait_until(listening, f"the {kind} server started", timeout_s=120, every_s=0.1)

        def answering() -> bool:
            try:  # the job service writes server.json just before it listens
                return server.get_health().status_code == 200
            except httpx.TransportError:
                return False

        wait_until(answering, f"the {kind} server answering health")
        yield server
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def _connect(server: Server, n: int, send: bytes = b"") -> list[socket.socket]:
    """``n`` connections to ``server``, each having sent ``send`` (and nothing after)."""
    socks = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        if send:
            sock.sendall(send)
        socks.append(sock)
    return socks


def _wait_closed(socks: list[socket.socket], timeout_s: float) -> dict[socket.socket, float]:
    """When the server closed each of ``socks`` (``time.monotonic()``), reading whatever it
    sent before; fails naming how many are still open after ``timeout_s``."""
    closed: dict[socket.socket, float] = {}
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while len(closed) < len(socks):
            left = deadline - time.monotonic()
            assert left > 0, (f"{len(socks) - len(closed)} of {len(socks)} connections still "
                              f"open after {timeout_s:g} s")
            for key, _ in selector.select(min(left, 0.5)):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                if not data:
                    closed[sock] = time.monotonic()
                    selector.unregister(sock)
    return closed


def _is_open(sock: socket.socket) -> bool:
    """Nothing to read and no end of stream: the server still holds it."""
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        return not selector.select(0)


def test_connections_that_never_finish_their_header_are_closed_after_the_header_timeout(
        start: Start) -> None:
    server = start(header_timeout_s=1.0, per_address=1000)
    opened = time.monotonic()
    socks = _connect(server, 300, server.raw_request("GET / HTTP/1.1"))  # no blank line: unfinished
    try:
        closed = _wait_closed(socks, timeout_s=60)
        assert min(closed.values()) - opened >= 1.0  # not before their time
        assert server.get_health().status_code == 200
    finally:
        for sock in socks:
            sock.close()


def test_one_address_over_its_cap_replaces_its_oldest_waiting_connection(start: Start) -> None:
    server = start(header_timeout_s=120.0, per_address=20)
    socks = _connect(server, 20, server.raw_request("GET / HTTP/1.1"))  # unfinished headers
    try:
        assert server.get_health().status_code == 200  # the 21st from 127.0.0.1
        _wait_closed(socks[:1], timeout_s=30)
        assert all(_is_open(sock) for sock in socks[1:])
    finally:
        for sock in socks:
            sock.close()


def test_when_every_connection_of_an_address_holds_a_request_the_next_gets_503(
        start: Start) -> None:
    server = start(header_timeout_s=120.0, per_address=3)
    upload = server.raw_request("POST /anywhere HTTP/1.1") + (
        b"Content-Length: 100\r\nExpect: 100-continue\r\n\r\n")
    busy = _connect(server, 3, upload)
    try:
        for sock in busy:  # the app waits for the body: each holds a request
            assert sock.recv(1024).startswith(b"HTTP/1.1 100 "), "no 100 Continue"
        refused = server.get_health()
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "1" and refused.headers["connection"] == "close"
        assert "each with a request under way" in refused.json()["detail"]
        busy.pop().close()  # a place again: health gets in once the server saw it go
        wait_until(lambda: server.get_health().status_code == 200, "health after a close")
    finally:
        for sock in busy:
            sock.close()


def test_health_answers_through_a_flood_beyond_the_caps_and_the_log_stays_small(
        start: Start) -> None:
    # 256 descriptors: at most 192 connections, 48 from one address; the flood sends 1,000 that
    # never finish their header, and keeps them open: those past the 48 are turned away as they
    # are accepted, and health, a whole request, takes the place of the oldest.
    server = start(open_files=256)
    before = len(server.log())
    flood = _connect(server, 1000, server.raw_request("GET / HTTP/1.1"))
    try:
        for _ in range(3):
            assert server.get_health().status_code == 200
        wait_until(lambda: "turned away" in server.log(), "the limits' counted line")
        grown = server.log()[before:]
        assert "Traceback" not in grown and len(grown) < 10_000, grown[:3000]
    finally:
        for sock in flood:
            sock.close()
