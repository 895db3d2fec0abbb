"""Bytes on the wire: a sparse allreduce against a dense one, for a 1 %-dense gradient.

    python benchmarks/sparse_bytes.py [--np 2] [--rows 100000] [--dim 64] [--density 0.01]

launches itself with `ringtrain run -np N` and prints one JSON line. Every rank holds the
gradient of an embedding table (``rows x dim`` float32) in which ``density`` of the rows are
set (different rows on every rank, as different batches touch different tokens). It reduces it
``--iterations`` times with ``sparse_allreduce_async`` (Horovod's sparse path: an allgather of
indices and values) and with a dense ``allreduce``, interleaved, and reports the bytes this rank's
process wrote to its sockets per reduction, as the kernel counts them (``wchar`` of
``/proc/self/io``: every ``write``/``writev``, which is how Gloo sends; the store's small
messages included), the time per reduction (median), and the ratios sparse / dense.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from launch import run_under_launcher


def _written() -> int:
    """Bytes this process has written through write-type system calls so far."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def worker(rows: int, dim: int, density: float, iterations: int) -> None:
    import torch

    import ringtrain.torch as hvd

    hvd.init()
    r = hvd.rank()
    touched = torch.randperm(rows, generator=torch.Generator().manual_seed(r))[:int(rows * density)]
    sparse = torch.sparse_coo_tensor(touched[None], torch.randn(len(touched), dim), (rows, dim),
                                     check_invariants=True).coalesce()
    dense = sparse.to_dense()
    runs = {
        "sparse": lambda: hvd.sparse_allreduce_async(sparse, name="grad.sparse")(),
        "dense": lambda: hvd.allreduce(dense, name="grad.dense"),
    }
    for run in runs.values():  # negotiated once: what follows is the steady state
        run()
    written = {kind: [] for kind in runs}
    seconds = {kind: [] for kind in runs}
    for _ in range(iterations):
        for kind, run in runs.items():
            hvd.barrier()
            before, start = _written(), time.perf_counter()
            run()
            seconds[kind].append(time.perf_counter() - start)
            written[kind].append(_written() - before)
    per_op = {kind: statistics.median(values) for kind, values in written.items()}
    times = {kind: statistics.median(values) for kind, values in seconds.items()}
    if r == 0:
        print(json.dumps({
            "benchmark": "sparse_bytes", "np": hvd.size(), "rows": rows, "dim": dim,
            "density": density, "iterations": iterations,
            "payload_bytes": {"sparse_indices_and_values": len(touched) * (8 + 4 * dim),
                              "dense": rows * dim * 4},
            "written_bytes_per_op": per_op,
            "seconds_per_op": times,
            "ratio_bytes_sparse_over_dense": per_op["sparse"] / per_op["dense"],
            "ratio_time_sparse_over_dense": times["sparse"] / times["dense"],
        }), flush=True)
    hvd.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2, help="number of ranks (default 2)")
    parser.add_argument("--rows", type=int, default=100_000, help="embedding rows")
    parser.add_argument("--dim", type=int, default=64, help="embedding width")
    parser.add_argument("--density", type=float, default=0.01, help="share of rows set")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.rows, args.dim, args.density, args.iterations)
        return 0
    return run_under_launcher(__file__, args.np, [
        "--rows", str(args.rows), "--dim", str(args.dim), "--density", str(args.density),
        "--iterations", str(args.iterations)])


if __name__ == "__main__":
    sys.exit(main())
