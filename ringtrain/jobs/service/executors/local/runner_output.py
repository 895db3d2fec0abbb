"""The job runner's log, kept through a full disk.

What the nodes' ``ringtrain run`` print (each rank's lines with their ``[rank]<stream>:``
prefix, then the launch's summary) comes to the job runner through a pipe, and the runner's own
notes join it; both are written to the runner's log (``launcher/launcher.log``, its stdout) as
they come, and the last lines are kept in memory. What the disk refuses is held, up to
:data:`HOLD_BYTES` (the oldest dropped first, and counted), and written once there is room: at
the latest at the attempt's end, after the runner gave up its reserve. So a job that filled its
disk still leaves its last output, in the log once space returns and in the attempt's message.

Standard library only, as the job runner.
"""

from __future__ import annotations

import collections
import os
import threading

from ringtrain.jobs.disk_space import is_disk_full

#: Lines of output kept for the attempt's message, and the most bytes held for the log.
TAIL_LINES = 20
HOLD_BYTES = 256 * 1024
#: The longest line kept in the tail.
_LINE_CHARS = 300


class RunnerOutput:
    """The runner's log and its last lines.

    Args:
        log_fd: where the output goes (the runner's stdout, the log file).
    """

    def __init__(self, log_fd: int = 1):
        self._log = log_fd
        self._lock = threading.Lock()
        self._held = bytearray()
        self._dropped = 0
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._line = b""  # the unfinished last line, for the tail
        self._child_end: int | None = None
        self._pump: threading.Thread | None = None
        #: Whether a write found the disk full (or the quota used up).
        self.refused = False

    def child_stdout(self) -> int:
        """The pipe's end to give the runner's children as stdout and stderr (made once;
        read by a thread of its own until :meth:`close`)."""
        if self._child_end is None:
            read_end, self._child_end = os.pipe()  # not inherited: Popen passes it as 1 and 2
            self._pump = threading.Thread(target=self._read, args=(read_end,),
                                          name="runner-output", daemon=True)
            self._pump.start()
        return self._child_end

    def note(self, text: str) -> None:
        """A line of the runner's own."""
        self._take(text.rstrip("\n").encode(errors="replace") + b"\n")

    def tail(self) -> list[str]:
        """The last lines written (or held), oldest first."""
        with self._lock:
            last = self._line.decode(errors="replace").strip()
            return [*self._tail, *([last[:_LINE_CHARS]] if last else [])]

    def flush(self) -> bool:
        """Write what is held; whether all of it went."""
        with self._lock:
            return self._write_held()

    def close(self, timeout_s: float) -> None:
        """The children have ended: read what they left in the pipe (waiting at most
        ``timeout_s`` for a process that escaped the attempt to close its copy), then write
        what is held."""
        if self._child_end is not None:
            os.close(self._child_end)
            self._child_end = None
        if self._pump is not None:
            self._pump.join(timeout_s)
        self.flush()

    def _read(self, fd: int) -> None:
        with open(fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                self._take(chunk)

    def _take(self, data: bytes) -> None:
        with self._lock:
            self._remember(data)
            self._held += data
            if len(self._held) > HOLD_BYTES:  # the newest output is the one that explains
                cut = len(self._held) - HOLD_BYTES
                del self._held[:cut]
                self._dropped += cut
            self._write_held()

    def _remember(self, data: bytes) -> None:
        *lines, self._line = (self._line + data).replace(b"\r", b"\n").split(b"\n")
        for raw in lines:
            if line := raw.decode(errors="replace").strip():
                self._tail.append(line[:_LINE_CHARS])
        self._line = self._line[-4 * _LINE_CHARS:]

    def _write_held(self) -> bool:
        """Write the held bytes to the log; False once the disk refuses (the rest stays held)."""
        if self._dropped:
            self._held[:0] = (f"[job runner: {self._dropped} bytes of output were dropped: the "
                              "disk was full]\n").encode()
            self._dropped = 0
        while self._held:
            try:
                written = os.write(self._log, self._held)
            except OSError as e:
                if not is_disk_full(e):
                    self._held.clear()  # a log that takes nothing at all: nothing to hold for
                    return True
                self.refused = True
                return False
            del self._held[:written]
        return True
