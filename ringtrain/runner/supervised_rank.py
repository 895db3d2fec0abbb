"""One rank as the agent supervises it: its state, and the threads that watch its process.

Three threads per local rank feed the agent's monitor: one per output stream, which pass on
lines, progress-bar updates and unfinished lines as they come (stderr's pump also takes out the
task wrapper's markers and keeps the last lines to explain a failure), and one waiting for the
process to exit. They talk to the monitor through one queue of ``(Event, rank index)``.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Callable
from enum import Enum
from typing import IO

from ringtrain.runner.output import RankOutput
from ringtrain.runner.output_pieces import read_pieces
from ringtrain.runner.plan import RankSpec
from ringtrain.runner.result import RankOutcome, RankState, check_transition
from ringtrain.runner.spawn import RankProcess
from ringtrain.runner.task import Marker, MarkerEvent, marker_hold, split_marker

log = logging.getLogger(__name__)

_LINE_LIMIT = 1 << 16  # longer lines are passed on in pieces
_TAIL_LINES = 5  # stderr lines kept to explain a failure


class Event(Enum):
    """What the rank threads and signal handlers tell the monitor, each with a number."""

    EXIT = "exit"  # a rank's process ended (the rank's index)
    MARKER = "marker"  # a rank's task wrapper reported in (the rank's index)
    INTERRUPT = "interrupt"  # the launcher got a signal (its number)


class SupervisedRank:
    """The agent's book-keeping for one rank."""

    def __init__(self, spec: RankSpec):
        self.spec = spec
        self.state = RankState.STARTING
        self.outcome: RankOutcome | None = None
        self.proc: RankProcess | None = None
        self.deadline = float("inf")  # set when the process is created
        self.exited = False  # its process is gone (or was never created)
        self.stop_requested = False
        self.kill_at: float | None = None  # when a stop request turns into SIGKILL
        self.abandon_at: float | None = None  # when a killed process is given up on
        self.started = False  # the task wrapper reported in
        self.failed_reason: str | None = None
        self.exit_marker: Marker | None = None
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self.stderr_thread: threading.Thread | None = None
        self.threads: list[threading.Thread] = []
        self.relayed = False  # started by another node's follower

    def tail(self) -> str:
        return " / ".join(self.stderr_tail)

    def finish(self, state: RankState, **details) -> RankOutcome:
        if self.state is RankState.STARTING and state in (RankState.SUCCEEDED, RankState.FAILED):
            self.state = check_transition(self.state, RankState.RUNNING)
        self.state = check_transition(self.state, state)
        self.outcome = RankOutcome(self.spec.number, self.spec.hostname, state,
                                   worker=self.spec.worker is not None, **details)
        return self.outcome

    def final_outcome(self) -> RankOutcome:
        """The outcome of a finished rank (every rank has finished when the agent reports)."""
        assert self.outcome is not None, f"rank {self.spec.number} has not finished"
        return self.outcome

    def watch(self, index: int, sink: RankOutput, token: str,
              events: queue.SimpleQueue[tuple[Event, int]]) -> None:
        """Start the threads that pass the output of this rank's process (the agent's
        ``index``-th rank) to ``sink`` and tell ``events`` of its markers and its exit."""
        assert self.proc is not None  # started once the process is
        popen, number = self.proc.popen, self.spec.number

        def announce(event: Event) -> None:
            events.put((event, index))

        self.stderr_thread = start_thread(f"rank{number}-stderr", self._pump_stderr,
                                          popen.stderr, sink, token, announce)
        self.threads = [
            start_thread(f"rank{number}-stdout", self._pump_stdout, popen.stdout, sink),
            self.stderr_thread,
            start_thread(f"rank{number}-wait", self._wait, announce),
        ]

    def _wait(self, announce: Callable[[Event], None]) -> None:
        assert self.proc is not None  # started once the process is
        self.proc.popen.wait()
        announce(Event.EXIT)

    def _pump_stdout(self, pipe: IO[bytes], sink: RankOutput) -> None:
        with pipe:
            for piece in read_pieces(pipe.fileno(), _LINE_LIMIT):
                sink.write(self.spec.number, "stdout", piece)

    def _pump_stderr(self, pipe: IO[bytes], sink: RankOutput, token: str,
                     announce: Callable[[Event], None]) -> None:
        line = b""  # the unfinished line so far, for the failure's tail
        with pipe:
            for piece in read_pieces(pipe.fileno(), _LINE_LIMIT, hold=marker_hold(token)):
                try:
                    text, marker = split_marker(token, piece)
                except ValueError as e:  # a wrapper of another ringtrain version, say
                    log.warning("rank %d: %s; passed on as output", self.spec.number, e)
                    text, marker = piece, None
                line += text
                if marker is not None and line and not line.endswith((b"\n", b"\r")):
                    text += b"\n"  # a marker after a partial line (the command died mid-line)
                    line += b"\n"
                if text:
                    sink.write(self.spec.number, "stderr", text)
                if line.endswith((b"\n", b"\r")) or len(line) >= _LINE_LIMIT:
                    if stripped := line.decode(errors="replace").strip():
                        self.stderr_tail.append(stripped)
                    line = b""
                if marker is not None:
                    self._on_marker(marker)
                    announce(Event.MARKER)

    def _on_marker(self, marker: Marker) -> None:
        if marker.event is MarkerEvent.STARTED:
            self.started = True
            assert self.proc is not None  # markers come from its process
            self.proc.child_pid = marker.pid
        elif marker.event is MarkerEvent.FAILED:
            self.failed_reason = marker.detail
        elif marker.event is MarkerEvent.EXIT:
            self.exit_marker = marker


def start_thread(name: str, target, *args) -> threading.Thread:
    """A daemon thread running ``target(*args)``, started."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread
