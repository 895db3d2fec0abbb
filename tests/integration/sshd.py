"""A real OpenSSH server on loopback for the launcher's ssh tests.

The fixture installs nothing: it uses Debian's ``openssh-server`` (scripts/setup.sh installs it)
with a host key, a user key and a config written to a temporary directory, listening on a free
port of 127.0.0.1 and 127.0.0.2. A rank placed on host ``127.0.0.2`` is not this machine to the
launcher (no interface has that address), so it is started over ssh, yet the traffic stays on
loopback. Tests are skipped, with the reason, only where sshd cannot run (not root, not
installed).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = "/usr/sbin/sshd"
REMOTE_HOST = "127.0.0.2"


@dataclass(frozen=True)
class SshServer:
    """A running sshd: log in to ``REMOTE_HOST`` on ``port`` with ``identity_file``."""

    port: int
    identity_file: str
    log_file: Path

    def launcher_flags(self) -> list[str]:
        """The `ringtrain run` flags that reach this server."""
        return ["-p", str(self.port), "-i", self.identity_file]


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "sshd must run as root to accept logins as the test user"
    for tool in (SSHD, shutil.which("ssh"), shutil.which("ssh-keygen")):
        if not tool or not os.access(tool, os.X_OK):
            return ("openssh-server/openssh-client are not installed "
                    "(scripts/setup.sh installs them)")
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _config(directory: Path, port: int) -> Path:
    config = directory / "sshd_config"
    config.write_text(f"""\
Port {port}
ListenAddress 127.0.0.1
ListenAddress {REMOTE_HOST}
HostKey {directory / "host_key"}
AuthorizedKeysFile {directory / "user_key.pub"}
PidFile {directory / "sshd.pid"}
PermitRootLogin yes
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
X11Forwarding no
PrintMotd no
MaxStartups 50
LogLevel VERBOSE
""")
    return config


def _wait_listening(port: int, process: subprocess.Popen, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            socket.create_connection((REMOTE_HOST, port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


@pytest.fixture(scope="session")
def sshd_server(tmp_path_factory) -> Iterator[SshServer]:
    """Start sshd for the session and stop it afterwards."""
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("sshd")
    for key in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                        str(directory / key)], check=True)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    log_file = directory / "sshd.log"
    for _ in range(3):  # the free port may be taken before sshd binds it
        port = _free_port()
        config = _config(directory, port)
        check = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, text=True)
        if check.returncode != 0:
            pytest.skip(f"sshd rejects the test configuration: {check.stderr.strip()}")
        process = subprocess.Popen([SSHD, "-D", "-f", str(config), "-E", str(log_file)],
                                   start_new_session=True)
        if _wait_listening(port, process):
            break
        process.kill()
        process.wait()
    else:
        pytest.fail(f"sshd did not start; see {log_file}")
    try:
        yield SshServer(port, str(directory / "user_key"), log_file)
    finally:
        process.terminate()
        process.wait(timeout=10)
