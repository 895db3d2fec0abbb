"""Keep one replica of a deployment serving: run ``ringtrain serve``, start it again when it dies.

Each rank of a deployment's job runs this rather than the server itself, because the launcher
stops every rank of a job as soon as one fails: right for training, where a world short of a
rank is useless, but one dead server must not take the other replicas down. So the rank (this
process) outlives its server and starts another after a backoff (:data:`FIRST_BACKOFF_S`,
doubling, at most :data:`MAX_BACKOFF_S`), as a kubelet restarts a container, on the same port;
each change goes into the replica's record (:mod:`ringtrain.jobs.replica_record`), from which
the service reads the deployment's state and its front the replicas to send requests to.

It gives up when its server died more than ``--max-restarts`` times in a row (one that served
:data:`RESET_AFTER_S` starts a new row), or when the server refused to start before it ever
served (exit code 2: a model that does not load, a port in use; starting it again cannot help).
It then records why and exits 0: a failing rank would make the launcher stop the replicas that
still serve, and the deployment reads ``failed`` once none is left.

    python -m ringtrain.jobs.service.replica_keeper --record FILE [--port P] [--max-restarts N]
        -- SERVE_ARGS...

runs ``ringtrain serve SERVE_ARGS --host 127.0.0.1 --port P --ready-file ...``. Standard library
only, to start quickly.
"""

from __future__ import annotations

import argparse
import errno
import json
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from ringtrain.jobs.replica_record import DEFAULT_MAX_RESTARTS, ReplicaRecord, ReplicaState

#: Where every replica listens (the deployment's servers take no token).
HOST = "127.0.0.1"
#: The wait before the first restart in a row; each next one waits twice as long, at most
#: MAX_BACKOFF_S.
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
#: A server that served this long since it started has its deaths in a row forgotten (as a
#: kubelet resets its back-off after 10 minutes of a container running well).
RESET_AFTER_S = 600.0
#: ``ringtrain serve``'s exit code for input it refuses (its model, its flags, its address).
EXIT_REFUSED = 2
_POLL_S = 0.05


def backoff_s(restart: int, first_s: float = FIRST_BACKOFF_S) -> float:
    """The wait before the ``restart``-th restart in a row (1, 2, ...)."""
    return min(first_s * 2 ** (restart - 1), MAX_BACKOFF_S)


def port_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on ``host:port`` now, or ``None`` if it could."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            s.bind((host, port))
            s.listen()
        except OSError as e:
            what = "is in use" if e.errno == errno.EADDRINUSE else f"cannot be bound ({e.strerror})"
            return f"port {port} of {host} {what}"
    return None


