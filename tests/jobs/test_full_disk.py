"""A full disk (issue 35): the service keeps answering reads, refuses the writes it cannot make
with a 507 naming the disk and its free space, refuses new jobs below a floor of free space, and
a job that filled its disk ends failed saying so, with its last output, and stays so recorded
once space returns.

The scenario runs a real server whose home is on a 50 MB tmpfs (root only: it skips saying why
elsewhere); the pieces (the store's full database, the floor, the reserve, the log's pace, the
runner's held output) are tested alone, without root."""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ringtrain.jobs.client.connection import running_server, stop_server
from ringtrain.jobs.disk_space import MB, SpaceReserve, is_disk_full
from ringtrain.jobs.errors import DiskFullError
from ringtrain.jobs.home import Home
from ringtrain.jobs.models import ClusterSpec, JobInfo, parse_job_spec
from ringtrain.jobs.models.tokens import TokenRequest, TokenScope
from ringtrain.jobs.service.disk_guard import DiskGuard, ThrottledLog
from ringtrain.jobs.service.executors.local import procs
from ringtrain.jobs.service.executors.local.backend import LocalBackend
from ringtrain.jobs.service.executors.local.runner_output import RunnerOutput
from ringtrain.jobs.service.job_service import JobService
from ringtrain.jobs.service.share import Share
from ringtrain.jobs.service.store import SQLiteStore
from ringtrain.jobs.service.tokens import Tokens
from tests.clock import FakeClock

from .conftest import FakeExecutor, bearer, wait_for, wait_for_ticks

#: The test disk's size, and the floor the server is started with.
DISK_MB = 50
FLOOR_MB = 4
#: Fills the job's folder until the disk refuses, then fails (dd says why on stderr).
FILLER = "dd if=/dev/zero of=fill bs=64k; exit 1"


# -- the scenario: a real server on a small disk ---------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 50 MB tmpfs, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs",
                           str(mount)], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)


@pytest.fixture
def full_disk_server(small_disk: Path, tmp_path: Path,
                     monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Home, Path]]:
    """A server whose home is on the small disk, started with ``--min-free-mb 4``; its log is
    on another disk (so that every line it writes can be counted). Yields the home and the
    log; the server and every job process are stopped afterwards."""
    home = Home(small_disk / "home").ensure()
    log = tmp_path / "server.log"
    monkeypatch.setenv("RINGTRAIN_HOME", str(home.root))
    monkeypatch.delenv("RINGTRAIN_URL", raising=False)
    with open(log, "ab") as out:
        subprocess.Popen([sys.executable, "-m", "ringtrain.cli", "server", "--min-free-mb",
                          str(FLOOR_MB)], stdin=subprocess.DEVNULL, stdout=out,
                         stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: running_server(home), timeout_s=60, every_s=0.2)
        yield home, log
    finally:
        stop_server(home)
        jobs = home.share_root / "jobs"
        for job_dir in (jobs.iterdir() if jobs.exists() else []):
            for pid in procs.job_pids(job_dir.name):
                os.kill(pid, signal.SIGKILL)


def _fill(path: Path) -> None:
    """Write to ``path`` until the disk has no room left."""
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(bytes(64 * 1024))
        except OSError as e:
            assert is_disk_full(e), e
        try:  # the last pages, a byte at a time
            while True:
                f.write(b"x")
        except OSError as e:
            assert is_disk_full(e), e


