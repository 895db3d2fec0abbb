"""Allreduce throughput: ringtrain against raw torch.distributed in the same run.

    python benchmarks/allreduce.py [--np 2] [--small-only] [--no-shm] [--no-mpi]

launches itself with `ringtrain run -np N` and prints one JSON line. First small messages (4 B,
1 KiB, 4 KiB, 64 KiB, float32 Sum), where latency is everything: per size the median time of a
lone synchronous ``allreduce_`` and of raw ``torch.distributed.all_reduce``, interleaved
iteration by iteration and size by size, and the median of the per-iteration time ratios
(ringtrain / raw; goal ≤ 1.5) with a bootstrap 95% interval. ``--small-only`` stops there.
Then, for each size from 4 KiB to 256 MiB, the median time, algorithm bandwidth and bus
bandwidth (``algbw * 2(n-1)/n``) of ``torch.distributed.all_reduce`` on a Gloo group of its own
and of ringtrain's in-place ``allreduce_`` (both Sum, float32, interleaved iteration by
iteration), and their throughput ratio. Then ResNet-50's 161 gradient tensors submitted as 161
asynchronous named allreduces against one flat allreduce of the same bytes (raw, and through
ringtrain), and against raw Gloo running the same fusion plan as ringtrain's engine (the same
collectives and buffer copies, no engine): what this machine can do with separate tensors at
all; and the backend's one collective over the 161 against its allreduce of the flat tensor, both
without the engine (``backend_list_vs_backend_flat``). The ratios to the raw and to ringtrain's
flat allreduce are medians of per-iteration ratios, with bootstrap 95% intervals.

Ranks that share a host use ringtrain's shared-memory backend (``--no-shm``: Gloo, as
``RINGTRAIN_SHM=0``); each size then also times that backend's allreduce alone, without the
engine (``backend_s``). When mpi4py and an ``mpirun`` are installed (``pip install
ringtrain[bench]``), the same sizes are then timed through Open MPI's ``Allreduce`` on as many
ranks (its shared-memory transport on one host), right after, in the same run (``openmpi``;
``--no-mpi`` skips it). ``goals`` compares the results with the shared-memory goals.

``back_to_back`` times what a training loop does: calls in a row with nothing between them,
ringtrain's ``allreduce_`` and Open MPI's ``Allreduce`` alike (each round of calls starts after a
barrier; the time per call is the round's time over its calls, the figure the median over
rounds). The interleaved figures above start each call after a Gloo barrier, whose ranks leave
it tens of microseconds apart: that skew, not the collective, dominates a small call there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from launch import launch_json, mpirun_command
from stats import bootstrap_median_ci

SMALL_SIZES = [4, 1 << 10, 4 << 10, 64 << 10]
SMALL_ITERATIONS = 200
SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]


def _iterations(nbytes: int) -> int:
    return max(7, min(50, (64 << 20) // max(nbytes, 1)))


def calls_in_a_row(nbytes: int) -> int:
    """Calls per round of the back-to-back measurement: rounds of about the same length."""
    return max(3, min(200, (16 << 20) // max(nbytes, 1)))


BACK_TO_BACK_ROUNDS = 15


def _back_to_back(fn, nbytes: int, barrier) -> float:
    """Median over rounds of the time per call of ``fn`` called in a row (see the module's
    docstring); every round starts after ``barrier``."""
    calls = calls_in_a_row(nbytes)
    per_call = []
    for _ in range(BACK_TO_BACK_ROUNDS):
        barrier()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - start) / calls)
    return statistics.median(per_call)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _raw_plan(tensors, group, threshold: int):
    """Allreduce ``tensors`` on raw Gloo in the batches ringtrain's fusion would make."""
    import torch
    import torch.distributed as dist

    from ringtrain.engine import fusion

    direct = min(fusion.DIRECT_BYTES, threshold)
    batches = fusion.pack(tensors, lambda t: t.dtype, lambda t: t.numel() * t.element_size(),
                          threshold, alone=lambda t, n: n >= direct)
    buffers = [torch.empty(sum(t.numel() for t in b)) if len(b) > 1 else b[0] for b in batches]

    def run() -> None:
        works = []
        for batch, buf in zip(batches, buffers):
            if len(batch) > 1:
                torch.cat([t.reshape(-1) for t in batch], out=buf)
            works.append(dist.all_reduce(buf, group=group, async_op=True))
        for batch, buf, work in zip(batches, buffers, works):
            work.wait()
            if len(batch) > 1:
                torch.split_with_sizes_copy(buf, [t.numel() for t in batch],
                                            out=[t.view(-1) for t in batch])

    return run, len(batches)


