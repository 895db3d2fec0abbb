"""Files carried through Ray for nodes without the service's share: a private copy's tar in
pieces, and chunks of logs and outputs (the module runs without Ray; test_ray_backend runs it
between real Ray nodes). Small piece and budget sizes stand for the real 8 MiB."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from ringtrain.jobs.service.executors.ray import transfer

from .conftest import wait_for

CARRIED = transfer.LOG_FOLDERS + transfer.OUTPUT_FOLDERS


def _packed(copy: transfer.PrivateCopy | str) -> transfer.PrivateCopy:
    """The copy once its tar is complete."""
    assert isinstance(copy, transfer.PrivateCopy), copy
    assert wait_for(lambda: copy.size is not None or copy.problem, timeout_s=10) is True
    return copy


def _send(copy: transfer.PrivateCopy, receiver: transfer.TarReceiver) -> int:
    """Pieces from the offsets the receiver reports until it has the tar; how many."""
    pieces = 0
    while not receiver.take(_piece(copy, receiver.received)):
        pieces += 1
        assert pieces < 1000
    return pieces + 1


def _piece(copy: transfer.PrivateCopy, offset: int) -> transfer.Piece:
    piece = copy.piece(offset)
    assert not isinstance(piece, str), piece
    return piece


def test_a_private_copy_comes_in_pieces_with_the_inputs_asked_for(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    (job_dir / "wd" / "pkg").mkdir(parents=True)
    (job_dir / "wd" / "pkg" / "train.py").write_text("print('hi')")
    big = os.urandom(50_000)  # over many pieces
    (job_dir / "wd" / "data.bin").write_bytes(big)
    (tmp_path / "labels.csv").write_text("a,b\n")
    (tmp_path / "images" / "cat").mkdir(parents=True)
    (tmp_path / "images" / "cat" / "1.jpg").write_bytes(b"\xff\xd8")
    copy = transfer.private_copy(job_dir, {"labels": str(tmp_path / "labels.csv"),
                                           "images": f"{tmp_path}/images/"}, piece_bytes=4096)
    copy = _packed(copy)
    receiver = transfer.TarReceiver(tmp_path / "copy.tar")
    try:
        assert _send(copy, receiver) == -(-copy.size // 4096)
    finally:
        copy.close()
    transfer.unpack(tmp_path / "copy.tar", tmp_path / "copy")
    out = tmp_path / "copy"
    assert (out / "wd" / "pkg" / "train.py").read_text() == "print('hi')"
    assert (out / "wd" / "data.bin").read_bytes() == big
    assert (out / "inputs" / "labels" / "labels.csv").read_text() == "a,b\n"  # name kept
    assert (out / "inputs" / "images" / "images" / "cat" / "1.jpg").read_bytes() == b"\xff\xd8"


def test_repeated_early_and_restarted_pieces_leave_one_exact_tar(tmp_path: Path) -> None:
    (tmp_path / "job" / "wd").mkdir(parents=True)
    (tmp_path / "job" / "wd" / "a").write_bytes(os.urandom(10_000))
    copy = _packed(transfer.private_copy(tmp_path / "job", {}, piece_bytes=1000))
    receiver = transfer.TarReceiver(tmp_path / "copy.tar")
    assert not receiver.take(_piece(copy, 0))
    assert not receiver.take(_piece(copy, 0))  # an answer taken twice: dropped
    assert not receiver.take(_piece(copy, 3000))  # ahead of what it holds: dropped
    assert receiver.received == 1000
    # A restarted service packed a tar of another size: the transfer starts over.
    assert not receiver.take((0, b"x" * 10, copy.size + 1))
    assert receiver.received == 10
    _send(copy, receiver)
    assert (tmp_path / "copy.tar").stat().st_size == copy.size
    transfer.unpack(tmp_path / "copy.tar", tmp_path / "out")
    assert (tmp_path / "out" / "wd" / "a").read_bytes() == \
        (tmp_path / "job" / "wd" / "a").read_bytes()
    copy.close()


def test_pieces_of_a_tar_still_being_written_are_taken_until_its_size_is_known(tmp_path: Path
                                                                               ) -> None:
    receiver = transfer.TarReceiver(tmp_path / "copy.tar")
    assert not receiver.take((0, b"abc", -1))  # all there is so far; more may come
    assert not receiver.take((3, b"", -1))  # nothing new written yet
    assert receiver.take((3, b"de", 5))
    assert (tmp_path / "copy.tar").read_bytes() == b"abcde"


def test_a_private_copy_says_what_the_service_cannot_send(tmp_path: Path) -> None:
    assert transfer.private_copy(tmp_path / "job", {}) == \
        f"the service has no working dir at {tmp_path / 'job' / 'wd'}"
    (tmp_path / "job" / "wd").mkdir(parents=True)
    missing = transfer.private_copy(tmp_path / "job", {"data": str(tmp_path / "absent")})
    assert missing == f"the service has no input data at {str(tmp_path / 'absent')!r}"


def test_a_private_copy_names_what_the_service_cannot_read(tmp_path: Path) -> None:
    (tmp_path / "job" / "wd").mkdir(parents=True)
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"x")
    secret.chmod(0)
    if os.access(secret, os.R_OK):
        pytest.skip("root reads a file without read permission")
    copy = transfer.private_copy(tmp_path / "job", {"data": str(secret)})
    assert isinstance(copy, transfer.PrivateCopy)
    wait_for(lambda: copy.problem, timeout_s=10)
    said = copy.piece(0)
    assert isinstance(said, str)
    assert said.startswith("the service cannot read the working dir and inputs data: ")
    assert "Permission denied" in said
    copy.close()


def test_a_tar_naming_a_path_outside_the_folder_is_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("../escaped")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    (tmp_path / "evil.tar").write_bytes(buffer.getvalue())
    with pytest.raises(tarfile.TarError):
        transfer.unpack(tmp_path / "evil.tar", tmp_path / "dst")
    assert not (tmp_path / "escaped").exists()


def _pull(node: Path, share: Path, budget: int, per_file: int | None = None
          ) -> tuple[int, list[list[str]]]:
    """Answers until nothing is pending, each from the sizes on the share, each written twice
    (an answer taken twice changes nothing); how many, and what each left pending."""
    rounds = []
    while not rounds or rounds[-1]:
        chunks, pending = transfer.new_chunks(node, transfer.file_sizes(share, CARRIED),
                                              CARRIED, budget, per_file)
        assert sum(len(data) for _, _, data in chunks) <= budget
        transfer.write_chunks(share, chunks, CARRIED)
        transfer.write_chunks(share, chunks, CARRIED)
        rounds.append(pending)
        assert len(rounds) < 1000
    return len(rounds), rounds


def test_outputs_bigger_than_an_answer_come_back_whole_within_the_budget(tmp_path: Path) -> None:
    node, share = tmp_path / "node", tmp_path / "share"
    (node / "outputs" / "model" / "ckpt").mkdir(parents=True)
    (share / "outputs").mkdir(parents=True)
    checkpoint = os.urandom(25_000)
    (node / "outputs" / "model" / "ckpt" / "last.pt").write_bytes(checkpoint)
    (node / "outputs" / "model" / "metrics.json").write_text('{"acc": 0.9}')
    (node / "outputs" / "model" / "empty").write_bytes(b"")
    os.symlink("/etc/passwd", node / "outputs" / "model" / "link")  # links are not carried
    answers, rounds = _pull(node, share, budget=4096)
    assert answers == 7  # 25,012 bytes in answers of at most 4096
    assert "outputs/model/ckpt/last.pt" in rounds[0]
    assert (share / "outputs" / "model" / "ckpt" / "last.pt").read_bytes() == checkpoint
    assert (share / "outputs" / "model" / "metrics.json").read_text() == '{"acc": 0.9}'
    assert (share / "outputs" / "model" / "empty").read_bytes() == b""
    assert not os.path.lexists(share / "outputs" / "model" / "link")


def test_a_restarted_service_resumes_from_the_sizes_on_the_share(tmp_path: Path) -> None:
    node, share = tmp_path / "node", tmp_path / "share"
    (node / "outputs" / "model").mkdir(parents=True)
    share.mkdir()
    checkpoint = os.urandom(20_000)
    (node / "outputs" / "model" / "last.pt").write_bytes(checkpoint)
    chunks, pending = transfer.new_chunks(node, {}, CARRIED, budget=8192)
    transfer.write_chunks(share, chunks, CARRIED)
    assert pending == ["outputs/model/last.pt"]
    # The service stops here; the next one asks from what the share holds: 8192 bytes.
    assert transfer.file_sizes(share, CARRIED) == {"outputs/model/last.pt": 8192}
    answers, _ = _pull(node, share, budget=8192)
    assert answers == 2
    assert (share / "outputs" / "model" / "last.pt").read_bytes() == checkpoint


def test_log_chunks_share_the_budget_and_no_log_holds_back_the_others(tmp_path: Path) -> None:
    node, share = tmp_path / "node", tmp_path / "share"
    (node / "stdouterr" / "rank.1").mkdir(parents=True)
    (node / "prep").mkdir()
    share.mkdir()
    log = node / "stdouterr" / "rank.1" / "stdout"
    log.write_bytes(b"a" * 10_010)  # a backlog over one chunk
    (node / "prep" / "node.1.stderr").write_text("prep\n")
    chunks, pending = transfer.new_chunks(node, {}, CARRIED, budget=8192, per_file=1000)
    assert {rel: len(data) for rel, _, data in chunks} == {"stdouterr/rank.1/stdout": 1000,
                                                           "prep/node.1.stderr": 5}
    assert pending == ["stdouterr/rank.1/stdout"]
    transfer.write_chunks(share, chunks, CARRIED)
    _pull(node, share, budget=8192, per_file=1000)
    with open(log, "ab") as f:  # a log grows: only the new bytes come
        f.write(b"line\n")
    chunks, pending = transfer.new_chunks(node, transfer.file_sizes(share, CARRIED), CARRIED)
    assert chunks == [("stdouterr/rank.1/stdout", 10_010, b"line\n")] and pending == []
    transfer.write_chunks(share, chunks, CARRIED)
    assert (share / "stdouterr" / "rank.1" / "stdout").read_bytes() == log.read_bytes()
    assert (share / "prep" / "node.1.stderr").read_text() == "prep\n"


def test_a_chunk_outside_the_carried_folders_or_through_a_link_is_refused(tmp_path: Path
                                                                           ) -> None:
    share = tmp_path / "share"
    share.mkdir()
    for rel in ("wd/train.py", "stdouterr/../wd/x", "/etc/passwd", "outputs", "../x"):
        with pytest.raises(ValueError, match="outside the job's stdouterr and prep and outputs"):
            transfer.write_chunks(share, [(rel, 0, b"x")], CARRIED)
    assert list(share.iterdir()) == []
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (share / "outputs").mkdir()
    os.symlink(elsewhere, share / "outputs" / "model")
    with pytest.raises(ValueError, match="through the link"):
        transfer.write_chunks(share, [("outputs/model/x", 0, b"x")], CARRIED)
    os.symlink(elsewhere / "file", share / "outputs" / "file")
    with pytest.raises(ValueError, match="a link on the share"):
        transfer.write_chunks(share, [("outputs/file", 0, b"x")], CARRIED)
    assert list(elsewhere.iterdir()) == []
