"""A folder's archive (see :mod:`ringtrain.jobs.files.archive`) made by a process of its own.

Making the archive of a million small files is Python work: one open, stat and header per file.
Done in a thread of the job service it held the GIL that the event loop needs for every request,
and a health check behind a large download waited for it. A producer process has a GIL of its
own; the service's event loop only copies the producer's pipe to the socket.

:class:`ArchiveProducers` runs at most ``limit`` producers at once: a request beyond them is
answered 503 with ``Retry-After`` (the CLI waits and asks again). A producer the response never
reads (the client left before the body started) is killed after ``start_timeout_s``.

Run as ``python -m ringtrain.jobs.service.archive_process SHARE_ROOT JOB_ID PATH [AFTER]``:
writes the archive to stdout; exits 0 at its end, or quietly when the reader went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator

from ringtrain.jobs.errors import BusyError
from ringtrain.jobs.files.archive import CHUNK, tar_stream

log = logging.getLogger(__name__)

#: Producers running at once, for all clients together.
MAX_PRODUCERS = 8
#: How long a started producer waits for its response to begin reading it.
START_TIMEOUT_S = 30.0
#: What a busy service asks a client to wait before asking again.
RETRY_AFTER_S = 2


class ArchiveProducers:
    """The producer processes of the archives being sent."""

    def __init__(self, share_root: str, limit: int = MAX_PRODUCERS,
                 start_timeout_s: float = START_TIMEOUT_S):
        self.share_root = share_root
        self.limit = limit
        self.start_timeout_s = start_timeout_s
        self._running: set[_Producer] = set()
        self._starting = 0

    @property
    def running(self) -> int:
        """Producers alive now."""
        return len(self._running)

    async def start(self, job_id: str, path: str, after: str | None) -> AsyncIterator[bytes]:
        """Start a producer for the files under ``path`` after ``after``; its archive's chunks.

        Call after the path was checked: a producer that fails ends its archive early (the
        client resumes after the last file it received), its error in the service's log. Raises
        BusyError if ``limit`` producers are running.
        """
        if len(self._running) + self._starting >= self.limit:
            raise BusyError(f"{self.limit} folder downloads are running on this service; "
                            f"try again in {RETRY_AFTER_S} s", retry_after_s=RETRY_AFTER_S)
        # The slot is taken before the first await and held until the producer is counted in
        # ``_running``: a request arriving during any await of the start finds it taken.
        self._starting += 1
        try:
            producer, reader = await self._spawn(job_id, path, after)
            self._running.add(producer)
        finally:
            self._starting -= 1
        # Held by the producer (itself held while it runs): the loop keeps only weak references.
        producer.watch = asyncio.get_running_loop().create_task(self._watch(producer))
        return self._relay(producer, reader)

    async def _spawn(self, job_id: str, path: str, after: str | None
                     ) -> tuple[_Producer, asyncio.StreamReader]:
        """Start the process and connect its pipe; a failure (or a cancel) leaves neither."""
        # The pipe is ours, not the Process's: closing it must not wait for the process, and
        # waiting for the process must not wait for a pipe nobody reads.
        read_fd, write_fd = os.pipe()
        pipe = os.fdopen(read_fd, "rb", buffering=0)
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", __name__, self.share_root, job_id, path,
                *([] if after is None else [after]),
                stdin=asyncio.subprocess.DEVNULL, stdout=write_fd)
        except BaseException:
            pipe.close()
            raise
        finally:
            os.close(write_fd)
        reader = asyncio.StreamReader(limit=CHUNK)
        try:
            transport, _ = await asyncio.get_running_loop().connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), pipe)
        except BaseException:
            pipe.close()
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()  # asyncio's child watcher reaps it
            raise
        return _Producer(proc, transport), reader

    async def _relay(self, producer: _Producer, reader: asyncio.StreamReader
                     ) -> AsyncIterator[bytes]:
        producer.reading.set()
        try:
            while chunk := await reader.read(CHUNK):
                yield chunk
        finally:
            producer.kill()  # the client left early: the rest is not needed

    async def _watch(self, producer: _Producer) -> None:
        """Reap the producer, killing it if its response never starts reading."""
        try:
            await asyncio.wait_for(producer.reading.wait(), self.start_timeout_s)
        except asyncio.TimeoutError:
            log.warning("archive producer %d: nobody read its archive within %g s; killed",
                        producer.proc.pid, self.start_timeout_s)
            producer.kill()
        code = await producer.proc.wait()
        self._running.discard(producer)
        if code > 0:
            log.warning("archive producer %d exited %d (its error is above)",
                        producer.proc.pid, code)


class _Producer:
    """A started producer and the read end of its pipe."""

    def __init__(self, proc: asyncio.subprocess.Process, transport: asyncio.ReadTransport):
        self.proc = proc
        self.transport = transport
        self.reading = asyncio.Event()
        self.watch: asyncio.Task[None] | None = None

    def kill(self) -> None:
        """Close the pipe and kill the process, if not done yet."""
        self.transport.close()
        if self.proc.returncode is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass


def main(argv: list[str]) -> int:
    """Write the archive of ``SHARE_ROOT JOB_ID PATH [AFTER]`` to stdout."""
    from ringtrain.jobs.service.share import Share

    root, job_id, path, *after = argv
    out = sys.stdout.buffer.fileno()
    try:
        for chunk in tar_stream(Share(root).iter_opened(job_id, path, after[0] if after else None)):
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view):]
    except BrokenPipeError:  # the service stopped reading: the client left
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