def test_a_job_filling_the_disk_fails_naming_it_while_reads_go_on(
        full_disk_server: tuple[Home, Path], small_disk: Path) -> None:
    home, log = full_disk_server
    info = running_server(home)
    assert info is not None
    api = httpx.Client(base_url=info.url + "/v1", headers=bearer(home), timeout=60)

    def submit(command: str) -> httpx.Response:
        return api.post("/jobs", json={"cluster": "local",
                                       "spec": {"node_count": 1, "command": command}})

    assert api.post("/clusters", json={"name": "local", "nodes": 2}).status_code == 201
    disk = wait_for(lambda: api.get("/health").json()["disk"])
    assert disk["floor_bytes"] == FLOOR_MB * MB and not disk["below_floor"]
    assert wait_for(lambda: home.reserve_file.exists())  # the home's reserve, made once

    filler = submit(FILLER)
    assert filler.status_code == 201, filler.text
    job_id = filler.json()["id"]

    # The job ends failed, not stuck running, naming the full disk, with its last output.
    job = wait_for(lambda: _ended(api, job_id), timeout_s=180, every_s=0.5)
    assert job["state"] == "failed", job
    assert job["exit_code"] == 1
    job_dir = home.share_root / "jobs" / job_id
    assert f"the disk holding {job_dir} is full:" in job["message"]
    assert " MB free" in job["message"]
    assert "No space left on device" in job["message"]  # quoted from the last output

    # Full now (below the floor): reads answer, a submit is refused with what to do.
    for path in ("/health", "/jobs", f"/jobs/{job_id}", "/clusters", "/host"):
        assert api.get(path).status_code == 200, path
    assert api.get("/host").json()["disk"]["below_floor"]
    refused = submit("echo never")
    assert refused.status_code == 507, refused.text
    detail = refused.json()["detail"]
    assert "is full:" in detail and " MB free" in detail and "--min-free-mb" in detail

    # Fill the last bytes too: a write the database cannot make is refused, not a 500.
    _fill(small_disk / "more")
    answers = []
    for n in range(600):
        answers.append(api.post("/clusters", json={"name": f"c{n}", "nodes": 1}).status_code)
        if answers[-1] == 507:
            break
    assert answers[-1] == 507, f"no write was refused: {sorted(set(answers))}"
    assert set(answers) <= {201, 507}
    assert api.get("/jobs").status_code == 200
    text = log.read_text(errors="replace")
    assert "Traceback" not in text and "database or disk is full" not in text, text[-3000:]
    assert 1 <= text.count("writes refused: the disk holding") <= 2, text[-3000:]

    # Space returns: the records stay as they were, the reserve comes back, submits work.
    (small_disk / "more").unlink()
    (job_dir / "wd" / "fill").unlink()
    wait_for(lambda: not api.get("/health").json()["disk"]["below_floor"])
    wait_for_ticks(home)
    assert api.get(f"/jobs/{job_id}").json() == job
    assert wait_for(lambda: home.reserve_file.exists())
    after = submit("echo after")
    assert after.status_code == 201, after.text
    assert wait_for(lambda: _ended(api, after.json()["id"]), timeout_s=120)["state"] == \
        "succeeded"
    # What the full disk held back of the runner's log is there once there was room.
    runner_log = (job_dir / "launcher" / "launcher.log").read_text(errors="replace")
    assert "No space left on device" in runner_log
    assert "Traceback" not in log.read_text(errors="replace")


def _ended(api: httpx.Client, job_id: str) -> dict | None:
    job = api.get(f"/jobs/{job_id}").json()
    return job if job["state"] in ("succeeded", "failed", "terminated") else None


# -- the pieces ------------------------------------------------------------------------------


def test_a_full_database_refuses_the_write_and_takes_the_next(tmp_path: Path) -> None:
    """SQLITE_FULL becomes a DiskFullError naming the folder and its free space; nothing of
    the write is kept, reads go on, and the connection takes the next write."""
    told: list[Path] = []
    store = SQLiteStore(tmp_path / "jobs.sqlite", on_full=told.append)
    db = store._conn()  # noqa: SLF001 - the test thread's connection, which the store uses
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")  # SQLite's own "database or disk is full"
    with pytest.raises(DiskFullError, match=rf"the disk holding {tmp_path} is full: .* MB free"):
        for n in range(200):  # until a write needs a page more
            store.add_cluster(ClusterSpec(name=f"c{n}", nodes=50), 0.0)
    assert told == [tmp_path]
    names = [c.name for c in store.list_clusters()]
    assert all(store.get_cluster(name).current_nodes == 50 for name in names)
    db.execute(f"PRAGMA max_page_count = {2**30}")
    store.add_cluster(ClusterSpec(name="later", nodes=1), 0.0)
    assert store.get_cluster("later").current_nodes == 1
    store.close()


