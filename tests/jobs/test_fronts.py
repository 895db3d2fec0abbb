"""The fronts the job service runs, on a real SQLite store: a deployment of several replicas
gets one on its own loopback port, recorded; a new service (a restart) binds the recorded port
again, or another one, recorded, when that port is taken; a deployment that stops loses it; one
replica, or a plain job, gets none."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import httpx
import pytest

from ringtrain.jobs.models import JobInfo, JobState, parse_job_spec
from ringtrain.jobs.service.deployment_fronts import Fronts, wants_front
from ringtrain.jobs.service.store import SQLiteStore
from tests.clock import FakeClock

from .conftest import wait_for


@pytest.fixture
def fronts(store: SQLiteStore) -> Iterator[Callable[[], Fronts]]:
    """Fronts on ``store`` (each call a new set: a restarted service); all closed at the end."""
    made: list[Fronts] = []

    def make() -> Fronts:
        made.append(Fronts(store, lambda job: [], health_every_s=0.2, refresh_s=0.2))
        return made[-1]
    yield make
    for f in made:
        f.close()


def _add_deployment(store: SQLiteStore, clock: FakeClock, job_id: str, replicas: int,
                    serves: str | None = "trained-1") -> JobInfo:
    clock.advance(1)
    return store.add_job(JobInfo(id=job_id, cluster="c", spec=parse_job_spec(
        {"node_count": replicas, "command": "serve"}), state="queued", created_at=clock(),
        job_dir=f"/nonexistent/{job_id}", serves=serves))


def _answers(url: str) -> httpx.Response:
    return httpx.get(f"{url}/v2/health/ready", timeout=10)


def _status(url: str) -> int | None:
    """The front's answer's status; ``None`` while nothing listens."""
    try:
        return _answers(url).status_code
    except httpx.TransportError:
        return None


def test_a_deployment_of_several_replicas_gets_a_recorded_front_that_lives_with_it(
        store: SQLiteStore, clock: FakeClock, cluster: Callable[..., str],
        fronts: Callable[[], Fronts]) -> None:
    cluster("c", nodes=3)
    two = _add_deployment(store, clock, "two-1", 2)
    one = _add_deployment(store, clock, "one-1", 1)
    plain = _add_deployment(store, clock, "job-1", 2, serves=None)
    assert (wants_front(two), wants_front(one), wants_front(plain)) == (True, False, False)
    first = fronts()
    first.sync()
    url = first.url("two-1")
    assert url is not None and url.startswith("http://127.0.0.1:")
    assert store.get_job("two-1").front == url  # in the record
    assert first.url("one-1") is None and first.url("job-1") is None
    answer = _answers(url)  # no replica has announced itself: the front says so
    assert answer.status_code == 503 and "no replica is healthy" in answer.text

    # The service restarts: its fronts stop, the new service's come back on the same port.
    first.close()
    with pytest.raises(httpx.TransportError):
        _answers(url)
    again = fronts()
    again.sync()
    assert again.url("two-1") == url and _answers(url).status_code == 503

    # Its port was taken while the service was away: the front moves, and the record follows.
    again.close()
    port = int(url.rsplit(":", 1)[1])
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        moved = fronts()
        moved.sync()
        new_url = moved.url("two-1")
        assert new_url is not None and new_url != url
        assert store.get_job("two-1").front == new_url and _answers(new_url).status_code == 503

    # The deployment stops: its front stops with it.
    store.update_job("two-1", JobState.TERMINATED, clock())
    moved.sync()
    assert moved.url("two-1") is None
    with pytest.raises(httpx.TransportError):
        _answers(new_url)


def test_a_front_whose_server_died_is_started_again(
        store: SQLiteStore, clock: FakeClock, cluster: Callable[..., str],
        fronts: Callable[[], Fronts]) -> None:
    cluster("c", nodes=3)
    _add_deployment(store, clock, "two-2", 2)
    f = fronts()
    stop = threading.Event()
    runner = threading.Thread(target=f.run, args=(stop,), kwargs={"every_s": 0.1}, daemon=True)
    runner.start()
    try:
        url = wait_for(lambda: f.url("two-2"), timeout_s=30)
        wait_for(lambda: _status(url) == 503, timeout_s=30)
        # Its uvicorn server ends (as a crash would end its thread): the loop starts it again.
        crashed = f._running["two-2"]
        crashed.server.should_exit = True
        wait_for(lambda: not crashed.thread.is_alive(), timeout_s=30)
        wait_for(lambda: f.url("two-2") == url and _status(url) == 503, timeout_s=30,
                 every_s=0.2)
        assert f._running["two-2"] is not crashed
    finally:
        stop.set()
        runner.join(30)
    assert not runner.is_alive() and f.url("two-2") is None  # run() closes them all