def _small_messages(raw_group) -> list[dict]:
    """Lone small allreduces, raw and through ringtrain, paired iteration by iteration."""
    import torch
    import torch.distributed as dist

    import ringtrain.torch as hvd

    raw = {n: torch.ones(max(n // 4, 1)) for n in SMALL_SIZES}
    ours = {n: torch.ones(max(n // 4, 1)) for n in SMALL_SIZES}
    times: dict[int, tuple[list[float], list[float]]] = {n: ([], []) for n in SMALL_SIZES}
    for nbytes in SMALL_SIZES:  # warm-up: connections, and the response cache learns the names
        dist.all_reduce(raw[nbytes], group=raw_group)
        hvd.allreduce_(ours[nbytes], op=hvd.Sum, name=f"small.{nbytes}")
    for _ in range(SMALL_ITERATIONS):
        for nbytes in SMALL_SIZES:
            raw_t, ours_t = times[nbytes]
            # _timed calls each lambda at once, in this iteration (B023 does not apply).
            dist.barrier(group=raw_group)
            raw_t.append(_timed(lambda: dist.all_reduce(raw[nbytes], group=raw_group)))  # noqa: B023
            dist.barrier(group=raw_group)
            ours_t.append(_timed(
                lambda: hvd.allreduce_(ours[nbytes], op=hvd.Sum, name=f"small.{nbytes}")))  # noqa: B023
    results = []
    for nbytes in SMALL_SIZES:
        raw_t, ours_t = times[nbytes]
        paired = [o / r for o, r in zip(ours_t, raw_t)]
        results.append({
            "bytes": nbytes, "raw_s": statistics.median(raw_t),
            "ringtrain_s": statistics.median(ours_t),
            "time_ratio": statistics.median(paired),
            "time_ratio_ci95": bootstrap_median_ci(paired),
        })
    return results


def worker(small_only: bool) -> None:
    import torch
    import torch.distributed as dist

    import ringtrain.torch as hvd
    from ringtrain.contract.env import read_engine_config
    from ringtrain.models.resnet import resnet50

    torch.set_num_threads(1)
    hvd.init()
    n = hvd.size()
    raw_group = dist.new_group(list(range(n)), backend="gloo")
    small = _small_messages(raw_group)
    if small_only:
        if hvd.rank() == 0:
            print(json.dumps({
                "benchmark": "allreduce", "world_size": n, "dtype": "float32", "op": "Sum",
                "small": small, "small_time_ratio_max": max(s["time_ratio"] for s in small),
            }), flush=True)
        hvd.shutdown()
        return
    from ringtrain.op_types import ReduceOp
    from ringtrain.torch import runtime

    backend = runtime.current().backend
    world = tuple(range(n))
    results = []
    for nbytes in SIZES:
        numel = nbytes // 4
        a, b, c = torch.ones(numel), torch.ones(numel), torch.ones(numel)
        raw_t, ours_t, backend_t = [], [], []
        dist.all_reduce(a, group=raw_group)  # warm-up every path
        hvd.allreduce_(b, op=hvd.Sum, name=f"size.{nbytes}")
        for _ in range(_iterations(nbytes)):
            # _timed calls each lambda at once, in this iteration (B023 does not apply).
            dist.barrier(group=raw_group)
            raw_t.append(_timed(lambda: dist.all_reduce(a, group=raw_group)))  # noqa: B023
            dist.barrier(group=raw_group)
            ours_t.append(_timed(lambda: hvd.allreduce_(b, op=hvd.Sum, name=f"size.{nbytes}")))  # noqa: B023
            # The engine is idle between synchronous calls: its backend is free to call here.
            dist.barrier(group=raw_group)
            backend_t.append(_timed(lambda: backend.start_allreduce(c, ReduceOp.SUM, world)()))  # noqa: B023
        raw, ours = statistics.median(raw_t), statistics.median(ours_t)
        results.append({
            "bytes": nbytes,
            "raw_s": raw, "ringtrain_s": ours, "backend_s": statistics.median(backend_t),
            "raw_algbw_GBps": nbytes / raw / 1e9, "ringtrain_algbw_GBps": nbytes / ours / 1e9,
            "raw_busbw_GBps": nbytes / raw / 1e9 * 2 * (n - 1) / n,
            "ringtrain_busbw_GBps": nbytes / ours / 1e9 * 2 * (n - 1) / n,
            "throughput_ratio": raw / ours,
        })

    back_to_back = {}
    for nbytes in MPI_SIZES:
        t = torch.ones(nbytes // 4)
        hvd.allreduce_(t, op=hvd.Sum, name=f"row.{nbytes}")
        back_to_back[str(nbytes)] = _back_to_back(
            lambda: hvd.allreduce_(t, op=hvd.Sum, name=f"row.{nbytes}"),  # noqa: B023
            nbytes, lambda: dist.barrier(group=raw_group))

    grads = [torch.ones(p.shape) for p in resnet50().parameters()]
    flat = torch.ones(sum(g.numel() for g in grads))
    many_t, flat_raw_t, flat_ours_t, plan_t, list_t, flat_b_t = [], [], [], [], [], []
    threshold = read_engine_config(os.environ).fusion_threshold_bytes
    raw_plan, collectives = _raw_plan(grads, raw_group, threshold)

    def many():
        handles = [hvd.allreduce_async_(g, op=hvd.Sum, name=f"resnet50.{i}")
                   for i, g in enumerate(grads)]
        for h in handles:
            hvd.synchronize(h)

    many()
    for _ in range(25):
        dist.barrier(group=raw_group)
        many_t.append(_timed(many))
        dist.barrier(group=raw_group)
        flat_raw_t.append(_timed(lambda: dist.all_reduce(flat, group=raw_group)))
        dist.barrier(group=raw_group)
        flat_ours_t.append(_timed(lambda: hvd.allreduce_(flat, op=hvd.Sum, name="flat")))
        dist.barrier(group=raw_group)
        plan_t.append(_timed(raw_plan))
        # The backend's collective over the 161 without the engine, and over the flat tensor.
        dist.barrier(group=raw_group)
        list_t.append(_timed(lambda: backend.start_allreduce_list(grads, ReduceOp.SUM, world)()))
        dist.barrier(group=raw_group)
        flat_b_t.append(_timed(lambda: backend.start_allreduce(flat, ReduceOp.SUM, world)()))
    m, fr, fo, rp = (statistics.median(x) for x in (many_t, flat_raw_t, flat_ours_t, plan_t))
    # Ratios of the adjacent measurements of each iteration: the machine's speed drifts between
    # iterations by more than the differences measured here.
    paired = [a / b for a, b in zip(many_t, flat_raw_t)]
    paired_ours = [a / b for a, b in zip(many_t, flat_ours_t)]
    plan_paired = [a / b for a, b in zip(plan_t, flat_raw_t)]
    list_paired = [a / b for a, b in zip(list_t, flat_b_t)]
    large = [r["throughput_ratio"] for r in results if r["bytes"] >= 16 << 20]
    if hvd.rank() == 0:
        print(json.dumps({
            "benchmark": "allreduce", "world_size": n, "dtype": "float32", "op": "Sum",
            "backend": type(backend).__name__,
            "small": small,
            "small_time_ratio_max": max(s["time_ratio"] for s in small),
            "sizes": results,
            "large_message_ratio_min": min(large),
            "back_to_back_s": back_to_back,
            "resnet50_161_tensors": {
                "tensors": len(grads), "bytes": flat.numel() * 4,
                "ringtrain_161_async_s": m, "raw_flat_s": fr, "ringtrain_flat_s": fo,
                "raw_same_plan_s": rp, "plan_collectives": collectives,
                "ratio_vs_raw_flat": statistics.median(paired),
                "ratio_vs_raw_flat_ci95": bootstrap_median_ci(paired),
                "ratio_vs_ringtrain_flat": statistics.median(paired_ours),
                "ratio_vs_ringtrain_flat_ci95": bootstrap_median_ci(paired_ours),
                "ratio_of_medians_vs_ringtrain_flat": m / fo,
                "raw_same_plan_vs_raw_flat": statistics.median(plan_paired),
                "raw_same_plan_vs_raw_flat_ci95": bootstrap_median_ci(plan_paired),
                "ratio_vs_raw_same_plan": m / rp,
                "backend_list_vs_backend_flat": statistics.median(list_paired),
            },
        }), flush=True)
    hvd.shutdown()


MPI_SIZES = [4 << 10, 64 << 10, 1 << 20, 64 << 20]


def mpi_worker() -> None:
    """Open MPI's Allreduce (float32 Sum, out of place) on the sizes of MPI_SIZES."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    out: dict[str, dict[str, float]] = {"barrier_each": {}, "back_to_back": {}}
    for nbytes in MPI_SIZES:
        a = np.ones(nbytes // 4, dtype=np.float32)
        b = np.empty_like(a)
        comm.Allreduce(a, b, op=MPI.SUM)
        times = []
        for _ in range(_iterations(nbytes) if nbytes > 1 << 20 else SMALL_ITERATIONS):
            comm.Barrier()
            start = time.perf_counter()
            comm.Allreduce(a, b, op=MPI.SUM)
            times.append(time.perf_counter() - start)
        out["barrier_each"][str(nbytes)] = statistics.median(times)
        out["back_to_back"][str(nbytes)] = _back_to_back(
            lambda: comm.Allreduce(a, b, op=MPI.SUM), nbytes, comm.Barrier)  # noqa: B023
    if comm.rank == 0:
        print(json.dumps(out), flush=True)


def _openmpi(np_: int) -> dict | None:
    """Open MPI's times by size (``barrier_each`` and ``back_to_back``), or None where mpi4py
    or mpirun is missing."""
    cmd = mpirun_command(np_)
    if cmd is None:
        return None
    done = subprocess.run([*cmd, sys.executable, os.path.abspath(__file__), "--mpi-worker"],
                          capture_output=True, text=True, timeout=1800, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        sys.stderr.write(f"Open MPI peer failed ({done.returncode}):\n{done.stderr}\n")
        return None
    return {how: {int(k): v for k, v in sizes.items()}
            for how, sizes in json.loads(lines[-1]).items()}


#: Issue 39's goals: ringtrain's back-to-back time / Open MPI's, at most.
OPENMPI_GOALS = {4 << 10: 7.0, 64 << 10: 3.0, 1 << 20: 1.0, 64 << 20: 0.5}


def _goals(result: dict, mpi: dict | None) -> dict:
    """Issues 24's and 39's goals, met or not."""
    by_size = {r["bytes"]: r for r in result.get("sizes", [])}
    small = {s["bytes"]: s for s in result["small"]}
    goals: dict = {}
    if 64 << 20 in by_size:
        goals["64MiB_vs_gloo"] = {"ratio": by_size[64 << 20]["throughput_ratio"], "goal": 2.5}
        if mpi and 64 << 20 in mpi["barrier_each"]:
            goals["64MiB_vs_openmpi"] = {
                "ratio": mpi["barrier_each"][64 << 20] / by_size[64 << 20]["ringtrain_s"],
                "goal": 1.3}
        goals["4KiB_to_1MiB_vs_gloo_min"] = {
            "ratio": min(r["throughput_ratio"] for b, r in by_size.items() if b <= 1 << 20),
            "goal": 2.0}
        goals["resnet50_161_vs_one_flat"] = {
            "ratio": result["resnet50_161_tensors"]["ratio_vs_ringtrain_flat"], "goal": 1.1,
            "lower_is_better": True}
    if mpi and "back_to_back_s" in result:
        for nbytes, goal in OPENMPI_GOALS.items():
            ours = result["back_to_back_s"][str(nbytes)]
            goals[f"{nbytes >> 10}KiB_back_to_back_vs_openmpi_time"] = {
                "ratio": ours / mpi["back_to_back"][nbytes], "goal": goal,
                "lower_is_better": True}
    if 4 << 10 in small:
        goals["lone_4KiB_vs_gloo_time"] = {"ratio": small[4 << 10]["time_ratio"], "goal": 1.0,
                                           "lower_is_better": True}
    for goal in goals.values():
        low = goal.get("lower_is_better", False)
        goal["met"] = goal["ratio"] <= goal["goal"] if low else goal["ratio"] >= goal["goal"]
    return goals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2, help="number of ranks (default 2)")
    parser.add_argument("--small-only", action="store_true",
                        help="measure the small messages only (seconds instead of minutes)")
    parser.add_argument("--no-shm", action="store_true",
                        help="ringtrain on Gloo, not shared memory (RINGTRAIN_SHM=0)")
    parser.add_argument("--no-mpi", action="store_true", help="skip the Open MPI peer")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.small_only)
        return 0
    if args.mpi_worker:
        mpi_worker()
        return 0
    if args.no_shm:
        os.environ["RINGTRAIN_SHM"] = "0"
    try:
        result = launch_json(__file__, args.np, ["--small-only"] if args.small_only else [])
    except RuntimeError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    mpi = None if args.no_mpi or args.small_only else _openmpi(args.np)
    if mpi is not None:
        result["openmpi"] = {how: {str(k): v for k, v in sizes.items()}
                             for how, sizes in mpi.items()}
        for r in result.get("sizes", []):
            if r["bytes"] in mpi["barrier_each"]:
                r["openmpi_s"] = mpi["barrier_each"][r["bytes"]]
                r["ratio_vs_openmpi"] = r["openmpi_s"] / r["ringtrain_s"]
    result["goals"] = _goals(result, mpi)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
