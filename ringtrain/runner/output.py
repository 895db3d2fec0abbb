"""Rank output: each line to the terminal with horovodrun's ``[rank]<stdout>:`` prefix, and
optionally, unprefixed, to ``DIR/rank.N/stdout`` and ``DIR/rank.N/stderr``, and both streams
interleaved as they arrive to ``DIR/rank.N/output`` (what a follower of the rank reads: progress
bars on stderr among the prints on stdout).

What arrives are the pieces :mod:`ringtrain.runner.output_pieces` reads: lines ending with
``\n`` or ``\r`` and unfinished lines. The rank files keep them as written (a reader renders a
``\r`` as an update of the line). On the terminal a progress bar stays one updating line
with its prefix, a line finished in pieces reads as one line, and a line another rank or stream
cuts into is ended first and shown whole when it continues. Every piece is flushed as soon as
it is written, so a reader tailing the files sees it at once.
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
    """Where the output of all ranks goes; safe to call from one reader thread per stream."""

    def __init__(self, terminal: dict[str, BinaryIO], directory: str | None = None,
                 timestamps: bool = False):
        """``terminal``: the launcher's binary ``stdout`` and ``stderr`` by stream name;
        ``directory``: ``--output-filename`` (``None``: the terminal only); ``timestamps``:
        ``--prefix-output-with-timestamp``."""
        self._terminal = terminal
        self._directory = directory
        self._timestamps = timestamps
        self._lock = threading.Lock()  # the terminal and the combined files are shared
        self._files: dict[tuple[int, str], BinaryIO] = {}
        self._screen = _Screen()
        self._combined_open: dict[int, str] = {}  # rank -> the stream whose line is unfinished

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
        """Write one piece (a line ending with ``\\n`` or ``\\r``, or part of one) of
        ``stream`` of ``rank``. A rank file that cannot be written (a full disk) is given up,
        said once on the terminal; the rank's output still reaches the terminal."""
        file = self._files.get((rank, stream))
        failed = None
        if file is not None:
            try:
                file.write(line)
                file.flush()
            except OSError as e:
                failed = e
        with self._lock:
            if failed is not None:
                self._give_up(rank, stream, failed)
            if (rank, COMBINED) in self._files:
                try:
                    self._write_combined(rank, stream, line)
                except OSError as e:
                    self._give_up(rank, COMBINED, e)
            prefix = f"[{rank}]<{stream}>:".encode()
            if self._timestamps:
                prefix = time.strftime("%a %b %d %H:%M:%S %Y ").encode() + prefix
            for target, text in self._screen.show((rank, stream), prefix, line):
                out = self._terminal[target]
                try:
                    out.write(text)
                    out.flush()
                except OSError:  # e.g. the terminal's reader (`| head`) is gone; keep the job going
                    pass

    def _write_combined(self, rank: int, stream: str, piece: bytes) -> None:
        combined = self._files[rank, COMBINED]
        other = self._combined_open.get(rank)
        if other is not None and other != stream:
            combined.write(b"\n")  # the other stream's unfinished line (or bar) stays readable
        combined.write(piece)
        combined.flush()
        if piece.endswith(b"\n"):
            self._combined_open.pop(rank, None)
        elif piece:
            self._combined_open[rank] = stream

    def close(self) -> None:
        """End a line left unfinished on the terminal; close the rank files (the terminal
        streams stay open)."""
        with self._lock:
            for target, text in self._screen.finish():
                try:
                    self._terminal[target].write(text)
                    self._terminal[target].flush()
                except OSError:
                    pass
        for file in self._files.values():
            try:
                file.close()
            except OSError:  # its last bytes did not fit: said when the write failed
                pass
        self._files.clear()

    def _give_up(self, rank: int, stream: str, error: OSError) -> None:
        """Stop writing one rank file after ``error`` (what reached it stays), and say so on
        the terminal (the caller holds the lock)."""
        file = self._files.pop((rank, stream), None)
        if file is None:
            return
        try:
            file.close()
        except OSError:
            pass
        path = rank_log(self._directory or "", rank, stream)
        note = (f"ringtrain run: rank {rank}'s {stream} is no longer written to {path}: "
                f"{error.strerror or error}; it goes on to the terminal\n").encode()
        try:
            self._terminal["stderr"].write(note)
            self._terminal["stderr"].flush()
        except OSError:
            pass


class _Screen:
    """What the terminal shows: which rank stream's line the cursor is on, and the unfinished
    line of each rank stream (the caller holds the lock)."""

    def __init__(self) -> None:
        self._owner: tuple[int, str] | None = None  # whose line the cursor is on
        self._at_start = False  # the owner's last piece ended with \r: the cursor is at column 0
        self._unfinished: dict[tuple[int, str], bytes] = {}

    def show(self, key: tuple[int, str], prefix: bytes,
             piece: bytes) -> list[tuple[str, bytes]]:
        """What to write, to which terminal stream, for one piece of ``key``'s output."""
        writes: list[tuple[str, bytes]] = []
        text, end = _split_end(piece)
        newline = end.endswith(b"\n")
        if self._owner is not None and self._owner != key:
            writes.append((self._owner[1], b"\n"))  # leave that line (or bar) as it stands
            self._owner = None
        before = self._unfinished.pop(key, b"")
        if self._owner == key and not self._at_start:
            out = text + end  # the cursor is after the start of this very line
        elif text or newline or (before and end != b"\r"):
            out = prefix + before + text + end
        else:
            out = b""  # a lone \r ending a line that is shown (or empty) already
        if out:
            writes.append((key[1], out))
        if newline:
            self._owner = None
        elif out:
            self._owner, self._at_start = key, end == b"\r"
        if not end:
            self._unfinished[key] = (before + text)[-_KEEP_UNFINISHED:]
        return writes

    def finish(self) -> list[tuple[str, bytes]]:
        """The newline that ends the line the cursor is on, if any."""
        owner, self._owner = self._owner, None
        return [] if owner is None else [(owner[1], b"\n")]


_KEEP_UNFINISHED = 1 << 16  # of a line never ended, the last bytes kept for reprinting it


def _split_end(piece: bytes) -> tuple[bytes, bytes]:
    """A piece's text and its line end: ``\\r\\n``, ``\\n``, ``\\r``, or none (unfinished)."""
    for end in (b"\r\n", b"\n", b"\r"):
        if piece.endswith(end):
            return piece[:-len(end)], end
    return piece, b""
