"""The launcher's terminal and rank files for pieces of output: a progress bar is one updating
line with its prefix, a line finished in pieces reads as one, a line another rank cuts into is
ended and shown whole when it continues; the files keep the bytes as written."""

from __future__ import annotations

import io
from pathlib import Path

from ringtrain.runner.output import OutputSink


def _run(pieces: list[tuple[int, str, bytes]], directory: Path | None = None
         ) -> dict[str, bytes]:
    terminal = {"stdout": io.BytesIO(), "stderr": io.BytesIO()}
    sink = OutputSink(terminal, None if directory is None else str(directory))
    for rank in {rank for rank, _, _ in pieces}:
        sink.open_rank(rank)
    for rank, stream, piece in pieces:
        sink.write(rank, stream, piece)
    sink.close()
    return {name: out.getvalue() for name, out in terminal.items()}


def test_a_progress_bar_is_one_updating_line_with_its_prefix() -> None:
    shown = _run([(0, "stderr", b"\r"), (0, "stderr", b" 10%|#"), (0, "stderr", b"\r"),
                  (0, "stderr", b" 20%|##"), (0, "stderr", b"\r"), (0, "stderr", b"100%|###\n")])
    assert shown["stderr"] == (b"[0]<stderr>: 10%|#\r[0]<stderr>: 20%|##\r"
                               b"[0]<stderr>:100%|###\n")


def test_a_line_written_in_pieces_reads_as_one_line() -> None:
    shown = _run([(0, "stdout", b"epoch"), (0, "stdout", b" 3/5"), (0, "stdout", b"\n")])
    assert shown["stdout"] == b"[0]<stdout>:epoch 3/5\n"


def test_a_line_cut_into_is_ended_and_shown_whole_when_it_continues() -> None:
    shown = _run([(0, "stdout", b"epoch"), (1, "stdout", b"hello\n"), (0, "stdout", b" 3/5\n")])
    assert shown["stdout"] == (b"[0]<stdout>:epoch\n[1]<stdout>:hello\n"
                               b"[0]<stdout>:epoch 3/5\n")


def test_a_bar_stays_readable_when_another_stream_prints() -> None:
    shown = _run([(0, "stderr", b" 50%|##"), (0, "stdout", b"saved\n"), (0, "stderr", b"\r"),
                  (0, "stderr", b" 60%|###")])
    assert shown["stdout"] == b"[0]<stdout>:saved\n"
    # The bar's line is ended before the print; the bar then goes on below it.
    assert shown["stderr"] == b"[0]<stderr>: 50%|##\n[0]<stderr>: 60%|###\n"


def test_the_files_keep_the_bytes_and_the_combined_log_keeps_lines_apart(
        tmp_path: Path) -> None:
    pieces = [(2, "stderr", b"\r"), (2, "stderr", b" 10%"), (2, "stdout", b"loss 0.5\n"),
              (2, "stderr", b"\r"), (2, "stderr", b" 20%"), (2, "stderr", b"\r"),
              (2, "stderr", b"100%\n")]
    _run(pieces, tmp_path)
    assert (tmp_path / "rank.2" / "stderr").read_bytes() == b"\r 10%\r 20%\r100%\n"
    assert (tmp_path / "rank.2" / "stdout").read_bytes() == b"loss 0.5\n"
    assert (tmp_path / "rank.2" / "output").read_bytes() == (
        b"\r 10%\nloss 0.5\n\r 20%\r100%\n")


def test_a_rank_file_the_disk_refuses_is_given_up_and_the_terminal_keeps_the_lines(
        tmp_path: Path) -> None:
    # /dev/full answers every write with ENOSPC, as a full disk does.
    (tmp_path / "rank.0").mkdir()
    (tmp_path / "rank.0" / "stdout").symlink_to("/dev/full")
    shown = _run([(0, "stdout", b"epoch 1\n"), (0, "stderr", b"warning\n"),
                  (0, "stdout", b"epoch 2\n")], tmp_path)
    assert shown["stdout"] == b"[0]<stdout>:epoch 1\n[0]<stdout>:epoch 2\n"
    assert shown["stderr"].count(b"is no longer written to") == 1
    assert b"rank 0's stdout" in shown["stderr"] and b"No space left on device" in shown["stderr"]
    assert shown["stderr"].endswith(b"[0]<stderr>:warning\n")
    # the other files go on
    assert (tmp_path / "rank.0" / "stderr").read_bytes() == b"warning\n"
    assert (tmp_path / "rank.0" / "output").read_bytes() == b"epoch 1\nwarning\nepoch 2\n"
