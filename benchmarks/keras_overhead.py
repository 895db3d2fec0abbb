"""ringtrain.keras: overhead at size 1, and the tutorial example on 1 and 2 processes, on each
Keras backend (torch, tensorflow, jax).

    python benchmarks/keras_overhead.py [--pairs 30] [--limit-train 4096] [--epochs 2]
        [--backends torch,tensorflow,jax] [--steps 30]

Prints one JSON line:

- ``size1_ratio``: steps/s of the tutorial CNN (batch 32) with ``hvd.DistributedOptimizer``
  over the same model with the plain Keras RMSprop, in a world of one (goal >= 0.97). The two
  models alternate in short blocks (3 steps each) so that both see the same machine load; the
  ratio is the median over adjacent block pairs, with a bootstrap 95% interval.
- ``example``: ``examples/keras_cifar_cnn.py`` run under ``ringtrain run -np 1`` and ``-np 2``
  with two seeds each, the same ``--epochs`` (Horovod's recipe: 2 workers run half the epochs at
  twice the learning rate), on the first ``--limit-train`` Fashion-MNIST images: test accuracy,
  seconds per epoch and images/s (all workers) of each run.

- ``backends``: for each backend, the tutorial CNN (batch 32) under ``ringtrain run -np 2``:
  the median step, and the median time per step in ringtrain's code (the gradient hand-off out
  of the compiled step and back, the buckets and the allreduce, which includes waiting for the
  peer), as a share of the step (goal <= 5 %), also without waiting for a slower peer
  (``without_peer_wait_*``: each step's wait counted as its smallest over the ranks, which is
  the last rank's, the transfer alone) and without the allreduce's wait at all
  (``without_allreduce_wait_*``: conversions, bucket copies, submission); and the example's
  scaling efficiency, images/s at 2 processes over twice those at 1 (goal: TensorFlow's and
  JAX's at least torch's); with ``--pinned`` (the default) also the steady-state scaling
  efficiency, the median step of the tutorial CNN on 1 rank over that on 2 (each rank its
  batch of 32), every process pinned to a core of its own (``pinned_*``): the figure where the
  cores are as many as the ranks, without compilation and start-up, which the example's
  images/s count. The size-1 ratio and ``example`` above are the torch backend's.

Every process runs one thread (OMP_NUM_THREADS for torch, TF_NUM_*_THREADS for TensorFlow,
XLA_FLAGS for JAX): Keras slows down badly when processes oversubscribe the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stats import bootstrap_median_ci

ROOT = Path(__file__).resolve().parents[1]
#: One compute thread per process, for every backend.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1",
              "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
              "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}


def _tutorial_cnn(keras):
    return keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Dropout(0.25),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Dropout(0.25), keras.layers.Flatten(),
        keras.layers.Dense(512, activation="relu"), keras.layers.Dropout(0.5),
        keras.layers.Dense(10, activation="softmax")])


def size1_overhead(pairs: int, block: int = 3) -> dict:
    """Plain RMSprop vs DistributedOptimizer(RMSprop) in alternating blocks, world of one."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    # isort: off
    import ringtrain.keras as hvd  # first: it makes torch Keras' backend
    import keras
    # isort: on

    hvd.init()
    rng = np.random.default_rng(0)
    x = rng.random((32, 32, 32, 3), dtype=np.float32)
    y = keras.utils.to_categorical(rng.integers(0, 10, 32), 10)
    models = {}
    for kind in ("plain", "distributed"):
        keras.utils.set_random_seed(0)
        model = _tutorial_cnn(keras)
        opt = keras.optimizers.RMSprop(1e-4)
        if kind == "distributed":
            opt = hvd.DistributedOptimizer(opt)
        model.compile(loss="categorical_crossentropy", optimizer=opt)
        for _ in range(3):  # warm-up
            model.train_on_batch(x, y)
        models[kind] = model
    ratios, rates = [], {"plain": [], "distributed": []}
    for i in range(pairs):
        order = ("plain", "distributed") if i % 2 == 0 else ("distributed", "plain")
        pair = {}
        for kind in order:
            start = time.perf_counter()
            for _ in range(block):
                models[kind].train_on_batch(x, y)
            pair[kind] = block / (time.perf_counter() - start)
            rates[kind].append(pair[kind])
        ratios.append(pair["distributed"] / pair["plain"])
    low, high = bootstrap_median_ci(ratios)
    hvd.shutdown()
    return {"size1_ratio": round(statistics.median(ratios), 4),
            "size1_ratio_ci95": [round(low, 4), round(high, 4)],
            "plain_steps_per_s": round(statistics.median(rates["plain"]), 2),
            "distributed_steps_per_s": round(statistics.median(rates["distributed"]), 2),
            "pairs": pairs, "steps_per_block": block}