class ReplicaKeeper:
    """Runs one replica's server until stopped, restarting it as the module says.

    Args:
        command: the server's command line, to which ``--host``, ``--port`` and
            ``--ready-file`` are added.
        record: the replica's record file.
        port: the port to serve on (0: a free one, then kept across restarts unless it was
            taken meanwhile).
        max_restarts: the restarts in a row it may make before it gives up.
        first_backoff_s: the wait before the first restart in a row (tests make it short).
    """

    def __init__(self, command: Sequence[str], record: Path, port: int = 0,
                 max_restarts: int = DEFAULT_MAX_RESTARTS,
                 first_backoff_s: float = FIRST_BACKOFF_S):
        self.command = list(command)
        self.record = record
        self.port = port
        self.free_port = port == 0
        self.max_restarts = max_restarts
        self.first_backoff_s = first_backoff_s
        self.stopping = False
        self._child: subprocess.Popen[bytes] | None = None

    def on_signal(self, _signum: int, _frame: Any) -> None:
        """Stop: SIGTERM the server (it drains), and start no other. Always SIGTERM: the
        launcher signals the whole process group, so the server may get the signal twice, and
        a second SIGINT would cut its drain short where a second SIGTERM changes nothing."""
        self.stopping = True
        if self._child is not None and self._child.poll() is None:
            self._child.terminate()

    def run(self) -> int:
        """Serve until stopped or given up; 0 either way (see the module's docstring)."""
        if self.port and (problem := port_problem(HOST, self.port)):
            self._announce(ReplicaState.FAILED, None, 0, f"{problem}: choose other replica ports "
                           "(`ringtrain job deploy --replica-port`), or none for free ones")
            return 0
        url, restarts = None, 0
        with tempfile.TemporaryDirectory(prefix="ringtrain-replica-") as tmp:
            ready = Path(tmp) / "ready.json"
            while not self.stopping:
                started = time.monotonic()
                code, served_url, last_line = self._serve_once(ready, restarts)
                if self.stopping:
                    break
                url = served_url or url
                if served_url is not None and time.monotonic() - started >= RESET_AFTER_S:
                    restarts = 0
                how = _ended(code, last_line)
                if url is None and code == EXIT_REFUSED:
                    self._announce(ReplicaState.FAILED, None, restarts,
                                   f"{how} before it served: starting it again cannot help")
                    break
                if code == EXIT_REFUSED and self.free_port:
                    # Its port was taken meanwhile (a free port is one of the system's ephemeral
                    # ones, which any connection may get): the next server takes another.
                    self.port = 0
                restarts += 1
                if restarts > self.max_restarts:
                    self._announce(ReplicaState.FAILED, url, restarts - 1,
                                   f"{how}; it died {restarts} times in a row, and its restart "
                                   f"budget is {self.max_restarts} (--max-restarts)")
                    break
                delay = backoff_s(restarts, self.first_backoff_s)
                self._announce(ReplicaState.RESTARTING, url, restarts,
                               f"{how}; restart {restarts} of {self.max_restarts} in {delay:g} s")
                self._sleep(delay)
        return 0

    def _serve_once(self, ready: Path, restarts: int) -> tuple[int, str | None, str]:
        """Run one server (the ``restarts``-th restart in a row) until it ends: its exit
        status, the URL it announced (``None`` if it never listened) and its last line on
        stderr."""
        ready.unlink(missing_ok=True)
        argv = [*self.command, "--host", HOST, "--port", str(self.port),
                "--ready-file", str(ready)]
        child = self._child = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                               stderr=subprocess.PIPE)
        if self.stopping:  # the signal came while it was starting
            child.terminate()
        assert child.stderr is not None
        last: list[str] = []
        pump = threading.Thread(target=_pump, args=(child.stderr, last), daemon=True)
        pump.start()
        url = None
        while True:
            code = child.poll()
            if url is None and (url := _read_url(ready)) is not None:
                self.port = urlsplit(url).port or self.port  # restarts come back there
                self._announce(ReplicaState.SERVING, url, restarts, "")
            if code is not None:
                break
            time.sleep(_POLL_S)
        pump.join(timeout=5)  # the pipe closes with the server (unless a child of it holds it)
        return code, url, last[-1] if last else ""

    def _announce(self, state: ReplicaState, url: str | None, restarts: int,
                  message: str) -> None:
        if state is not ReplicaState.SERVING:
            print(f"replica keeper: {state.value}: {message}", file=sys.stderr, flush=True)
        ReplicaRecord(state, url, restarts, self.max_restarts, message).write(self.record)

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(_POLL_S, seconds))


def _pump(pipe: IO[bytes], last: list[str]) -> None:
    """Copy the server's stderr to ours (the replica's log), keeping its last non-blank line."""
    out = sys.stderr.buffer
    for line in pipe:
        out.write(line)
        out.flush()
        if line.strip():
            last[:] = [line.decode(errors="replace").strip()[:500]]


def _read_url(ready: Path) -> str | None:
    """The URL in the server's ready file, or ``None`` before it wrote one (it writes the file
    whole, then renames it)."""
    try:
        url = json.loads(ready.read_text()).get("url")
    except (OSError, ValueError, AttributeError):
        return None
    return url if isinstance(url, str) else None


def _ended(code: int, last_line: str) -> str:
    if code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    return f"`ringtrain serve` {how}" + (f" ({last_line})" if last_line else "")


def main(argv: list[str] | None = None) -> int:
    """Entry point (see the module's docstring)."""
    argv = sys.argv[1:] if argv is None else argv
    own, serve_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    p = argparse.ArgumentParser(prog="python -m ringtrain.jobs.service.replica_keeper")
    p.add_argument("--record", type=Path, required=True, help="the replica's record file")
    p.add_argument("--port", type=int, default=0, help="port to serve on (default: a free one)")
    p.add_argument("--max-restarts", type=int, default=DEFAULT_MAX_RESTARTS,
                   help=f"restarts in a row before it gives up (default {DEFAULT_MAX_RESTARTS})")
    args = p.parse_args(own)
    keeper = ReplicaKeeper([sys.executable, "-m", "ringtrain.cli", "serve", *serve_args],
                           args.record, args.port, args.max_restarts)
    signal.signal(signal.SIGTERM, keeper.on_signal)
    signal.signal(signal.SIGINT, keeper.on_signal)
    return keeper.run()


if __name__ == "__main__":
    sys.exit(main())