def test_a_scoped_token_reads_on_a_full_disk(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Recording a token's last use is a write; a full disk must not refuse the read."""
    store = SQLiteStore(tmp_path / "jobs.sqlite")
    tokens = Tokens(store.tokens, FakeClock())
    new = tokens.create(TokenRequest(scope=TokenScope.READ))

    def full(token_id: str, now: float) -> None:
        raise DiskFullError("the disk holding x is full: 0.0 MB free")

    monkeypatch.setattr(store.tokens, "mark_used", full)
    info = tokens.authenticate(new.token)
    assert info is not None and info.id == new.info.id
    store.close()


def test_submits_are_refused_below_the_floor(tmp_path: Path) -> None:
    free = {"bytes": 500 * MB}
    guard = DiskGuard([tmp_path], floor_mb=100, measure=lambda _: (free["bytes"], 10_000 * MB))
    store = SQLiteStore(tmp_path / "jobs.sqlite")
    service = JobService(store, Share(tmp_path / "share"), [LocalBackend(FakeExecutor())],
                         disk=guard)
    service.create_cluster(ClusterSpec(name="c", nodes=1))
    spec = parse_job_spec({"node_count": 1, "command": "true"})
    kept = service.submit("c", spec, idempotency_key="k1")
    free["bytes"] = 99 * MB
    with pytest.raises(DiskFullError) as refused:
        service.submit("c", spec)
    assert f"the disk holding {tmp_path} is full" in str(refused.value)
    assert "new jobs need 100 MB" in str(refused.value)
    assert refused.value.http_status == 507
    assert [j.id for j in store.list_jobs()] == [kept.id]  # nothing recorded
    # A retried submit still finds the job its key recorded.
    assert service.submit("c", spec, idempotency_key="k1").id == kept.id
    status = guard.status()
    assert status is not None and status.below_floor and status.free_bytes == 99 * MB
    store.close()


def test_the_default_floor_is_100_mb_or_a_twentieth_of_a_small_disk() -> None:
    guard = DiskGuard([Path("/")])
    assert guard.floor(1000 * 10**9) == 100 * MB
    assert guard.floor(50 * MB) == int(2.5 * MB)
    assert DiskGuard([Path("/")], floor_mb=0).floor(50 * MB) == 0


def test_the_reserve_is_given_up_on_a_full_disk_and_made_again(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture
                                                              ) -> None:
    free = {"bytes": 500 * MB}
    clock = FakeClock()
    reserve = tmp_path / "space.reserve"
    guard = DiskGuard([tmp_path], floor_mb=100, reserve=reserve, clock=clock,
                      measure=lambda _: (free["bytes"], 10_000 * MB))
    guard.refresh()
    assert reserve.stat().st_blocks * 512 >= 4 << 20  # allocated, not sparse
    free["bytes"] = 0
    with caplog.at_level(logging.WARNING, "ringtrain.jobs.service.disk_guard"):
        guard.on_full(tmp_path)
        for _ in range(50):  # every write of every tick, while the disk stays full
            guard.on_full(tmp_path)
        assert not reserve.exists()
        guard.refresh()
        assert not reserve.exists()  # no room for it yet
        clock.advance(61)
        guard.on_full(tmp_path)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"writes refused: the disk holding {tmp_path} is full: 0.0 MB")
    assert "gave up the reserve (4.2 MB)" in lines[0]
    assert lines[1].endswith("(50 more since the last such line)")
    assert all("Traceback" not in line for line in lines)
    free["bytes"] = 500 * MB
    guard.refresh()
    assert reserve.exists()


