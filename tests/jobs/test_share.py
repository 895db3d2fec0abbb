"""Job folders: working-dir copies, the job environment, and paths that try to leave the folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ringtrain.jobs.errors import InvalidRequestError, NotFoundError
from ringtrain.jobs.models import JobInfo, parse_job_spec
from ringtrain.jobs.service.share import Share

from .conftest import flipping, returns_within

pytestmark = pytest.mark.fast  # in-process: the tier of `scripts/test.sh --fast`


def make_job(share: Share, tmp_path: Path, **spec) -> JobInfo:
    spec = parse_job_spec({"node_count": 1, "command": "true", **spec})
    job_dir = share.create_job_dir("j1", spec)
    return JobInfo(id="j1", cluster="c", spec=spec, state="queued", created_at=0.0,
                   job_dir=str(job_dir))


def test_working_dir_is_copied_without_clutter(share: Share, tmp_path: Path) -> None:
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "train.py").write_text("print(1)")
    for junk in (".git", ".venv", "pkg/__pycache__"):
        (src / junk).mkdir(parents=True)
        (src / junk / "x").write_text("junk")
    job = make_job(share, tmp_path, working_dir=str(src), outputs=["model", "logs"])
    wd = Path(job.job_dir) / "wd"
    copied = sorted(p.relative_to(wd).as_posix() for p in wd.rglob("*"))
    assert copied == ["pkg", "pkg/train.py"]
    assert (Path(job.job_dir) / "outputs" / "model").is_dir()


def test_share_inside_working_dir_is_not_copied_into_itself(tmp_path: Path) -> None:
    share = Share(tmp_path / "state" / "share")
    (tmp_path / "a.txt").write_text("a")
    job = make_job(share, tmp_path, working_dir=str(tmp_path))
    wd = Path(job.job_dir) / "wd"
    assert (wd / "a.txt").exists() and not (wd / "state" / "share").exists()


def test_special_files_in_the_working_dir_are_refused_by_name(share: Share,
                                                               tmp_path: Path) -> None:
    src = tmp_path / "proj"
    (src / "sub").mkdir(parents=True)
    os.mkfifo(src / "sub" / "pipe")
    with pytest.raises(InvalidRequestError, match=r"working_dir: '.*/sub/pipe' is a named pipe"):
        make_job(share, tmp_path, working_dir=str(src))
    assert not share.job_dir("j1").exists()


def test_symlinks_in_the_working_dir_are_copied_as_links_even_loops(share: Share,
                                                                      tmp_path: Path) -> None:
    src = tmp_path / "proj"
    src.mkdir()
    (src / "loop").symlink_to("loop")
    (src / "out").symlink_to("/etc/passwd")
    job = make_job(share, tmp_path, working_dir=str(src))
    assert os.readlink(Path(job.job_dir) / "wd" / "loop") == "loop"
    assert os.readlink(Path(job.job_dir) / "wd" / "out") == "/etc/passwd"


def test_missing_working_dir_leaves_nothing(share: Share, tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="is not a folder"):
        make_job(share, tmp_path, working_dir=str(tmp_path / "nope"))
    assert not share.job_dir("j1").exists()


def test_job_environment(share: Share, tmp_path: Path) -> None:
    job = make_job(share, tmp_path, inputs={"data": "/data/fashion"}, outputs=["model"],
                   environment={"LR": 0.1})
    env = share.job_environ(job)
    assert env["RINGTRAIN_JOB_ID"] == "j1"
    assert env["RINGTRAIN_SHARE_ROOT"] == str(share.root)
    assert env["RINGTRAIN_INPUT_DATA"] == "/data/fashion"
    assert env["RINGTRAIN_OUTPUT_MODEL"] == str(Path(job.job_dir) / "outputs" / "model")
    assert os.path.isabs(env["RINGTRAIN_OUTPUT_MODEL"]) and env["LR"] == "0.1"


@pytest.mark.parametrize("path,says", [
    ("../j2/secret", "leads outside"), ("../../..", "leads outside"), ("/etc/passwd", "relative"),
    ("outputs/../../j2", "leads outside"), ("wd/../../../x", "leads outside"),
    ("outputs/a\0b", "NUL byte"), ("outputs/" + "a" * 256, "longer than 255 bytes"),
    ("outputs/" + "a/" * 2100, "longer than 4096 bytes"),
])
def test_paths_outside_the_job_folder_or_malformed_are_refused(share: Share, tmp_path: Path,
                                                               path: str, says: str) -> None:
    make_job(share, tmp_path)
    with pytest.raises(InvalidRequestError, match=says):
        share.open_file("j1", path)
    with pytest.raises(InvalidRequestError, match=says):
        list(share.iter_files("j1", path))


def test_symlinks_are_never_followed_nor_listed(share: Share, tmp_path: Path) -> None:
    job = make_job(share, tmp_path, outputs=["model"])
    secret = tmp_path / "secret.txt"
    secret.write_text("s")
    out = Path(job.job_dir) / "outputs" / "model"
    (out / "weights.pt").write_bytes(b"123")
    (out / "leak").symlink_to(secret)
    (out / "inside").symlink_to("weights.pt")
    (Path(job.job_dir) / "linked").symlink_to("outputs")
    for path in ("outputs/model/leak", "outputs/model/inside", "linked/model/weights.pt"):
        with pytest.raises(InvalidRequestError, match="symbolic link"):
            share.open_file("j1", path)
    with pytest.raises(InvalidRequestError, match="symbolic link"):
        list(share.iter_files("j1", "linked"))
    files = list(share.iter_files("j1", ""))
    assert [(f.path, f.size) for f in files] == [("outputs/model/weights.pt", 3)]
    with share.open_file("j1", "outputs/model/../model/weights.pt") as f:
        assert f.read() == b"123"


def test_a_file_swapped_for_a_symlink_is_never_served(share: Share, tmp_path: Path) -> None:
    """The race of issue 15: a job flips a file and a symlink to a secret while it is served."""
    job = make_job(share, tmp_path, outputs=["o"])
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET")
    read = []
    with flipping(Path(job.job_dir) / "outputs" / "o" / "f", secret):
        for _ in range(400):
            try:
                with share.open_file("j1", "outputs/o/f") as f:
                    read.append(f.read())
            except (InvalidRequestError, NotFoundError):
                pass
    assert b"SECRET" not in read


def test_pipes_are_neither_opened_nor_listed(share: Share, tmp_path: Path) -> None:
    job = make_job(share, tmp_path, outputs=["o"])
    os.mkfifo(Path(job.job_dir) / "outputs" / "o" / "pipe")
    with pytest.raises(InvalidRequestError, match="not a regular file"):
        # opening a pipe would wait for a writer, forever
        returns_within(30, share.open_file, "j1", "outputs/o/pipe")
    assert list(share.iter_files("j1", "outputs")) == []


def test_hard_links_are_served(share: Share, tmp_path: Path) -> None:
    """Documented in share.py: a hard link exposes nothing its job could not copy."""
    job = make_job(share, tmp_path, outputs=["o"])
    other = tmp_path / "other.txt"
    other.write_text("linked")
    os.link(other, Path(job.job_dir) / "outputs" / "o" / "hard")
    with share.open_file("j1", "outputs/o/hard") as f:
        assert f.read() == b"linked"


def test_list_files(share: Share, tmp_path: Path) -> None:
    job = make_job(share, tmp_path, outputs=["model"])
    (Path(job.job_dir) / "outputs" / "model" / "m.pt").write_bytes(b"x")
    assert [f.path for f in share.iter_files("j1", "outputs/model/m.pt")] == [
        "outputs/model/m.pt"]
    assert [f.path for f in share.iter_files("j1", "./outputs//model/")] == ["outputs/model/m.pt"]
    with pytest.raises(NotFoundError):
        list(share.iter_files("j1", "outputs/nothing"))
    with pytest.raises(NotFoundError):
        list(share.iter_files("j1", "outputs/model/m.pt/x"))
    with pytest.raises(InvalidRequestError, match="is a folder"):
        share.open_file("j1", "outputs/model")


def test_archive_attempt(share: Share, tmp_path: Path) -> None:
    job = make_job(share, tmp_path)
    log = Path(job.job_dir) / "stdouterr" / "rank.0"
    log.mkdir(parents=True)
    (log / "stdout").write_text("first")
    share.archive_attempt("j1", 0)
    assert (Path(job.job_dir) / "attempts/0/stdouterr/rank.0/stdout").read_text() == "first"
    assert list((Path(job.job_dir) / "stdouterr").iterdir()) == []
