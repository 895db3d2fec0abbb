"""Where a lone synchronous allreduce's time goes: the request path, stage by stage.

    python benchmarks/request_stages.py [--np 2] [--bytes 4096] [--calls 2000]

launches itself with `ringtrain run -np N` and prints one JSON line: rank 0's median and mean
time in each stage of ``--calls`` back-to-back ``hvd.allreduce_`` calls of one float32 tensor
(after a warm-up that puts its name in the response cache), and the Python-level function calls
per operation outside spin and wait loops (from cProfile, over separate calls: a count that the
machine's load does not change). The stages nest (the round runs inside the submission, which
runs the claimed round on one host); docs/engine.md, "Where the time goes", explains them.
Stamps are ``time.perf_counter_ns`` around the stage's function, a few hundred nanoseconds each.

Two references from the same run, timed over as many calls (medians of per-call times in blocks):
``frontend_only_us``, the call with the engine's submission replaced by completing the handle (the
frontend's share), and ``bare_exchange_us``, the same agreement and exchange written bare, with
none of the engine's guarantees: a counter in a shared file added to under ``flock``, the last
rank ringing, the bell read by a spin, then the copy in, a flag and the reduction (two buffers:
the bell of the operation after next is the sign that every rank is done reading a slot).
"""

from __future__ import annotations

import argparse
import cProfile
import fcntl
import functools
import json
import mmap
import os
import pstats
import statistics
import sys
import tempfile
import time

from launch import run_under_launcher

#: (module, owner, function, stage): the functions timed, outermost first.
_STAGES = [
    ("ringtrain.torch.ops", None, "allreduce_", "total"),
    ("ringtrain.engine.engine", "Engine", "submit", "engine submit (with the claimed round)"),
    # The express round (a cached lone allreduce in its caller's thread, docs/engine.md)
    ("ringtrain.engine.express", "Express", "_queue", "checks, claim, count (+ ring), queue"),
    ("ringtrain.engine.readiness", "Readiness", "count_unit", "count"),
    ("ringtrain.engine.shm_doorbell", "ShmDoorbell", "ring", "ring"),
    ("ringtrain.engine.turn", "Turn", "_bell_is", "wait for the bell"),
    ("ringtrain.engine.express", "Express", "_round", "round"),
    ("ringtrain.engine.execute", "Executor", "run_lone_allreduce", "executor"),
    ("ringtrain.backends.shm", "ShmGroup", "allreduce_", "shared-memory allreduce"),
    ("ringtrain.engine.handle", "Handle", "wait", "handle wait"),
]
#: What the names of the functions of spin and wait loops contain (builtins included, as
#: "<built-in method time.monotonic>"): their call counts measure waiting rather than work.
_WAITS = ("wait", "ready", "monotonic", "sched_yield", "_bell_is", "_bell_locked", "spin_s")


def _stamp(stamps: dict[str, list[int]], stage: str, fn):
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        start = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            stamps.setdefault(stage, []).append(time.perf_counter_ns() - start)
    return timed


#: The bare exchange gives up on a peer that has not moved for this long.
_BARE_LIMIT_S = 120.0


