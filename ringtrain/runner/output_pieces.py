"""Reading a rank's output pipe in pieces that can be shown at once.

A rank's output is not only lines: progress bars (tqdm, Keras) redraw one line with ``\\r`` and
never end it, and a print without a newline can sit for minutes. Waiting for ``\\n`` (as
``readline`` does) kept such updates back until the epoch ended. :func:`read_pieces` yields
instead:

- every line at once, whether it ends with ``\\n`` (``\\r\\n`` included) or ``\\r`` (an update
  of a progress bar is a line of its own for the logs);
- what follows the last end, once the pipe has been quiet for :data:`QUIET_S` (long enough for
  the pieces of one ``print`` to come together, short enough for a viewer to see the update
  well within a second), or once it reaches ``limit`` bytes.

The pieces joined are the bytes read, unchanged: the rank's files keep its output as written.
"""

from __future__ import annotations

import os
import re
import select
from collections.abc import Callable, Iterator

#: Seconds the pipe must stay quiet before an unfinished line is passed on.
QUIET_S = 0.05
_END = re.compile(rb"\r\n|\n|\r")


def whole(tail: bytes) -> int:
    """A ``hold`` for :func:`read_pieces` that passes every unfinished line on."""
    return len(tail)


def read_pieces(fd: int, limit: int, hold: Callable[[bytes], int] = whole,
                quiet_s: float = QUIET_S) -> Iterator[bytes]:
    """Yield what is read from the pipe ``fd`` (the caller closes it) in pieces of at most
    ``limit`` bytes, until end-of-file (see the module docstring).

    ``hold``, given an unfinished line, says how many of its first bytes may be passed on before
    it ends (the rest waits for its end, or for ``limit``): the stderr reader holds back a
    marker that may still be arriving. ``quiet_s``: how long the pipe must be quiet first.
    """
    tail = b""
    while True:
        if tail and not _readable(fd, quiet_s):
            cut = len(tail) if len(tail) >= limit else hold(tail)
            if cut:
                yield tail[:cut]
                tail = tail[cut:]
        data = os.read(fd, limit)
        if not data:
            break
        tail += data
        # A last \r may be the first half of \r\n: it waits for the next read, or the quiet.
        scan = len(tail) - 1 if tail.endswith(b"\r") else len(tail)
        start = 0
        for end in _END.finditer(tail, 0, scan):
            yield from _split(tail[start:end.end()], limit)
            start = end.end()
        tail = tail[start:]
        while len(tail) >= limit:
            yield tail[:limit]
            tail = tail[limit:]
    if tail:
        yield tail


def _split(piece: bytes, limit: int) -> Iterator[bytes]:
    for at in range(0, len(piece), limit):
        yield piece[at:at + limit]


def _readable(fd: int, timeout_s: float) -> bool:
    readable, _, _ = select.select([fd], [], [], timeout_s)
    return bool(readable)
