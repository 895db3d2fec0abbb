"""An in-process harness for N-rank worlds on Gloo: real processes, reused across tests.

Each worker process sets the worker environment contract as `ringtrain run` would, calls
``hvd.init()`` once, then runs test functions sent to it (module-level functions, pickled by
reference) and sends back each rank's result or traceback. Reusing one world for many tests keeps
the suite fast; a test that breaks the world (a timeout) makes the harness start a fresh one.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import traceback
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, size: int, port: int, env: dict[str, str], conn) -> None:
    os.environ.update({
        "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(size), "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
    })
    os.environ.update(env)
    import torch

    torch.set_num_threads(1)
    import ringtrain.torch as hvd

    try:
        hvd.init()
        conn.send(("ok", None))
    except BaseException:
        conn.send(("err", traceback.format_exc()))
        return
    while True:
        msg = conn.recv()
        if msg is None:
            break
        fn, args = msg
        try:
            conn.send(("ok", fn(*args)))
        except BaseException as exc:  # report everything, including assertion failures
            conn.send(("err", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    hvd.shutdown()


class World:
    """``size`` worker processes with ringtrain initialised; ``run`` calls a function on all.

    Every rank gets ``env``, then its own ``rank_env[rank]``, over this process's environment:
    ``RINGTRAIN_SHM=0`` here runs every world on Gloo alone.
    """

    def __init__(self, size: int, env: dict[str, str] | None = None, timeout: float = 120,
                 rank_env: list[dict[str, str]] | None = None):
        self.size = size
        ctx = mp.get_context("spawn")
        port = free_port()
        self._conns = []
        self._procs = []
        for rank in range(size):
            parent, child = ctx.Pipe()
            mine = {**(env or {}), **(rank_env[rank] if rank_env else {})}
            proc = ctx.Process(target=_worker, args=(rank, size, port, mine, child),
                               daemon=True)
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)
        self._collect(timeout, "init")

    def _collect(self, timeout: float, what: str) -> list[Any]:
        results, errors = [], []
        for rank, conn in enumerate(self._conns):
            if not conn.poll(timeout):
                self.close()
                raise TimeoutError(f"rank {rank} did not finish {what} within {timeout} s")
            try:
                status, value = conn.recv()
            except EOFError:
                status, value = "err", "the process exited"
            results.append(value)
            if status == "err":
                errors.append(f"--- rank {rank} ---\n{value}")
        if errors:
            raise WorkerError("\n".join(errors), results)
        return results

    def run(self, fn: Callable, *args, timeout: float = 60) -> list[Any]:
        """Call ``fn(*args)`` on every rank; return the per-rank results.

        Raises:
            WorkerError: some rank raised (its traceback is in the message).
        """
        for conn in self._conns:
            conn.send((fn, args))
        return self._collect(timeout, fn.__name__)

    def run_ranks(self, fn: Callable, per_rank_args: list[tuple], timeout: float = 60):
        """Like ``run`` with different arguments for each rank."""
        for conn, args in zip(self._conns, per_rank_args):
            conn.send((fn, args))
        return self._collect(timeout, fn.__name__)

    def send(self, fn: Callable, *args) -> None:
        """Start ``fn(*args)`` on every rank without waiting; see :meth:`receive`."""
        for conn in self._conns:
            conn.send((fn, args))

    def receive(self, rank: int, timeout: float) -> tuple[str, Any]:
        """Rank ``rank``'s ``("ok", result)`` or ``("err", traceback)`` of what :meth:`send`
        started.

        Raises:
            TimeoutError: nothing came within ``timeout`` seconds.
        """
        if not self._conns[rank].poll(timeout):
            raise TimeoutError(f"rank {rank} did not finish within {timeout} s")
        try:
            return self._conns[rank].recv()
        except EOFError:
            return "err", "the process exited"

    def kill(self, rank: int) -> None:
        """SIGKILL rank ``rank``'s process (the world is broken after it: close it)."""
        self._procs[rank].kill()
        self._procs[rank].join(10)

    @property
    def alive(self) -> bool:
        return all(p.is_alive() for p in self._procs)

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for proc in self._procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()


class WorkerError(AssertionError):
    def __init__(self, message: str, results: list[Any]):
        super().__init__(message)
        self.results = results


def outcome_of(call: Callable[[], object]) -> str:
    """In a worker: ``"no error"``, or the RuntimeError ``call`` raised (``"Name: message"``)."""
    try:
        call()
        return "no error"
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {exc}"


def exited(pid: int) -> bool:
    """Whether process ``pid`` has ended (gone, or a zombie its parent has not reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def rank_0_after_rank_1_died(world: World, fn: Callable[..., Any], *args: Any,
                             timeout: float = 60.0) -> Any:
    """Run ``fn`` (which returns :func:`outcome_of`'s text, or a tuple that holds it) on a world
    of 2 in which rank 1 dies; rank 0's outcome. The world's collectives never time out (no
    stall shutdown): a death rank 0 does not notice keeps it waiting past ``timeout``, a bound on
    the hang, and fails."""
    world.send(fn, *args)
    status, survivor = world.receive(0, timeout=timeout)
    assert world.receive(1, timeout=10) == ("err", "the process exited")
    assert status == "ok", survivor
    return survivor
