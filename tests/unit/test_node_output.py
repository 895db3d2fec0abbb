"""The framed stream that carries a follower's ranks' output to the ssh launcher: what goes in
as chunks comes out in the launcher's sink as the same chunks, files included."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from ringtrain.runner.node_output import START, FramedOutput, relay_frames
from ringtrain.runner.output import OutputSink


def _frames(*chunks: tuple[int, str, bytes]) -> bytes:
    out = io.BytesIO()
    framed = FramedOutput(out)
    framed.open_rank(7)  # nothing to open on the follower's side
    for rank, stream, chunk in chunks:
        framed.write(rank, stream, chunk)
    framed.close()
    return out.getvalue()


def test_chunks_reach_the_launcher_s_terminal_and_files_unchanged(tmp_path: Path) -> None:
    data = _frames((3, "stdout", b"hello\n"), (3, "stderr", b"warn\n"),
                   (4, "stdout", b"\x00\xff binary\n"), (3, "stdout", b"no newline"),
                   (4, "stdout", b""))
    terminal = {"stdout": io.BytesIO(), "stderr": io.BytesIO()}
    sink = OutputSink(terminal, str(tmp_path), timestamps=False)
    for rank in (3, 4):
        sink.open_rank(rank)
    before: list[bytes] = []
    relay_frames(io.BytesIO(b"a login shell's greeting\n" + data), sink, before.append)
    sink.close()
    assert before == [b"a login shell's greeting\n"]
    assert terminal["stdout"].getvalue() == (b"[3]<stdout>:hello\n[4]<stdout>:\x00\xff binary\n"
                                             b"[3]<stdout>:no newline\n")
    assert terminal["stderr"].getvalue() == b"[3]<stderr>:warn\n"
    assert (tmp_path / "rank.3" / "stdout").read_bytes() == b"hello\nno newline"
    assert (tmp_path / "rank.3" / "output").read_bytes() == b"hello\nwarn\nno newline"
    assert (tmp_path / "rank.4" / "stdout").read_bytes() == b"\x00\xff binary\n"


def test_a_stream_without_the_start_line_is_all_text() -> None:
    lines: list[bytes] = []
    sink = OutputSink({"stdout": io.BytesIO(), "stderr": io.BytesIO()})
    relay_frames(io.BytesIO(b"bash: ringtrain: command not found\n"), sink, lines.append)
    assert lines == [b"bash: ringtrain: command not found\n"]


@pytest.mark.parametrize("cut", [3, len(START) + 4, -2])
def test_a_stream_broken_inside_a_frame_is_an_error(cut: int) -> None:
    data = _frames((1, "stdout", b"0123456789\n"))
    sink = OutputSink({"stdout": io.BytesIO(), "stderr": io.BytesIO()})
    if cut == 3:  # not even the start line: only text, no error
        relay_frames(io.BytesIO(data[:cut]), sink, lambda line: None)
        return
    with pytest.raises(ValueError, match="broke off inside a frame"):
        relay_frames(io.BytesIO(data[:cut]), sink, lambda line: None)


def test_a_frame_of_an_unknown_stream_is_an_error() -> None:
    sink = OutputSink({"stdout": io.BytesIO(), "stderr": io.BytesIO()})
    with pytest.raises(ValueError, match="stream 9"):
        relay_frames(io.BytesIO(START + bytes([9, 0, 0, 0, 1, 0, 0, 0, 1]) + b"x"), sink,
                     lambda line: None)


def test_a_follower_whose_launcher_is_gone_swallows_its_output() -> None:
    out = io.BytesIO()
    framed = FramedOutput(out)
    out.close()  # writes now raise ValueError, as a closed pipe raises BrokenPipeError
    framed.write(0, "stdout", b"lost\n")
    framed.close()
