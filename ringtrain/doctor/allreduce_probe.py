"""The network's allreduce cost curve, measured: ``ringtrain run -np 2 python -m
ringtrain.doctor.allreduce_probe OUT.json [MAX_BYTES]``.

Every rank times in-place float32 allreduces through ringtrain (engine included, as gradients
travel) at sizes from 4 KiB to ``MAX_BYTES`` (default 32 MiB), interleaved size by size so that
load drifting during the run touches every size alike; rank 0 writes the median time of each
size as ``{"workers": N, "samples": [[nbytes, seconds], ...]}``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

_MIN_BYTES = 4 << 10
_ROUNDS = 7


def sizes_up_to(max_bytes: int) -> list[int]:
    """4 KiB, 4x larger each time, up to ``max_bytes`` (included)."""
    sizes, n = [], _MIN_BYTES
    while n < max_bytes:
        sizes.append(n)
        n *= 4
    return [*sizes, max(max_bytes, _MIN_BYTES)]


def main(argv: list[str]) -> int:
    """Measure and write the curve (see the module's description)."""
    if not 1 <= len(argv) <= 2 or (len(argv) == 2 and not argv[1].isdigit()):
        print("usage: python -m ringtrain.doctor.allreduce_probe OUT.json [MAX_BYTES]",
              file=sys.stderr)
        return 2
    import torch

    import ringtrain.torch as hvd

    hvd.init()
    sizes = sizes_up_to(int(argv[1]) if len(argv) == 2 else 32 << 20)
    tensors = {n: torch.ones(n // 4) for n in sizes}
    for n in sizes:  # connections, buffers and the response cache, before timing
        hvd.allreduce_(tensors[n], name=f"probe.{n}")
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(_ROUNDS):
        for n in sizes:
            hvd.barrier()
            start = time.perf_counter()
            hvd.allreduce_(tensors[n], name=f"probe.{n}")
            times[n].append(time.perf_counter() - start)
    # The slowest rank's time is the collective's.
    medians = hvd.allreduce(torch.tensor([statistics.median(times[n]) for n in sizes],
                                         dtype=torch.float64), op=hvd.Max, name="probe.medians")
    if hvd.rank() == 0:
        samples = [[n, float(t)] for n, t in zip(sizes, medians)]
        Path(argv[0]).write_text(json.dumps({"workers": hvd.size(), "samples": samples}) + "\n",
                                 encoding="utf-8")
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
