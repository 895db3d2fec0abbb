"""Fixtures of the job service tests: a real SQLite store, a fake clock and executor for the
scheduler's logic, a per-test RINGTRAIN_HOME whose real server is stopped afterwards, a real server
shared by one test module, and the CLI run in-process."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from ringtrain import cli as ringtrain_cli
from ringtrain.jobs.errors import RecordError
from ringtrain.jobs.home import Home
from ringtrain.jobs.models import ClusterSpec, JobInfo, NodeInfo, parse_job_spec
from ringtrain.jobs.service.api.auth import home_token
from ringtrain.jobs.service.executors.base import Observation
from ringtrain.jobs.service.executors.local import cgroups, procs
from ringtrain.jobs.service.executors.phase import Phase
from ringtrain.jobs.service.scheduler import Scheduler
from ringtrain.jobs.service.share import Share
from ringtrain.jobs.service.store import SQLiteStore
from tests.clock import FakeClock

CLI = Callable[..., tuple[int, str, str]]
T = TypeVar("T")


@dataclass(frozen=True)
class FakeHandle:
    """The fake executor's launch handle: which attempt got which nodes."""

    attempt: int
    nodes: list[int]

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "nodes": self.nodes}


class FakeExecutor:
    """An executor whose attempts do whatever the test says (for scheduling logic only)."""

    def __init__(self) -> None:
        self.phase: dict[str, Observation] = {}
        self.started: list[str] = []
        self.stops: list[tuple[str, bool]] = []
        self.released: list[str] = []
        self.offered: list[tuple[str, list[int]]] = []  # set_nodes calls

    def start(self, job: JobInfo, nodes: list[NodeInfo]) -> FakeHandle:
        self.started.append(job.id)
        self.phase[job.id] = Observation(Phase.PREPARING)
        return FakeHandle(job.attempt, [n.index for n in nodes])

    def load_handle(self, data: dict[str, Any]) -> FakeHandle:
        if set(data) != {"attempt", "nodes"}:
            raise RecordError(f"not a fake handle: {data}")
        return FakeHandle(data["attempt"], data["nodes"])

    def poll(self, job: JobInfo, launch: FakeHandle | None) -> Observation:
        if launch is None:
            return Observation(Phase.LOST, message="never started")
        return self.phase[job.id]

    def stop(self, job: JobInfo, launch: FakeHandle | None, force: bool) -> None:
        self.stops.append((job.id, force))

    def set_nodes(self, job: JobInfo, launch: FakeHandle | None, nodes: list[int]) -> None:
        self.offered.append((job.id, nodes))

    def release(self, job: JobInfo, launch: FakeHandle | None) -> None:
        self.released.append(job.id)

    def exit(self, job_id: str, code: int, message: str = "") -> None:
        self.phase[job_id] = Observation(Phase.EXITED, code, message)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "jobs.sqlite")
    yield s
    s.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fake_executor() -> FakeExecutor:
    return FakeExecutor()


@pytest.fixture
def scheduler(store: SQLiteStore, fake_executor: FakeExecutor, clock: FakeClock) -> Scheduler:
    return Scheduler(store, fake_executor, clock, stop_grace_s=5.0)


@pytest.fixture
def add_job(store: SQLiteStore, clock: FakeClock, tmp_path: Path) -> Callable[..., JobInfo]:
    """Queue a job straight into the store: ``add_job("c", node_count=2, priority="high")``."""
    counter = iter(range(10_000))

    def add(cluster: str, **spec: Any) -> JobInfo:
        spec.setdefault("node_count", 1)
        spec.setdefault("command", "true")
        job_id = f"{spec.get('name', 'job')}-{next(counter)}"
        clock.advance(1)
        return store.add_job(JobInfo(id=job_id, cluster=cluster, spec=parse_job_spec(spec),
                                     state="queued", created_at=clock(),
                                     job_dir=str(tmp_path / job_id)))
    return add


@pytest.fixture
def cluster(store: SQLiteStore, clock: FakeClock) -> Callable[..., str]:
    def make(name: str = "c", nodes: int = 2, slots: int = 1) -> str:
        store.add_cluster(ClusterSpec(name=name, nodes=nodes, slots=slots), clock())
        return name
    return make


