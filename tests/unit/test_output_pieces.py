"""Reading a rank's pipe in pieces: lines and progress-bar updates at once, an unfinished line
after a quiet moment, markers only whole; the pieces joined are the bytes written."""

from __future__ import annotations

import fcntl
import os
import queue
import struct
import termios
import threading

import pytest

from ringtrain.runner.output_pieces import read_pieces
from ringtrain.runner.task import MarkerEvent, format_marker, marker_hold
from tests.waiting import wait_until


class _Pipe:
    """A real pipe whose read end is consumed by ``read_pieces`` on a thread."""

    def __init__(self, limit: int = 1 << 16, **kwargs):
        self.r, self.w = os.pipe()
        self.pieces: queue.Queue[bytes | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(limit, kwargs), daemon=True)
        self._thread.start()

    def _read(self, limit: int, kwargs: dict) -> None:
        for piece in read_pieces(self.r, limit, **kwargs):
            self.pieces.put(piece)
        self.pieces.put(None)

    def send(self, data: bytes) -> None:
        os.write(self.w, data)

    def drained(self) -> bool:
        """Whether the reader has read everything sent so far."""
        return struct.unpack("i", fcntl.ioctl(self.r, termios.FIONREAD, b"\0" * 4))[0] == 0

    def next(self, timeout_s: float = 5.0) -> bytes | None:
        return self.pieces.get(timeout=timeout_s)

    def close(self) -> list[bytes]:
        """Close the write end; the pieces not taken yet."""
        os.close(self.w)
        rest = []
        while (piece := self.next()) is not None:
            rest.append(piece)
        self._thread.join(5)
        os.close(self.r)
        return rest


def test_lines_and_carriage_returns_are_pieces_of_their_own() -> None:
    pipe = _Pipe()
    pipe.send(b"one\ntwo\r\n\r 10%|#   |\r 20%|##  |\rdone\n")
    assert [pipe.next() for _ in range(6)] == [b"one\n", b"two\r\n", b"\r", b" 10%|#   |\r",
                                               b" 20%|##  |\r", b"done\n"]
    assert pipe.close() == []


def test_an_unfinished_line_is_passed_on_once_the_pipe_is_quiet() -> None:
    # tqdm's pattern: "\r" then the bar, which stays unfinished until the next update.
    pipe = _Pipe()
    pipe.send(b"\r 10%|#")
    assert pipe.next() == b"\r"
    assert pipe.next(timeout_s=2) == b" 10%|#"  # without the fix: only at end-of-file
    # Pieces of one print that come together stay together.
    pipe.send(b"epoch")
    pipe.send(b" 3/5\n")
    assert pipe.next() == b"epoch 3/5\n"
    assert pipe.close() == []


def test_a_carriage_return_split_from_its_newline_stays_one_line_end() -> None:
    pipe = _Pipe(quiet_s=60.0)  # no quiet moment passes the \r on before the \n comes
    pipe.send(b"text\r")
    wait_until(pipe.drained, "the reader took the \\r alone")  # the \n comes in another read
    pipe.send(b"\nnext\n")
    assert pipe.next() == b"text\r\n"
    assert pipe.next() == b"next\n"
    assert pipe.close() == []


def test_a_long_line_comes_in_pieces_of_the_limit_and_nothing_is_lost() -> None:
    pipe = _Pipe(limit=8)
    data = b"0123456789abcdefXYZ\nshort\n\xff\x00tail"
    pipe.send(data)
    pieces = pipe.close()
    assert b"".join(pieces) == data
    assert max(map(len, pieces)) <= 8
    assert b"short\n" in pieces


@pytest.mark.parametrize("cut", [1, 5, 16, 20])
def test_a_marker_arriving_in_parts_is_passed_on_only_whole(cut: int) -> None:
    marker = format_marker("tok3n", MarkerEvent.EXIT, "code=0")
    pipe = _Pipe(hold=marker_hold("tok3n"))
    pipe.send(b"last words" + marker[:cut])
    assert pipe.next() == b"last words"  # what cannot be the marker is passed on
    with pytest.raises(queue.Empty):
        pipe.next(timeout_s=0.3)  # the marker's start is held back
    pipe.send(marker[cut:])
    assert pipe.next() == marker
    assert pipe.close() == []


def test_text_that_only_looks_like_a_marker_start_is_passed_on_when_it_ends() -> None:
    pipe = _Pipe(hold=marker_hold("tok3n"))
    pipe.send(b"mail me @ring")
    assert pipe.next() == b"mail me "
    pipe.send(b"train.org\n")
    assert pipe.next() == b"@ringtrain.org\n"
    assert pipe.close() == []
