"""Files carried through Ray for nodes without the service's share: tars and log chunks
(the module runs without Ray; test_ray_backend runs it between real Ray nodes)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from ringtrain.jobs.ray import transfer


def test_a_folder_goes_through_a_tar_whole(tmp_path: Path) -> None:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "train.py").write_text("print('hi')")
    (tmp_path / "src" / "data.bin").write_bytes(b"\0\1" * 1000)
    transfer.unpack(transfer.pack(tmp_path / "src", "the working dir"), tmp_path / "dst")
    assert (tmp_path / "dst" / "pkg" / "train.py").read_text() == "print('hi')"
    assert (tmp_path / "dst" / "data.bin").read_bytes() == b"\0\1" * 1000


def test_a_folder_over_the_limit_is_refused_saying_how_big(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * 3 * 2**20)
    with pytest.raises(transfer.TooLargeError,
                       match=r"the outputs of node 1 holds 3\.0 MiB, over the 2 MiB"):
        transfer.pack(tmp_path, "the outputs of node 1", limit=2 * 2**20)


def test_a_tar_naming_a_path_outside_the_folder_is_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("../escaped")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(tarfile.TarError):
        transfer.unpack(buffer.getvalue(), tmp_path / "dst")
    assert not (tmp_path / "escaped").exists()


def test_log_chunks_from_the_share_offsets_rebuild_the_logs_once(tmp_path: Path) -> None:
    node, share = tmp_path / "node", tmp_path / "share"
    (node / "stdouterr" / "rank.1").mkdir(parents=True)
    (node / "prep").mkdir()
    (share / "stdouterr").mkdir(parents=True)
    log = node / "stdouterr" / "rank.1" / "stdout"
    log.write_bytes(b"a" * (transfer.LOG_CHUNK + 10))  # a backlog over one chunk
    (node / "prep" / "node.1.stderr").write_text("prep\n")
    rounds = []
    for _ in range(4):
        chunks, more = transfer.new_log_chunks(node, transfer.log_sizes(share))
        transfer.write_log_chunks(share, chunks)
        transfer.write_log_chunks(share, chunks)  # an answer taken twice changes nothing
        rounds.append(more)
        with open(log, "ab") as f:
            f.write(b"line\n")
    assert rounds[:2] == [True, False]
    assert (share / "stdouterr" / "rank.1" / "stdout").read_bytes() == log.read_bytes()[:-5]
    assert (share / "prep" / "node.1.stderr").read_text() == "prep\n"


def test_a_chunk_outside_the_log_folders_is_refused(tmp_path: Path) -> None:
    for rel in ("wd/train.py", "stdouterr/../wd/x", "/etc/passwd"):
        with pytest.raises(ValueError, match="outside the job's logs"):
            transfer.write_log_chunks(tmp_path, [(rel, 0, b"x")])
    assert list(tmp_path.iterdir()) == []
