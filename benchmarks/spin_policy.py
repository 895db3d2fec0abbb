"""The spin policy against its alternatives, round by round in one run.

    python benchmarks/spin_policy.py [--np 2] [--rounds 30] [--busy 0]

launches itself with `ringtrain run -np N` and prints one JSON line: for 4 KiB, 64 KiB and
1 MiB, the quartiles of the time per back-to-back ``hvd.allreduce_`` (rank 0, microseconds)
under three policies for how long a waiter spins (``ringtrain.backends.spin``):

- ``stall``: the policy itself, by the share of the last window in which some thread waited for
  a core (``/proc/pressure/cpu``);
- ``instant``: by the threads runnable at the instant of the read (``/proc/loadavg``), what the
  policy falls back to where the kernel keeps no stall total;
- ``always``: the idle machine's spin whatever the load.

The policies take turns every round (each round after a barrier, every rank switching alike), so
a virtual machine's changes of speed, which move the figures of separate runs by 2x, fall on all
three. ``--busy K`` starts K processes that spin on a core each beside the ranks: the loaded
machine, where a long spin takes the core the peer needs. Also printed: the share of each
round's time in which some thread waited for a core (``stalled_share``, deciles), the figure
the policy reads.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time

from launch import run_under_launcher

SIZES = ((4096, 200), (65536, 100), (1 << 20, 40))
POLICIES = ("stall", "instant", "always")


def _busy() -> None:
    while True:
        pass


def worker(rounds: int) -> None:
    import torch

    import ringtrain.torch as hvd
    from ringtrain.backends import spin

    torch.set_num_threads(1)
    policies = {"stall": spin.SpinPolicy(), "instant": spin.SpinPolicy(stalled_us=lambda: None)}
    current = ["stall"]

    def spin_s() -> float:
        name = current[0]
        allowed = spin.IDLE_SPIN_S if name == "always" else policies[name].spin_s()
        cap = getattr(spin._THREAD, "cap", None)
        return allowed if cap is None else min(allowed, cap)

    spin.spin_s = spin_s  # the waiters look it up at every wait
    hvd.init()
    result: dict = {"benchmark": "spin_policy", "world_size": hvd.size(), "rounds": rounds}
    shares: list[float] = []
    for nbytes, calls in SIZES:
        tensor = torch.ones(nbytes // 4)
        for _ in range(50):
            hvd.allreduce_(tensor, op=hvd.Sum, name=f"spin.{nbytes}")
        times: dict[str, list[float]] = {name: [] for name in POLICIES}
        for _ in range(rounds):
            for name in POLICIES:
                current[0] = name
                hvd.barrier()
                stalled, start = spin._stalled_us(), time.perf_counter()
                for _ in range(calls):
                    hvd.allreduce_(tensor, op=hvd.Sum, name=f"spin.{nbytes}")
                took = time.perf_counter() - start
                times[name].append(took / calls * 1e6)
                after = spin._stalled_us()
                if stalled is not None and after is not None:
                    shares.append((after - stalled) / (took * 1e6))
        quartiles = {name: [round(q, 1) for q in statistics.quantiles(v, n=4)]
                     for name, v in times.items()}
        result[f"{nbytes}_us_quartiles"] = quartiles
        result[f"{nbytes}_stall_vs_instant"] = round(quartiles["stall"][1]
                                                     / quartiles["instant"][1], 3)
        result[f"{nbytes}_stall_vs_always"] = round(quartiles["stall"][1]
                                                    / quartiles["always"][1], 3)
    result["stalled_share_deciles"] = ([round(q, 3) for q in statistics.quantiles(shares, n=10)]
                                       if len(shares) > 1 else None)
    if hvd.rank() == 0:
        print(json.dumps(result), flush=True)
    hvd.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2, help="number of ranks (default 2)")
    parser.add_argument("--rounds", type=int, default=30, help="rounds per policy and size")
    parser.add_argument("--busy", type=int, default=0,
                        help="processes that keep a core busy beside the ranks (default 0)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds)
        return 0
    hogs = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(args.busy)]
    for hog in hogs:
        hog.start()
    try:
        return run_under_launcher(__file__, args.np, ["--rounds", str(args.rounds)])
    finally:
        for hog in hogs:
            hog.kill()


if __name__ == "__main__":
    sys.exit(main())