def _env(backend: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "RINGTRAIN_"))}
    return env | ONE_THREAD | {
        "KERAS_BACKEND": backend, "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])}


def _pinned(pin: bool) -> list[str]:
    """The prefix of a rank's command that pins it to the core of its local rank. A lone
    process of TensorFlow or JAX keeps a second core partly busy (its runtime's own threads)
    even at one compute thread: unpinned, 2 processes on 2 cores lose that to each other, which
    is the machine's share of the scaling, not ringtrain's."""
    return ["sh", "-c", 'exec taskset -c "$LOCAL_RANK" "$0" "$@"'] if pin else []


def run_example(np_: int, seed: int, args: argparse.Namespace, backend: str = "torch") -> dict:
    """One launch of the example; rank 0's JSON report plus seconds per epoch."""
    env = _env(backend)
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "ringtrain.cli", "run", "-np", str(np_),
               sys.executable, str(ROOT / "examples" / "keras_cifar_cnn.py"),
               "--epochs", str(args.epochs), "--lr", str(args.lr), "--seed", str(seed),
               "--limit-train", str(args.limit_train), "--limit-val", str(args.limit_val),
               "--output-dir", out]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800,
                              check=False)
    if done.returncode:
        raise RuntimeError(f"example on {np_} process(es) exited {done.returncode}:\n"
                           f"{done.stderr[-3000:]}")
    line = [ln.partition(":")[2] for ln in done.stdout.splitlines() if '{"example"' in ln][-1]
    report = json.loads(line)
    report["seconds_per_epoch"] = round(report["fit_seconds"] / report["epochs"], 1)
    report["seed"] = seed
    return report


def _timed_handoff(handoff, totals: list[float]) -> None:
    """Make ``handoff`` add the seconds of each host-side reduction (conversions included) to
    ``totals[0]``."""
    from ringtrain.keras import handoff as handoffs

    def timed(fn):
        def call(*args):
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                totals[0] += time.perf_counter() - start
        return call

    if isinstance(handoff, handoffs.TorchHandoff):
        reduce = handoff.reduce
        handoff.reduce = timed(reduce)  # type: ignore[method-assign]
    else:
        host_call = handoff._host_call
        handoff._host_call = lambda *a: timed(host_call(*a))  # type: ignore[method-assign]


