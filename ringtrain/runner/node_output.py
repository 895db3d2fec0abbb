"""A follower's ranks' output, carried to the ssh launcher over the follower's stdout.

Every chunk a remote follower reads from a rank goes as one frame on its stdout, which ssh
carries to the launcher; there :func:`relay_frames` hands it to the launcher's
:class:`~ringtrain.runner.output.OutputSink` as a local rank's would be, so prefixes, timestamps
and the ``--output-filename`` files come out the same, on the launcher's machine (as Horovod's).

The stream starts with the line :data:`START` (what a login shell prints before the follower
runs is passed over as text, not taken for frames); each frame then is a 9-byte header (the
stream, 1 for stdout and 2 for stderr; the rank's number; the chunk's length; big-endian) and the
chunk's bytes as read, so binary output and partial lines pass unchanged.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from typing import BinaryIO

from ringtrain.runner.output import RankOutput

#: The line a follower writes before its first frame.
START = b"@ringtrain-frames:1\n"
_HEADER = struct.Struct(">BII")
_STREAMS = ("stdout", "stderr")  # codes 1 and 2


class FramedOutput:
    """A follower's :class:`~ringtrain.runner.output.RankOutput`: frames on a binary stream.

    Safe to call from every rank's reader threads; a stream whose reader is gone (the launcher
    died: the follower is stopping its ranks) swallows what it is given.
    """

    def __init__(self, out: BinaryIO):
        """Write the start line to ``out`` (the follower's real stdout)."""
        self._out = out
        self._lock = threading.Lock()
        self._send(START)

    def open_rank(self, rank: int) -> None:
        """Nothing: the launcher creates the rank's files."""

    def write(self, rank: int, stream: str, line: bytes) -> None:
        """Send one chunk of ``stream`` of ``rank``."""
        self._send(_HEADER.pack(_STREAMS.index(stream) + 1, rank, len(line)) + line)

    def close(self) -> None:
        """Flush what was sent (the stream itself stays open)."""
        self._send(b"")

    def _send(self, data: bytes) -> None:
        with self._lock:
            try:
                self._out.write(data)
                self._out.flush()
            except (OSError, ValueError):  # the connection is gone, or the stream closed
                pass


def relay_frames(stream: BinaryIO, sink: RankOutput, text: Callable[[bytes], None]) -> None:
    """Hand every frame read from ``stream`` (a follower's stdout) to ``sink``, until
    end-of-file; ``text`` takes each line before the start line (a login shell's greeting).

    Raises:
        ValueError: the stream broke off inside a frame, or a frame names no known stream; what
            follows is left unread.
    """
    for line in iter(stream.readline, b""):
        if line == START:
            break
        text(line)
    else:
        return
    while header := stream.read(_HEADER.size):
        if len(header) < _HEADER.size:
            raise ValueError(f"the stream broke off inside a frame header ({len(header)} bytes)")
        code, rank, length = _HEADER.unpack(header)
        if not 1 <= code <= len(_STREAMS):
            raise ValueError(f"a frame names stream {code}, which is neither stdout nor stderr")
        chunk = stream.read(length)
        if len(chunk) < length:
            raise ValueError(f"the stream broke off inside a frame of rank {rank} "
                             f"({len(chunk)} of {length} bytes)")
        sink.write(rank, _STREAMS[code - 1], chunk)
