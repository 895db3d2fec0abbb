"""A remote `job submit` (issue 38): the working dir and local inputs travel as one streamed tar,
uploaded in chunks under the submit's idempotency key, resumed after a killed client, checked
by the service as it arrives. A real server on loopback with a home of its own, the client a
real `ringtrain` process with a home of its own (`--upload` makes it act as on another machine;
its folder is deleted once submit returns)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ringtrain.jobs.files.upload_tar import TarChecker, UploadRejected, extract, pack
from ringtrain.jobs.home import Home
from ringtrain.jobs.service.uploads import Uploads

from .conftest import bearer, wait_for

IDLE = "upidle"  # no nodes: its jobs wait, never run
RUN = "uprun"

CHECK = """\
import hashlib, os, pathlib
def digest(p):
    return hashlib.sha256(pathlib.Path(p).read_bytes()).hexdigest()
out = pathlib.Path(os.environ["RINGTRAIN_OUTPUT_RESULT"]) / "sums.txt"
data = os.environ["RINGTRAIN_INPUT_DATA"]
table = os.environ["RINGTRAIN_INPUT_TABLE"]
lines = [f"wd/model.py {digest('model.py')}", f"wd/pkg/a.bin {digest('pkg/a.bin')}",
         f"data/x.bin {digest(os.path.join(data, 'x.bin'))}", f"table {digest(table)}",
         f"ignored {os.path.exists('scratch.log')}", f"data_dir {data}", f"cwd {os.getcwd()}"]