@pytest.fixture
def share(tmp_path: Path) -> Share:
    return Share(tmp_path / "share")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Home]:
    """A fresh RINGTRAIN_HOME; its server and any job processes are stopped afterwards."""
    from ringtrain.jobs.client.connection import stop_server

    h = Home(tmp_path / "home")
    monkeypatch.setenv("RINGTRAIN_HOME", str(h.root))
    monkeypatch.delenv("RINGTRAIN_URL", raising=False)
    monkeypatch.delenv("RINGTRAIN_TOKEN", raising=False)
    yield h
    stop_server(h)
    jobs = h.share_root / "jobs"
    for job_dir in (jobs.iterdir() if jobs.exists() else []):
        for pid in procs.job_pids(job_dir.name):
            os.kill(pid, signal.SIGKILL)
    if (groups := cgroups.JobCgroups.detect(h.share_root.resolve())) is not None:
        groups.sweep()  # attempts no server will release


CLI = Callable[..., tuple[int, str, str]]
T = TypeVar("T")


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> CLI:
    """Run ``ringtrain ARGS...`` in-process: ``rc, stdout, stderr = cli("job", "list")``."""
    def run(*args: str) -> tuple[int, str, str]:
        try:
            rc = ringtrain_cli.main(list(args))
        except SystemExit as e:  # argparse refusing an argument, as the console script exits
            rc = int(e.code or 0)
        out, err = capsys.readouterr()
        return rc, out, err
    return run


def bearer(home: Home) -> dict[str, str]:
    """The header that a raw HTTP client of ``home``'s server must send."""
    return {"Authorization": f"Bearer {home_token(home)}"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Home, str]]:
    """A real server on loopback for one test module: its home and its URL."""
    from ringtrain.jobs.client.connection import connect, stop_server

    h = Home(tmp_path_factory.mktemp("served") / "home")
    with pytest.MonkeyPatch.context() as env:
        env.delenv("RINGTRAIN_URL", raising=False)
        client = connect(home=h)
        client.close()
        yield h, client.url
    stop_server(h)


def wait_for(predicate: Callable[[], Any], timeout_s: float = 60.0, every_s: float = 0.05) -> Any:
    """Poll until ``predicate()`` is truthy; return its value, or fail the test on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    pytest.fail(f"condition not met within {timeout_s} s")


def returns_within(timeout_s: float, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)``'s value (or its exception), failing the test if it has not
    returned within ``timeout_s``.

    For what must not block (a named pipe opened, a server that never answers, a hostile spec):
    a bound on a wait, far above what the call takes, never a speed goal; ``benchmarks/``
    measures how fast.
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        pytest.fail(f"{getattr(call, '__name__', call)} did not return within {timeout_s} s: "
                    "it waits for something that never comes")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def scheduler_ticks(home: Home) -> int:
    """How many passes the scheduler of ``home``'s server has made (its ``/metrics``)."""
    from ringtrain.jobs.client.connection import read_server_file

    info = read_server_file(home)
    assert info is not None, "no server runs for the home"
    text = httpx.get(f"{info.url}/metrics", headers=bearer(home), timeout=30).text
    line = next(x for x in text.splitlines()
                if x.startswith("ringtrain_jobs_scheduler_tick_seconds_count"))
    return int(float(line.split()[-1]))


def wait_for_ticks(home: Home, passes: int = 2) -> None:
    """Wait until the scheduler of ``home``'s server has made ``passes`` more passes: whatever
    it was going to do about the state as it is now, it has done."""
    target = scheduler_ticks(home) + passes
    wait_for(lambda: scheduler_ticks(home) >= target, timeout_s=60)


def pids_running(marker: str) -> list[int]:
    """Processes whose command line contains ``marker`` (this one excepted)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry.name))
    return found


def end_unfinished_jobs(ticked: Any) -> None:
    """Terminate the jobs a test left unfinished, tick them to their end, close the store.

    Args:
        ticked: a test's service wrapper, with ``store``, ``service`` and ``run_to_end(job_id)``.
    """
    for job in ticked.store.list_jobs():
        if not job.state.is_terminal():
            ticked.service.terminate(job.id)
            ticked.run_to_end(job.id)
    ticked.store.close()


@contextmanager
def flipping(target: Path, secret: Path) -> Iterator[None]:
    """While in the block, ``target`` flips between a plain file and a symlink to ``secret``
    (each swap atomic), as a job racing the service's checks would."""
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            for make in (lambda p: p.write_text("plain"), lambda p: p.symlink_to(secret)):
                tmp = target.with_name("next")
                tmp.unlink(missing_ok=True)
                make(tmp)
                os.replace(tmp, target)
                time.sleep(0.0005)

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    try:
        yield
    finally:
        stop.set()
        flipper.join(timeout=10)
