"""The task wrapper: ``python -m ringtrain.runner.task --token T [--grace S] -- COMMAND...``.

Every rank runs under this wrapper, locally and over ssh alike. It runs COMMAND as a child in a
process group of its own and ties the child's life to the launcher's: when its stdin reaches
end-of-file (the launcher closed the pipe, exited or died, or the ssh connection dropped) or it
receives SIGTERM, SIGHUP or SIGINT, it sends SIGTERM to the child's group, then SIGKILL after
the grace period. When the child exits, whatever it left running in its group is killed too.

COMMAND runs with ``OMP_NUM_THREADS`` set to this host's cores divided by its local ranks
unless the environment sets it (:mod:`ringtrain.runner.threads`).

COMMAND's stdout and stderr are the wrapper's own, passed through untouched. The wrapper itself
prints only marker lines on stderr, each ``@ringtrain-task:<token>:<event> <detail>``:

- ``started <pid>``: COMMAND is running as process ``pid``;
- ``failed <reason>``: COMMAND could not be started (the wrapper exits 127);
- ``exit code=<n>`` or ``exit signal=<n>``: how COMMAND ended; the wrapper then exits with
  ``n``, or ``128 + n`` for a signal.

The token, chosen per launch, keeps user output from being mistaken for a marker. This module
uses only the standard library, so that it starts fast and needs nothing but Python remotely.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from ringtrain.runner.threads import default_threads_environ

_PREFIX = b"@ringtrain-task:"
DEFAULT_GRACE_S = 3.0


class MarkerEvent(Enum):
    """What a marker line reports (its detail in parentheses)."""

    STARTED = "started"  # COMMAND runs (its pid)
    FAILED = "failed"  # COMMAND could not be started (why)
    EXIT = "exit"  # COMMAND ended (code=<n> or signal=<n>)


@dataclass(frozen=True)
class Marker:
    """One marker line, checked on construction (``ValueError``: the detail does not fit the
    event, a pid that is no number, say)."""

    event: MarkerEvent
    detail: str

    def __post_init__(self) -> None:
        if self.event is MarkerEvent.STARTED and not self.detail.isdigit():
            raise ValueError(f"a started marker carries a pid, not {self.detail!r}")
        if self.event is MarkerEvent.EXIT:
            kind, _, value = self.detail.partition("=")
            if kind not in ("code", "signal") or not value.isdigit():
                raise ValueError(f"an exit marker carries code=<n> or signal=<n>, not "
                                 f"{self.detail!r}")

    @property
    def pid(self) -> int:
        """For a ``started`` marker: the pid of COMMAND."""
        return int(self.detail)

    def exit_status(self) -> tuple[int | None, int | None]:
        """For an ``exit`` marker: ``(exit code, None)`` or ``(None, signal number)``."""
        kind, _, value = self.detail.partition("=")
        number = int(value)
        return (number, None) if kind == "code" else (None, number)


def format_marker(token: str, event: MarkerEvent, detail: str) -> bytes:
    """The marker line for ``event`` (newline-terminated)."""
    return _PREFIX + f"{token}:{event.value} {detail}\n".encode()


def marker_hold(token: str) -> Callable[[bytes], int]:
    """A ``hold`` for :func:`ringtrain.runner.output_pieces.read_pieces` on a wrapper's stderr:
    of an unfinished line, the bytes before a marker that may be under way (a marker is passed
    on only whole, so that :func:`split_marker` finds it)."""
    head = _PREFIX + token.encode() + b":"

    def hold(tail: bytes) -> int:
        at = tail.find(head)
        if at >= 0:
            return at
        for n in range(min(len(head) - 1, len(tail)), 0, -1):
            if tail.endswith(head[:n]):
                return len(tail) - n
        return len(tail)

    return hold


def split_marker(token: str, line: bytes) -> tuple[bytes, Marker | None]:
    """Split a line read from a wrapper's stderr into the user's text and a marker, if any.

    A marker normally fills its own line, but it follows whatever the child printed without a
    final newline, so it is searched for anywhere in the line; the text before it (the whole
    line when there is none) is returned with it.

    Raises:
        ValueError: the line carries this launch's token but no marker this wrapper writes.
    """
    head = _PREFIX + token.encode() + b":"
    at = line.find(head)
    if at < 0:
        return line, None
    body = line[at + len(head):].decode(errors="replace").strip()
    event, _, detail = body.partition(" ")
    try:
        return line[:at], Marker(MarkerEvent(event), detail)
    except ValueError as e:
        raise ValueError(f"malformed task wrapper marker {body!r}: {e}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the wrapper; returns its exit status (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m ringtrain.runner.task",
                                     description="Run COMMAND tied to a ringtrain launcher.")
    parser.add_argument("--token", required=True, help="marker token chosen by the launcher")
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE_S,
                        help="seconds between SIGTERM and SIGKILL when stopping COMMAND")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no COMMAND given")

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=_set_on_eof, args=(stop,), name="stdin-eof", daemon=True).start()
    try:
        # A session of its own, so that stopping kills the whole tree the command starts.
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True,
                                 env=os.environ | default_threads_environ(os.environ))
    except OSError as e:
        _report(args.token, MarkerEvent.FAILED, f"cannot run {command[0]!r}: {e.strerror or e}")
        return 127
    _report(args.token, MarkerEvent.STARTED, str(child.pid))
    while child.poll() is None and not stop.wait(0.05):
        pass
    if child.returncode is None:
        _stop(child, args.grace)
    _signal_group(child.pid, signal.SIGKILL)  # anything the command left behind
    code = child.returncode
    _report(args.token, MarkerEvent.EXIT, f"signal={-code}" if code < 0 else f"code={code}")
    return 128 - code if code < 0 else code


def _set_on_eof(stop: threading.Event) -> None:
    # The launcher never writes to this pipe; end-of-file means it is gone or wants us gone.
    try:
        while os.read(0, 65536):
            pass
    except OSError:
        pass
    stop.set()


def _stop(child: subprocess.Popen, grace_s: float) -> None:
    _signal_group(child.pid, signal.SIGTERM)
    try:
        child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _signal_group(child.pid, signal.SIGKILL)
        child.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _report(token: str, event: MarkerEvent, detail: str) -> None:
    try:
        os.write(sys.stderr.fileno(), format_marker(token, event, detail))
    except OSError:  # the launcher is gone; nobody is left to tell
        pass


if __name__ == "__main__":
    sys.exit(main())