def step_worker(steps: int) -> None:
    """One rank of :func:`step_breakdown`: prints rank 0's medians as a JSON line."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    # isort: off
    import ringtrain.keras as hvd  # first: KERAS_BACKEND from the environment, else torch
    import keras
    # isort: on
    from ringtrain.keras import gradient_reducer
    from ringtrain.keras import handoff as handoffs

    hvd.init()
    totals, waits = [0.0], [0.0]
    _timed_handoff(handoffs.current(), totals)
    synchronize = gradient_reducer.ops.synchronize

    def timed_synchronize(handle):
        start = time.perf_counter()
        try:
            return synchronize(handle)
        finally:
            waits[0] += time.perf_counter() - start

    gradient_reducer.ops.synchronize = timed_synchronize  # the gradients' allreduce waits
    keras.utils.set_random_seed(hvd.rank())
    model = _tutorial_cnn(keras)
    model.compile(loss="categorical_crossentropy",
                  optimizer=hvd.DistributedOptimizer(keras.optimizers.RMSprop(1e-4)))
    rng = np.random.default_rng(hvd.rank())
    warm = 3
    n = 32 * (warm + steps)
    x = rng.random((n, 32, 32, 3), dtype=np.float32)
    y = keras.utils.to_categorical(rng.integers(0, 10, n), 10)
    marks: list[tuple[float, float, float]] = []

    class Steps(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self._start, self._inside, self._wait = time.perf_counter(), totals[0], waits[0]

        def on_train_batch_end(self, batch, logs=None):
            if batch >= warm:
                marks.append((time.perf_counter() - self._start, totals[0] - self._inside,
                              waits[0] - self._wait))

    model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Steps()])
    # The last rank to reach a step's allreduce waits for the transfer only; the others wait
    # for it too, and for that rank besides: each step's smallest wait over the ranks is the
    # transfer, the rest of a rank's wait is a slower peer (load imbalance, not ringtrain's).
    all_waits = hvd.allgather_object([m[2] for m in marks])
    if hvd.rank() == 0:
        step = statistics.median(m[0] for m in marks)
        inside = statistics.median(m[1] for m in marks)
        own = statistics.median(m[1] - m[2] for m in marks)
        unskewed = statistics.median(m[1] - m[2] + min(w[i] for w in all_waits)
                                     for i, m in enumerate(marks))
        print(json.dumps({"step_ms": round(step * 1e3, 1), "ringtrain_ms": round(inside * 1e3, 2),
                          "ringtrain_share": round(inside / step, 4),
                          "without_peer_wait_ms": round(unskewed * 1e3, 2),
                          "without_peer_wait_share": round(unskewed / step, 4),
                          "without_allreduce_wait_ms": round(own * 1e3, 2),
                          "without_allreduce_wait_share": round(own / step, 4)}), flush=True)
    hvd.shutdown()


def step_breakdown(backend: str, steps: int, np_: int = 2, pin: bool = False) -> dict:
    """The tutorial CNN on ``np_`` ranks of ``backend``: median step and time in ringtrain's
    code (``pin``: each rank on the core of its local rank)."""
    cmd = [sys.executable, "-m", "ringtrain.cli", "run", "-np", str(np_), *_pinned(pin),
           sys.executable, __file__, "--worker-steps", str(steps)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(backend), timeout=1800,
                          check=False)
    if done.returncode:
        raise RuntimeError(f"step breakdown on {backend} exited {done.returncode}:\n"
                           f"{done.stderr[-3000:]}")
    line = [ln.partition(":")[2] for ln in done.stdout.splitlines() if '"step_ms"' in ln][-1]
    return json.loads(line)


def backend_figures(backend: str, args: argparse.Namespace) -> dict:
    """:func:`step_breakdown` and the example's scaling efficiency on ``backend``."""
    result = {"backend": backend} | step_breakdown(backend, args.steps)
    ips = {n: run_example(n, 0, args, backend)["images_per_second"] for n in (1, 2)}
    result |= {"images_per_second_1proc": ips[1], "images_per_second_2proc": ips[2],
               "scaling_efficiency": round(ips[2] / (2 * ips[1]), 3)}
    if args.pinned:
        # Steady steps: the example's images/s count each process's compilation and start,
        # a larger share of the shorter 2-process run.
        step = {n: step_breakdown(backend, args.steps, n, pin=True)["step_ms"] for n in (1, 2)}
        result |= {"pinned_step_ms_1proc": step[1], "pinned_step_ms_2proc": step[2],
                   "pinned_steady_scaling_efficiency": round(step[1] / step[2], 3)}
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=30)
    p.add_argument("--epochs", type=int, default=2, help="the example's --epochs (one worker's)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--limit-train", type=int, default=4096)
    p.add_argument("--limit-val", type=int, default=2000)
    p.add_argument("--skip-size1", action="store_true")
    p.add_argument("--skip-example", action="store_true")
    p.add_argument("--backends", default="torch,tensorflow,jax",
                   help="backends of the per-backend figures (comma-separated; empty: none)")
    p.add_argument("--steps", type=int, default=30, help="timed steps of the step breakdown")
    p.add_argument("--pinned", action=argparse.BooleanOptionalAction, default=True,
                   help="also the steady scaling efficiency, each process on a core of its own")
    p.add_argument("--worker-steps", type=int, help=argparse.SUPPRESS)  # one rank of it
    args = p.parse_args()
    if args.worker_steps:
        step_worker(args.worker_steps)
        return 0
    result: dict = {"benchmark": "keras_overhead", "load_average": os.getloadavg()[0]}
    if not args.skip_size1:
        result |= size1_overhead(args.pairs)
    if not args.skip_example:
        runs = [run_example(n, seed, args) for n in (1, 2) for seed in (0, 1)]
        result["example"] = [{k: r[k] for k in ("world_size", "seed", "epochs", "test_accuracy",
                                                "seconds_per_epoch", "images_per_second")}
                             for r in runs]
        acc = {n: [r["test_accuracy"] for r in runs if r["world_size"] == n] for n in (1, 2)}
        ips = {n: statistics.mean(r["images_per_second"] for r in runs if r["world_size"] == n)
               for n in (1, 2)}
        result["accuracy_1proc"], result["accuracy_2proc"] = acc[1], acc[2]
        result["throughput_2proc_over_1proc"] = round(ips[2] / ips[1], 3)
    result["backends"] = [backend_figures(b, args) for b in args.backends.split(",") if b]
    result["load_average_end"] = os.getloadavg()[0]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
