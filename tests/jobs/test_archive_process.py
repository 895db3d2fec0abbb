"""Archives made by producer processes: bounded in number, killed when nobody reads them."""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
from pathlib import Path

import pytest

from ringtrain.jobs.errors import BusyError
from ringtrain.jobs.service.archive_process import ArchiveProducers


def _job(root: Path, files: int, size: int) -> None:
    outputs = root / "jobs" / "j1" / "outputs"
    outputs.mkdir(parents=True)
    for i in range(files):
        (outputs / f"f{i:03d}").write_bytes(bytes([i % 256]) * size)


def _producers() -> list[int]:
    """This process's children that are archive producers (from /proc)."""
    tasks = Path(f"/proc/{os.getpid()}/task")
    found = []
    for child in (p for t in tasks.iterdir() for p in (t / "children").read_text().split()):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"ringtrain.jobs.service.archive_process" in cmdline:
                found.append(int(child))
        except FileNotFoundError:  # another test's child, gone meanwhile
            pass
    return found


async def _settled(producers: ArchiveProducers, running: int = 0,
                   timeout_s: float = 20.0) -> None:
    """Until at most ``running`` producers run (the others reaped), or fail."""
    for _ in range(int(timeout_s / 0.05)):
        if producers.running <= running:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{producers.running} producer(s) still running, expected {running}")


def test_a_producer_writes_the_archive_and_is_reaped(tmp_path: Path) -> None:
    _job(tmp_path, files=30, size=5000)

    async def run() -> bytes:
        producers = ArchiveProducers(str(tmp_path))
        data = b"".join([chunk async for chunk in await producers.start("j1", "outputs",
                                                                        "outputs/f009")])
        await _settled(producers)
        return data

    with tarfile.open(fileobj=io.BytesIO(asyncio.run(run()))) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == [f"outputs/f{i:03d}" for i in range(10, 30)]
        f = tar.extractfile(members[0])
        assert f is not None and f.read() == bytes([10]) * 5000


def test_beyond_the_limit_a_request_is_busy_until_a_producer_ends(tmp_path: Path) -> None:
    _job(tmp_path, files=3, size=10)

    async def run() -> None:
        producers = ArchiveProducers(str(tmp_path), limit=2)
        first = await producers.start("j1", "outputs", None)
        second = await producers.start("j1", "outputs", None)
        with pytest.raises(BusyError, match="2 folder downloads are running") as busy:
            await producers.start("j1", "outputs", None)
        assert busy.value.http_status == 503 and busy.value.retry_after_s > 0
        assert [c async for c in first]  # read to its end: its slot comes back
        await _settled(producers, running=1)
        third = await producers.start("j1", "outputs", None)
        for stream in (second, third):
            assert [c async for c in stream]
        await _settled(producers)

    asyncio.run(run())


def test_a_client_that_leaves_kills_its_producer(tmp_path: Path) -> None:
    _job(tmp_path, files=40, size=1 << 20)  # 40 MiB: far more than a pipe holds

    async def run() -> int:
        producers = ArchiveProducers(str(tmp_path))
        stream = await producers.start("j1", "outputs", None)
        (pid,) = _producers()
        assert await stream.__anext__()
        await stream.aclose()  # what the server does when the client disconnects
        await _settled(producers)
        return pid

    pid = asyncio.run(run())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_producer_nobody_reads_is_killed_after_the_start_timeout(tmp_path: Path) -> None:
    _job(tmp_path, files=40, size=1 << 20)

    async def run() -> None:
        producers = ArchiveProducers(str(tmp_path), start_timeout_s=0.5)
        await producers.start("j1", "outputs", None)  # the response never starts
        assert producers.running == 1
        await _settled(producers)

    asyncio.run(run())


def test_concurrent_requests_never_run_more_producers_than_the_limit(tmp_path: Path) -> None:
    # Issue 35: a slot was given back before the `await` that registered its producer, so a
    # request arriving meanwhile found it free (eight producers let ten through).
    _job(tmp_path, files=2, size=1 << 20)  # more than a pipe holds: unread producers stay alive
    limit, requests = 3, 40

    async def run() -> None:
        producers = ArchiveProducers(str(tmp_path), limit=limit, start_timeout_s=600)
        streams, refused, peak = [], 0, 0

        async def request() -> None:
            nonlocal refused
            try:
                streams.append(await producers.start("j1", "outputs", None))
            except BusyError:
                refused += 1

        arrivals = []
        for _ in range(requests):  # one arrival per turn of the loop, amid the others' awaits
            arrivals.append(asyncio.create_task(request()))
            await asyncio.sleep(0)
            peak = max(peak, producers.running)
        await asyncio.gather(*arrivals)
        try:
            assert len(streams) == limit and refused == requests - limit
            assert peak <= limit and producers.running == limit
            assert len(_producers()) == limit  # alive: nobody read their archives
        finally:
            for stream in streams:  # read a little, then leave: each producer is killed
                await stream.__anext__()
                await stream.aclose()
            await _settled(producers)

    asyncio.run(run())
