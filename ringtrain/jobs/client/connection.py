"""Finding the job server of a home, starting one in the background, and stopping it.

The CLI needs no set-up: with no server running for ``RINGTRAIN_HOME`` it starts one as a
detached process (its own session, output in ``server.log``), which outlives the CLI and keeps
supervising jobs until ``ringtrain server stop``. Starting one says so on stderr, and says when
the home is new and which other homes have a server (:mod:`ringtrain.jobs.client.known_homes`): a
command run with another ``RINGTRAIN_HOME`` than the one that holds the jobs must not look like
a service that lost them.

A service elsewhere is chosen first when a flag, the environment or ``ringtrain login`` names
one (the order: :mod:`ringtrain.jobs.client.endpoint`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from ringtrain.jobs import envvars
from ringtrain.jobs.client.endpoint import Endpoint, given_endpoint, login_endpoint
from ringtrain.jobs.client.jobs_client import JobsClient
from ringtrain.jobs.client.known_homes import elsewhere_hint, remember
from ringtrain.jobs.errors import JobsError, ServiceUnavailableError
from ringtrain.jobs.home import Home, home_is_named, service_token
from ringtrain.jobs.server_info import ServerInfo
from ringtrain.proc_stat import is_alive

START_TIMEOUT_S = 30.0


def read_server_file(home: Home) -> ServerInfo | None:
    """The contents of ``server.json``, or ``None`` if there is none. Raises RecordError if it
    is there but malformed (the message says what to do)."""
    return ServerInfo.read(home.server_file)


def running_server(home: Home) -> ServerInfo | None:
    """The server of ``home`` if its process lives and answers, else ``None``. Raises
    RecordError if ``server.json`` is malformed."""
    info = read_server_file(home)
    if info is None or not is_alive(info.pid, None):
        return None
    try:
        client = JobsClient(info.url, info.token, timeout_s=5, fingerprint=info.fingerprint)
    except JobsError:
        return None
    try:
        if client.health().pid != info.pid:
            return None
    except JobsError:
        return None
    finally:
        client.close()
    return info


def start_server(home: Home, timeout_s: float = START_TIMEOUT_S, flags: Sequence[str] = (),
                 token: str | None = None) -> ServerInfo:
    """Start ``ringtrain server FLAGS`` for ``home`` in the background and wait until it
    answers; ``token`` reaches it through the environment (a command line is readable by every
    local account). Raises ServiceUnavailableError, quoting the end of ``server.log``, if it did
    not come up within ``timeout_s``."""
    home.ensure()
    remember(home)
    env = {**os.environ, envvars.HOME: str(home.root)}
    if token:
        env[envvars.TOKEN] = token
    with open(home.server_log, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ringtrain.cli", "server", *flags],
            env=env, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = running_server(home)
        if info is not None:  # ours, or one that a concurrent CLI started first
            return info
        if proc.poll() is not None and not home.server_file.exists():
            break
        time.sleep(0.05)
    tail = home.server_log.read_text(errors="replace")[-2000:] if home.server_log.exists() else ""
    raise ServiceUnavailableError(
        f"the job server for {home.root} did not start; end of {home.server_log}:\n{tail}")


def connect(home: Home | None = None, url: str | None = None, token: str | None = None,
            autostart: bool = True, fingerprint: str | None = None) -> JobsClient:
    """A client of the server at ``url`` (or ``RINGTRAIN_URL``), else of the named home's
    server, else of the current service of ``ringtrain login``, else of the default home's
    server (the order in full: :mod:`ringtrain.jobs.client.endpoint`).

    Args:
        home: the service home (default: ``RINGTRAIN_HOME``); given, it comes before a login.
        url: an explicit server; never auto-started.
        token: its bearer token (default: ``RINGTRAIN_TOKEN`` or ``RINGTRAIN_TOKEN_FILE``, the
            login's, or the one in server.json).
        autostart: start the home's server if none runs (also when the client reconnects);
            without, ServiceUnavailableError.
        fingerprint: the certificate an https ``url`` must show (default:
            ``RINGTRAIN_FINGERPRINT``, or the pin of a login at that URL).

    Raises:
        CertificateError: an https server shows another certificate than its pin.
        ServiceUnavailableError: no server answers (and none could be started).
    """
    endpoint = given_endpoint(url, token, fingerprint)
    if endpoint is None and home is None and not home_is_named():
        endpoint = login_endpoint(token)
    if endpoint is not None:
        return JobsClient.of(endpoint)
    token = token or service_token()
    home = home or Home.from_environ()

    def locate() -> Endpoint:
        # The home's server now: after a restart it may listen on another port.
        info = running_server(home)
        if info is None:
            hint = elsewhere_hint(home)
            if not autostart:
                raise ServiceUnavailableError(f"no job server runs for {home.root}"
                                              + (f"; {hint}" if hint else ""))
            new = not home.db_path.exists()
            info = start_server(home)
            print(f"ringtrain: started the job service for {home.root} (pid {info.pid}; log "
                  f"{home.server_log})" + ("; a new home: no clusters or jobs yet" if new else "")
                  + (f". {hint[0].upper()}{hint[1:]}" if hint else ""), file=sys.stderr)
        return Endpoint(info.url, token or info.token, info.fingerprint)

    return JobsClient.of(locate(), locate=locate)


def stop_server(home: Home, timeout_s: float = 15.0) -> ServerInfo | None:
    """Stop the home's server (SIGTERM, then SIGKILL past ``timeout_s``); jobs keep running.
    Returns the stopped server's info, or ``None`` if none ran."""
    info = read_server_file(home)
    if info is None or not is_alive(info.pid, None):
        home.server_file.unlink(missing_ok=True)
        return None
    os.kill(info.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while is_alive(info.pid, None):
        if time.monotonic() > deadline:
            os.kill(info.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    home.server_file.unlink(missing_ok=True)
    return info
