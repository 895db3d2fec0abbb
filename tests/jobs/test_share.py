"""Job folders: working-dir copies, the job environment, and paths that try to leave the folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ringtrain.jobs.errors import InvalidRequestError, NotFoundError
from ringtrain.jobs.models import JobInfo, parse_job_spec
from ringtrain.jobs.share import Share


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


@pytest.mark.parametrize("path", ["../j2/secret", "../../..", "/etc/passwd",
                                  "outputs/../../j2", "wd/../../../x"])
def test_paths_outside_the_job_folder_are_refused(share: Share, tmp_path: Path,
                                                  path: str) -> None:
    make_job(share, tmp_path)
    with pytest.raises(InvalidRequestError):
        share.resolve("j1", path)
    with pytest.raises(InvalidRequestError):
        share.list_files("j1", path)


def test_symlink_out_of_the_folder_is_refused_and_not_listed(share: Share,
                                                             tmp_path: Path) -> None:
    job = make_job(share, tmp_path, outputs=["model"])
    secret = tmp_path / "secret.txt"
    secret.write_text("s")
    out = Path(job.job_dir) / "outputs" / "model"
    (out / "weights.pt").write_bytes(b"123")
    (out / "leak").symlink_to(secret)
    with pytest.raises(InvalidRequestError, match="outside"):
        share.resolve("j1", "outputs/model/leak")
    files = share.list_files("j1", "outputs")
    assert [(f.path, f.size) for f in files] == [("outputs/model/weights.pt", 3)]


def test_list_files(share: Share, tmp_path: Path) -> None:
    job = make_job(share, tmp_path, outputs=["model"])
    (Path(job.job_dir) / "outputs" / "model" / "m.pt").write_bytes(b"x")
    assert [f.path for f in share.list_files("j1", "outputs/model/m.pt")] == [
        "outputs/model/m.pt"]
    with pytest.raises(NotFoundError):
        share.list_files("j1", "outputs/nothing")


def test_archive_attempt(share: Share, tmp_path: Path) -> None:
    job = make_job(share, tmp_path)
    log = Path(job.job_dir) / "stdouterr" / "rank.0"
    log.mkdir(parents=True)
    (log / "stdout").write_text("first")
    share.archive_attempt("j1", 0)
    assert (Path(job.job_dir) / "attempts/0/stdouterr/rank.0/stdout").read_text() == "first"
    assert list((Path(job.job_dir) / "stdouterr").iterdir()) == []
