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


def test_files_and_folders_go_through_one_tar_each_at_its_own_path(tmp_path: Path) -> None:
    (tmp_path / "wd").mkdir()
    (tmp_path / "wd" / "train.py").write_text("print('hi')")
    (tmp_path / "labels.csv").write_text("a,b\n")
    (tmp_path / "images" / "cat").mkdir(parents=True)
    (tmp_path / "images" / "cat" / "1.jpg").write_bytes(b"\xff\xd8")
    parts = {"wd": tmp_path / "wd",
             transfer.input_arcname("labels", str(tmp_path / "labels.csv")): tmp_path / "labels.csv",
             transfer.input_arcname("images", f"{tmp_path}/images/"): tmp_path / "images"}
    transfer.unpack(transfer.pack_tree(parts, "the working dir and inputs"), tmp_path / "copy")
    copy = tmp_path / "copy"
    assert (copy / "wd" / "train.py").read_text() == "print('hi')"
    assert (copy / "inputs" / "labels" / "labels.csv").read_text() == "a,b\n"  # name kept
    assert (copy / "inputs" / "images" / "images" / "cat" / "1.jpg").read_bytes() == b"\xff\xd8"


def test_the_limit_counts_every_part(tmp_path: Path) -> None:
    (tmp_path / "wd").mkdir()
    (tmp_path / "wd" / "a").write_bytes(b"x" * 2**20)
    (tmp_path / "big.bin").write_bytes(b"x" * 2 * 2**20)
    with pytest.raises(transfer.TooLargeError,
                       match=r"the working dir and inputs data holds 3\.0 MiB, over the 2 MiB"):
        transfer.pack_tree({"wd": tmp_path / "wd", "inputs/data/big.bin": tmp_path / "big.bin"},
                           "the working dir and inputs data", limit=2 * 2**20)


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


def test_a_private_copy_holds_the_working_dir_and_the_inputs_asked_for(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    (job_dir / "wd").mkdir(parents=True)
    (job_dir / "wd" / "train.py").write_text("x")
    (tmp_path / "labels.csv").write_text("a,b\n")
    tar = transfer.private_copy(job_dir, {"labels": str(tmp_path / "labels.csv")})
    transfer.unpack(tar, tmp_path / "copy")
    assert (tmp_path / "copy" / "wd" / "train.py").read_text() == "x"
    assert (tmp_path / "copy" / "inputs" / "labels" / "labels.csv").read_text() == "a,b\n"


def test_a_private_copy_over_the_limit_is_refused_naming_the_inputs(tmp_path: Path) -> None:
    (tmp_path / "job" / "wd").mkdir(parents=True)
    with open(tmp_path / "huge.bin", "wb") as f:  # sparse: its size costs no disk
        f.truncate(transfer.TRANSFER_LIMIT + 1)
    said = transfer.private_copy(tmp_path / "job", {"data": str(tmp_path / "huge.bin")})
    assert isinstance(said, str)
    assert said.startswith("the working dir and inputs data holds 64.0 MiB, over the 64 MiB")
    assert "mount the share (and the inputs)" in said
    missing = transfer.private_copy(tmp_path / "job", {"data": str(tmp_path / "absent")})
    assert missing == f"the service has no input data at {str(tmp_path / 'absent')!r}"
