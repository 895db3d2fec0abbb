"""Rank output: each line to the terminal with horovodrun's ``[rank]<stdout>:`` prefix, and
optionally, unprefixed, to ``DIR/rank.N/stdout`` and ``DIR/rank.N/stderr``, and both streams
interleaved line by line as they arrive to ``DIR/rank.N/output`` (what a follower of the rank
reads: progress bars on stderr among the prints on stdout).

Every line is flushed as soon as it is written, so a reader tailing the files sees it at once.
"""

from __future__ import annotations

import threading
import time
from typing import BinaryIO, Protocol

from ringtrain.run_files import COMBINED_STREAM as COMBINED
from ringtrain.run_files import OUTPUT_STREAMS as STREAMS
from ringtrain.run_files import rank_log


class RankOutput(Protocol):
    """Where an agent puts what its ranks print: an :class:`OutputSink`, or on a follower of
    the ssh launch the framed stream back to the launcher (:mod:`ringtrain.runner.node_output`).
    """

    def open_rank(self, rank: int) -> None:
        """Prepare for the rank's output (``OSError``: it cannot be kept)."""
        ...

    def write(self, rank: int, stream: str, line: bytes) -> None:
        """Take one chunk (a line, or part of one) of ``stream`` of ``rank``."""
        ...

    def close(self) -> None:
        """No more output comes."""
        ...


class OutputSink:
    """Where the lines of all ranks go; safe to call from one reader thread per stream."""

    def __init__(self, terminal: dict[str, BinaryIO], directory: str | None = None,
                 timestamps: bool = False):
        """Args:
            terminal: the launcher's binary ``stdout`` and ``stderr``, by stream name.
            directory: ``--output-filename``, or ``None`` for terminal only.
            timestamps: prefix terminal lines with the time (``--prefix-output-with-timestamp``).
        """
        self._terminal = terminal
        self._directory = directory
        self._timestamps = timestamps
        self._lock = threading.Lock()  # one line at a time on the shared terminal
        self._files: dict[tuple[int, str], BinaryIO] = {}

    def open_rank(self, rank: int) -> None:
        """Create the rank's output files now, so they exist (empty) before it prints; a rank
        whose files are open already keeps them.

        Raises:
            OSError: the directory cannot be created or written.
        """
        if self._directory is None or (rank, STREAMS[0]) in self._files:
            return
        for stream in (*STREAMS, COMBINED):
            path = rank_log(self._directory, rank, stream)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._files[rank, stream] = open(path, "wb")

    def write(self, rank: int, stream: str, line: bytes) -> None:
        """Write one line (as read, usually newline-terminated) of ``stream`` of ``rank``."""
        file = self._files.get((rank, stream))
        if file is not None:
            file.write(line)
            file.flush()
            combined = self._files[rank, COMBINED]
            with self._lock:  # the two streams' reader threads write here
                combined.write(line)
                combined.flush()
        prefix = f"[{rank}]<{stream}>:".encode()
        if self._timestamps:
            prefix = time.strftime("%a %b %d %H:%M:%S %Y ").encode() + prefix
        text = prefix + line if line.endswith(b"\n") else prefix + line + b"\n"
        with self._lock:
            out = self._terminal[stream]
            try:
                out.write(text)
                out.flush()
            except OSError:  # e.g. the terminal's reader (`| head`) is gone; keep the job going
                pass

    def close(self) -> None:
        """Close the rank files (the terminal streams stay open)."""
        for file in self._files.values():
            file.close()
        self._files.clear()