def _blocks(fn, calls: int, block: int = 250) -> float:
    """Median time per call of ``fn`` over blocks of ``block`` calls (µs)."""
    times = []
    for _ in range(max(calls // block, 1)):
        start = time.perf_counter_ns()
        for _ in range(block):
            fn()
        times.append((time.perf_counter_ns() - start) / block / 1e3)
    return statistics.median(times)


def _frontend_only(hvd, tensor, calls: int) -> float:
    """The call with the engine's submission replaced by completing the handle."""
    from ringtrain.torch import runtime

    engine = runtime.current().engine
    engine.submit = lambda request, synchronous=False: request.handle.set_result(
        request.outputs[0])
    try:
        return _blocks(lambda: hvd.allreduce_(tensor, op=hvd.Sum, name="stages"), calls)
    finally:
        del engine.submit


def _bare_exchange(hvd, tensor, calls: int) -> float:
    """A lone allreduce's agreement and exchange with nothing else: see the module's docstring."""
    import torch

    n, me, m = hvd.size(), hvd.rank(), tensor.numel()
    path = None
    if me == 0:  # made by rank 0 alone, with a name nobody else can have taken
        made, path = tempfile.mkstemp(prefix="ringtrain-bare-", dir="/dev/shm")
        os.ftruncate(made, 4096 + 2 * n * m * 4)
        os.close(made)
    path = hvd.broadcast_object(path, 0)
    fd = os.open(path, os.O_RDWR)
    region = mmap.mmap(fd, 4096 + 2 * n * m * 4)
    words = memoryview(region)[:4096].cast("q")  # [0] counter, [8] bell, [16 + 8 r] rank r's flag
    data = torch.frombuffer(region, dtype=torch.float32, offset=4096)
    buffers = [[data[(b * n + r) * m:(b * n + r + 1) * m] for r in range(n)] for b in (0, 1)]
    work = tensor.clone()
    epoch = 0
    # A spin that never yields starves the peer it waits for when ranks outnumber the cores.
    crowded = n > (os.cpu_count() or 1)
    give_up = time.monotonic() + _BARE_LIMIT_S

    def spin() -> None:
        if time.monotonic() > give_up:
            raise TimeoutError(f"rank {me}: a peer of the bare exchange did not move for "
                               f"{_BARE_LIMIT_S:g} s (did it die?)")
        if crowded:
            os.sched_yield()

    def op() -> None:
        nonlocal epoch
        epoch += 1
        while True:  # as the engine takes its lock: a yield, not a sleep, while it is held
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                spin()
        words[0] += 1
        if words[0] == epoch * n:
            words[8] = epoch
        fcntl.flock(fd, fcntl.LOCK_UN)
        while words[8] < epoch:
            spin()
        slots = buffers[epoch % 2]  # two buffers: a slot is rewritten two operations later
        slots[me].copy_(work)
        words[16 + 8 * me] = 2 * epoch
        for r in range(n):
            while words[16 + 8 * r] < 2 * epoch:
                spin()
        torch.add(*slots, out=work) if n == 2 else torch.sum(torch.stack(slots), 0, out=work)

    try:
        for _ in range(200):
            op()
        hvd.barrier()
        return _blocks(op, calls)
    finally:  # the mapping stays until the process ends: the tensors hold it
        os.close(fd)
        hvd.barrier()
        if me == 0:
            os.unlink(path)


def worker(nbytes: int, calls: int) -> None:
    import importlib

    import torch

    import ringtrain.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    tensor = torch.ones(max(nbytes // 4, 1))
    for _ in range(200):
        hvd.allreduce_(tensor, op=hvd.Sum, name="stages")
    profile = cProfile.Profile()
    hvd.barrier()
    profile.enable()
    for _ in range(calls // 4):
        hvd.allreduce_(tensor, op=hvd.Sum, name="stages")
    profile.disable()
    counted = sum(v[1] for k, v in pstats.Stats(profile).stats.items()
                  if not any(w in k[2] for w in _WAITS))
    stamps: dict[str, list[int]] = {}
    for module, owner, name, stage in _STAGES:
        target = importlib.import_module(module)
        target = getattr(target, owner) if owner else target
        setattr(target, name, _stamp(stamps, stage, getattr(target, name)))
    ops = importlib.import_module("ringtrain.torch.ops")  # hvd.allreduce_ is the unpatched one
    hvd.barrier()
    for _ in range(calls):
        ops.allreduce_(tensor, op=hvd.Sum, name="stages")
    hvd.barrier()
    frontend = _frontend_only(hvd, tensor, calls)
    bare = _bare_exchange(hvd, tensor, calls)
    if hvd.rank() == 0:
        print(json.dumps({
            "benchmark": "request_stages", "world_size": hvd.size(), "bytes": nbytes,
            "calls": calls, "python_calls_per_op": counted / (calls // 4),
            "frontend_only_us": frontend, "bare_exchange_us": bare,
            "stages_us": {stage: {"median": statistics.median(stamps[stage]) / 1e3,
                                  "mean": statistics.fmean(stamps[stage]) / 1e3,
                                  "count": len(stamps[stage])}
                          for *_, stage in _STAGES if stage in stamps},
        }), flush=True)
    hvd.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2, help="number of ranks (default 2)")
    parser.add_argument("--bytes", type=int, default=4096, help="tensor size (default 4 KiB)")
    parser.add_argument("--calls", type=int, default=2000, help="timed calls (default 2000)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.bytes, args.calls)
        return 0
    return run_under_launcher(__file__, args.np, ["--bytes", str(args.bytes),
                                                  "--calls", str(args.calls)])


if __name__ == "__main__":
    sys.exit(main())
