"""``ringtrain server FLAGS...`` in a process of its own, as its owner starts it: for the tests
of flags that the CLI's background server never gets (``--tls``, ``--host``, ``--insecure``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from ringtrain.jobs.client.connection import running_server
from ringtrain.jobs.errors import JobsError
from ringtrain.jobs.home import Home
from ringtrain.jobs.server_info import ServerInfo
from tests.waiting import stop_process


@dataclass(frozen=True)
class RunningServer:
    """A server started by :func:`foreground_server`: its record and what it printed."""

    info: ServerInfo
    log_path: Path

    @property
    def url(self) -> str:
        return self.info.url

    @property
    def fingerprint(self) -> str | None:
        return self.info.fingerprint

    def log(self) -> str:
        """What the server printed so far."""
        return self.log_path.read_text(errors="replace")


@contextmanager
def foreground_server(home: Home, *flags: str, timeout_s: float = 60) -> Iterator[RunningServer]:
    """Start the server of ``home`` with ``flags``; yield it once it answers (through the
    client, so over TLS with its pin); stop it (SIGTERM) on exit."""
    home.ensure()
    log_path = home.root / f"server.{time.monotonic_ns()}.log"
    env = {**os.environ, "RINGTRAIN_HOME": str(home.root)}
    env.pop("RINGTRAIN_URL", None)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ringtrain.cli", "server", *flags],
                                env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        yield RunningServer(_answering(home, proc, log_path, timeout_s), log_path)
    finally:
        stop_process(proc)


def _answering(home: Home, proc: subprocess.Popen[bytes], log: Path, timeout_s: float
               ) -> ServerInfo:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            info = running_server(home)
        except JobsError:
            info = None
        if info is not None and info.pid == proc.pid:
            return info
        time.sleep(0.1)
    pytest.fail(f"the server did not answer within {timeout_s} s:\n{log.read_text()[-3000:]}")