out.write_text("\\n".join(lines) + "\\n")
"""


@pytest.fixture(scope="module")
def svc(served: tuple[Home, str]) -> Iterator[tuple[Home, str]]:
    home, url = served
    for name, nodes in ((IDLE, 0), (RUN, 1)):
        r = httpx.post(f"{url}/v1/clusters", json={"name": name, "nodes": nodes},
                       headers=bearer(home), timeout=30)
        assert r.status_code == 201, r.text
    yield home, url


def _client_env(svc: tuple[Home, str], tmp_path: Path, token: str | None = None
                ) -> dict[str, str]:
    """A client with a home of its own that reaches the service by its URL only."""
    home, url = svc
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGTRAIN_")}
    env.update(RINGTRAIN_HOME=str(tmp_path / "client-home"), RINGTRAIN_URL=url,
               RINGTRAIN_TOKEN=token or bearer(home)["Authorization"].split()[1])
    return env


def _submit(env: dict[str, str], spec: Path, *more: str, cluster: str = RUN,
            cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ringtrain.cli", "job", "submit", str(spec), "--cluster", cluster,
         "--upload", "-o", "json", *more], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=cwd)


def _received(url: str, home: Home, key: str) -> int:
    r = httpx.get(f"{url}/v1/uploads/{key}", headers=bearer(home), timeout=30)
    return int(r.json()["received"]) if r.status_code == 200 else 0


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_working_dir_only_the_client_has_runs(svc: tuple[Home, str], tmp_path: Path) -> None:
    home, url = svc
    client = tmp_path / "laptop"
    wd = client / "project"
    (wd / "pkg").mkdir(parents=True)
    (wd / "model.py").write_text(CHECK)
    (wd / "pkg" / "a.bin").write_bytes(os.urandom(300_000))
    (wd / ".gitignore").write_text("*.log\n")
    (wd / "scratch.log").write_text("not uploaded")
    (client / "data").mkdir()
    (client / "data" / "x.bin").write_bytes(os.urandom(70_000))
    (client / "table.csv").write_text("a,b\n1,2\n")
    expected = {"wd/model.py": _sha(wd / "model.py"), "wd/pkg/a.bin": _sha(wd / "pkg" / "a.bin"),
                "data/x.bin": _sha(client / "data" / "x.bin"),
                "table": _sha(client / "table.csv")}
    spec = client / "job.yaml"
    spec.write_text(json.dumps({
        "name": "up", "node_count": 1, "command": f"{sys.executable} model.py",
        "working_dir": "project",
        "inputs": {"data": "data", "table": "table.csv"}, "outputs": ["result"]}))
    proc = _submit(_client_env(svc, tmp_path), Path("job.yaml"), cwd=client)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "uploaded 5 files" in err
    job = json.loads(out)
    shutil.rmtree(client)  # the service must not need it
    assert job["spec"]["working_dir"].startswith("upload://")
    job_dir = Path(job["job_dir"])
    assert job["spec"]["inputs"] == {"data": str(job_dir / "inputs" / "data"),
                                     "table": str(job_dir / "inputs" / "table")}
    done = wait_for(lambda: (j := httpx.get(f"{url}/v1/jobs/{job['id']}", headers=bearer(home),
                                            timeout=30).json())["state"]
                    in ("succeeded", "failed") and j, timeout_s=120)
    assert done["state"] == "succeeded", done
    lines = dict(line.split(" ", 1) for line in
                 (job_dir / "outputs" / "result" / "sums.txt").read_text().splitlines())
    for name, digest in expected.items():
        assert lines[name] == digest, name
    assert lines["ignored"] == "False"
    assert lines["data_dir"] == str(job_dir / "inputs" / "data")
    assert not any((home.share_root / "uploads").glob("*"))  # removed after the submit


def test_a_killed_client_resumes_its_upload(svc: tuple[Home, str], tmp_path: Path) -> None:
    home, url = svc
    wd = tmp_path / "big"
    wd.mkdir()
    for i in range(50):
        (wd / f"part{i:02d}.bin").write_bytes(os.urandom(1 << 20))
    spec = tmp_path / "job.yaml"
    spec.write_text(json.dumps({"name": "big", "node_count": 1, "command": "true",
                                "working_dir": str(wd)}))
    env = _client_env(svc, tmp_path)
    for attempt in range(5):
        key = f"resume-{attempt}-{time.monotonic_ns()}"
        proc = _submit(env, spec, "--idempotency-key", key, cluster=IDLE)
        wait_for(lambda: _received(url, home, key) > 0 or proc.poll() is not None,  # noqa: B023
                 every_s=0.002)
        ended_by_itself = proc.poll() is not None
        proc.send_signal(signal.SIGSTOP)
        proc.kill()
        _, err = proc.communicate(timeout=30)
        received = _received(url, home, key)
        if 0 < received < 50 << 20:
            break
        # A client that ended before any byte came failed: say why, not "no upload" later.
        assert not (ended_by_itself and received == 0), (
            f"the client ended (exit {proc.returncode}) before it sent anything:\n{err}")
    else:
        pytest.skip("the upload always finished before the client could be killed")
    had = wait_for(lambda: (r := httpx.get(f"{url}/v1/uploads/{key}", headers=bearer(home),
                                           timeout=30)).status_code == 200 and r.json(),
                   timeout_s=30)
    assert not had["complete"]
    again = _submit(env, spec, "--idempotency-key", key, cluster=IDLE)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    resumed = int(err.split("resumed at byte ")[1].split()[0])
    assert resumed > 0
    jobs = httpx.get(f"{url}/v1/jobs", params={"idempotency_key": key}, headers=bearer(home),
                     timeout=30).json()
    assert len(jobs) == 1 and jobs[0]["id"] == json.loads(out)["id"]
    job_dir = Path(jobs[0]["job_dir"])
    third = _submit(env, spec, "--idempotency-key", key, cluster=IDLE)  # nothing sent again
    out, err = third.communicate(timeout=120)
    assert third.returncode == 0 and json.loads(out)["id"] == jobs[0]["id"], err
    assert "uploaded" not in err
    wait_for(lambda: httpx.get(f"{url}/v1/jobs/{jobs[0]['id']}", headers=bearer(home),
                               timeout=30).json()["state"] != "staging", timeout_s=60)
    for i in range(50):
        name = f"part{i:02d}.bin"
        assert _sha(job_dir / "wd" / name) == _sha(wd / name), name


def _tar(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, b""


@pytest.mark.parametrize(("members", "says"), [
    ((_file("wd/ok.py"), _link("wd/evil", "/etc/passwd")), "is a symbolic link"),
    ((_link("wd/hard", "/etc/shadow", tarfile.LNKTYPE),), "is a hard link"),
    ((_file("wd/../../escaped"),), "not a relative path"),
    ((_file("/tmp/absolute"),), "not a relative path"),
    ((_file("elsewhere/x"),), "not a relative path"),
])
def test_a_malicious_archive_is_refused(svc: tuple[Home, str], members: tuple[
        tuple[tarfile.TarInfo, bytes], ...], says: str) -> None:
    home, url = svc
    key = f"evil-{time.monotonic_ns()}"
    r = httpx.put(f"{url}/v1/uploads/{key}", params={"offset": 0, "manifest": "ab"},
                  content=_tar(*members), headers=bearer(home), timeout=30)
    assert r.status_code == 400, r.text
    assert says in r.json()["detail"]
    assert not (home.share_root / "uploads" / key).exists()
    assert not (home.share_root / "escaped").exists()
    assert not (home.share_root / "uploads" / "escaped").exists()


def test_an_oversize_member_is_refused_at_its_header(svc: tuple[Home, str]) -> None:
    home, url = svc
    info = tarfile.TarInfo("wd/huge")
    info.size = 3 << 30  # announced only: refused before any of it is sent
    r = httpx.put(f"{url}/v1/uploads/huge-{time.monotonic_ns()}",
                  params={"offset": 0, "manifest": "ab"},
                  content=info.tobuf(tarfile.PAX_FORMAT), headers=bearer(home), timeout=30)
    assert r.status_code == 400, r.text
    assert "the service's limit on a working dir" in r.json()["detail"]


def test_a_submit_without_a_whole_upload_is_refused(svc: tuple[Home, str]) -> None:
    home, url = svc
    key = f"part-{time.monotonic_ns()}"
    r = httpx.put(f"{url}/v1/uploads/{key}", params={"offset": 0, "manifest": "ab"},
                  content=_tar(_file("wd/a"))[:512], headers=bearer(home), timeout=30)
    assert r.json() == {"received": 512, "complete": False}
    r = httpx.post(f"{url}/v1/jobs", headers={**bearer(home), "Idempotency-Key": key},
                   json={"cluster": IDLE, "spec": {"command": "true", "node_count": 1,
                                                   "working_dir": "upload://wd"}}, timeout=30)
    assert r.status_code == 400 and "not complete" in r.json()["detail"], r.text


def test_uploads_are_private_and_need_a_submit_token(svc: tuple[Home, str]) -> None:
    home, url = svc

    def token(scope: str) -> str:
        r = httpx.post(f"{url}/v1/tokens", headers=bearer(home), timeout=30,
                       json={"scope": scope, "experiment": "exp"})
        assert r.status_code in (200, 201), r.text
        return str(r.json()["token"])

    reader = {"Authorization": f"Bearer {token('read')}"}
    submitter = {"Authorization": f"Bearer {token('submit')}"}
    body = _tar(_file("wd/a"))
    r = httpx.put(f"{url}/v1/uploads/mine", params={"offset": 0, "manifest": "ab"},
                  content=body, headers=reader, timeout=30)
    assert r.status_code == 403 and "scope is read" in r.json()["detail"], r.text
    r = httpx.put(f"{url}/v1/uploads/mine", params={"offset": 0, "manifest": "ab"},
                  content=body, headers=submitter, timeout=30)
    assert r.json()["complete"] is True, r.text
    for other in (reader, bearer(home)):  # not the admin's either: it is the token's own
        assert httpx.get(f"{url}/v1/uploads/mine", headers=other, timeout=30).status_code == 404
        r = httpx.put(f"{url}/v1/uploads/mine", params={"offset": 0, "manifest": "ab"},
                      content=body, headers=bearer(home), timeout=30)
        assert r.status_code == 404


# -- pure parts ---------------------------------------------------------------------------------


def test_the_archive_is_the_same_bytes_again_and_resumes_anywhere(tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    (wd / "b").mkdir(parents=True)
    (wd / "b" / "z.txt").write_bytes(os.urandom(5000))
    (wd / "a.txt").write_bytes(b"hello")
    (wd / ("long" * 40)).write_bytes(b"pax")  # a name over 100 bytes: a pax header
    (tmp_path / "in.txt").write_text("input")
    first = pack(wd, {"x": tmp_path / "in.txt"})
    whole = b"".join(first.stream())
    again = pack(wd, {"x": tmp_path / "in.txt"})
    assert again.manifest == first.manifest and b"".join(again.stream()) == whole
    assert first.size == len(whole)
    for start in (0, 1, 511, 512, 1000, 6000, len(whole) - 1024, len(whole) - 1):
        assert b"".join(first.stream(start)) == whole[start:], start
    checker = TarChecker(1 << 20)
    for i in range(0, len(whole), 700):
        checker.feed(whole[i:i + 700])
    assert checker.complete and checker.received == len(whole)
    tar = tmp_path / "up.tar"
    tar.write_bytes(whole)
    (tmp_path / "job").mkdir()
    extract(tar, tmp_path / "job", 1 << 20)
    assert (tmp_path / "job" / "wd" / "b" / "z.txt").read_bytes() == \
        (wd / "b" / "z.txt").read_bytes()
    assert (tmp_path / "job" / "inputs" / "x").read_text() == "input"
    names = [f.path for f in first.files]
    assert names == sorted(names[:-1]) + ["inputs/x"]


def test_the_size_cap_counts_file_bytes(tmp_path: Path) -> None:
    uploads = Uploads(tmp_path / "uploads", max_file_bytes=1000)
    opened = uploads.open("k", "admin", 0, "ab")
    with pytest.raises(UploadRejected, match="more than"):
        uploads.write(opened, _tar(_file("wd/a", bytes(600)), _file("wd/b", bytes(600))))
    assert not (tmp_path / "uploads" / "k").exists()