def test_a_repeated_failure_is_logged_once_per_interval_with_a_count(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    throttled = ThrottledLog(logging.getLogger("test.full"), every_s=60, clock=clock)
    with caplog.at_level(logging.WARNING, "test.full"):
        assert throttled.warning("full")
        assert not any(throttled.warning("full") for _ in range(99))
        clock.advance(60)
        assert throttled.warning("full")
    assert [r.getMessage() for r in caplog.records] == [
        "full", "full (99 more since the last such line)"]


def test_a_reserve_holds_its_space_until_released(tmp_path: Path) -> None:
    reserve = SpaceReserve(tmp_path / "r", 1 << 20)
    assert reserve.make() and reserve.held
    assert (tmp_path / "r").stat().st_blocks * 512 >= 1 << 20
    assert reserve.release() and not reserve.held
    assert not reserve.release()
    assert not SpaceReserve(tmp_path / "no" / "r", 1).make()  # no room to make it: no error


def test_the_runner_holds_what_the_disk_refuses_and_writes_it_later(tmp_path: Path) -> None:
    """/dev/full refuses every write with ENOSPC, as a full disk does."""
    log = os.open(os.devnull, os.O_WRONLY)
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, log)
    output = RunnerOutput(log)
    child = output.child_stdout()
    subprocess.run([sys.executable, "-c", "import sys; print('step 1', flush=True); "
                    "print('filler: No space left on device', file=sys.stderr)"],
                   stdout=child, stderr=child, check=True, timeout=60)
    output.note("job runner: a note")
    output.close(timeout_s=30)
    assert output.refused
    assert output.tail() == ["step 1", "filler: No space left on device", "job runner: a note"]
    kept = tmp_path / "launcher.log"
    file = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(file, log)  # room again
    assert output.flush()
    assert kept.read_text() == ("step 1\nfiller: No space left on device\n"
                                "job runner: a note\n")
    for fd in (log, full, file):
        os.close(fd)


def test_disk_full_errors_are_recognised() -> None:
    import sqlite3

    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert is_disk_full(sqlite3.OperationalError("database or disk is full"))
    assert not is_disk_full(sqlite3.OperationalError("database is locked"))



def test_a_full_disk_met_by_a_route_is_a_507_naming_it(store, share, fake_executor, clock,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``OSError`` of a full disk (an upload's file, say) is answered 507, not 500."""
    from fastapi.testclient import TestClient

    from ringtrain.jobs.service.api.app import create_app

    service = JobService(store, share, [LocalBackend(fake_executor)], clock)
    errors = [OSError(errno.ENOSPC, "No space left on device",
                      str(share.root / "uploads" / "k" / "data.tar")),
              OSError(errno.EACCES, "Permission denied")]

    def fail() -> None:
        raise errors.pop(0)

    monkeypatch.setattr(service, "list_clusters", fail)
    with TestClient(create_app(service), raise_server_exceptions=False) as client:
        full = client.get("/v1/clusters")
        assert full.status_code == 507
        assert full.json()["detail"].startswith(
            f"the disk holding {share.root / 'uploads' / 'k'} is full: ")
        assert " MB free" in full.json()["detail"]
        assert client.get("/v1/clusters").status_code == 500  # any other error stays a fault


def test_a_runner_gone_on_a_full_disk_is_settled_naming_the_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner that could not report at all (its reserve taken): the likely reason leads."""
    from ringtrain.jobs.service.executors.local import executor as local
    from ringtrain.jobs.service.executors.local.records import RunnerHandle
    from ringtrain.jobs.service.executors.phase import Phase

    monkeypatch.setattr(local, "full_note",
                        lambda path: f"the disk holding {path} is full: 0.0 MB free")
    job_dir = tmp_path / "j-1"
    (job_dir / "launcher").mkdir(parents=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    job = JobInfo(id="j-1", cluster="c", spec=parse_job_spec({"node_count": 1,
                                                              "command": "true"}),
                  state="running", created_at=0.0, job_dir=str(job_dir))
    seen = local.LocalExecutor(Share(tmp_path), use_cgroups=False).poll(
        job, RunnerHandle(pid=gone.pid, start_ticks=None, attempt=0))
    assert seen.phase is Phase.LOST
    assert seen.message == (f"the disk holding {job_dir} is full: 0.0 MB free; the job runner "
                            f"(pid {gone.pid}) ended without reporting an exit status")
