"""ringtrain.keras: overhead at size 1, and the tutorial example on 1 and 2 processes.

    python benchmarks/keras_overhead.py [--pairs 30] [--limit-train 4096] [--epochs 2]

Prints one JSON line:

- ``size1_ratio``: steps/s of the tutorial CNN (batch 32) with ``hvd.DistributedOptimizer``
  over the same model with the plain Keras RMSprop, in a world of one (goal >= 0.97). The two
  models alternate in short blocks (3 steps each) so that both see the same machine load; the
  ratio is the median over adjacent block pairs, with a bootstrap 95% interval.
- ``example``: ``examples/keras_cifar_cnn.py`` run under ``ringtrain run -np 1`` and ``-np 2``
  with two seeds each, the same ``--epochs`` (Horovod's recipe: 2 workers run half the epochs at
  twice the learning rate), on the first ``--limit-train`` Fashion-MNIST images: test accuracy,
  seconds per epoch and images/s (all workers) of each run.

Every process runs one torch thread (OMP_NUM_THREADS=1): Keras on torch slows down badly when
processes oversubscribe the cores.
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


def run_example(np_: int, seed: int, args: argparse.Namespace) -> dict:
    """One launch of the example; rank 0's JSON report plus seconds per epoch."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "RINGTRAIN_"))}
    env |= {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
            "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])}
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=30)
    p.add_argument("--epochs", type=int, default=2, help="the example's --epochs (one worker's)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--limit-train", type=int, default=4096)
    p.add_argument("--limit-val", type=int, default=2000)
    p.add_argument("--skip-size1", action="store_true")
    p.add_argument("--skip-example", action="store_true")
    args = p.parse_args()
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
    result["load_average_end"] = os.getloadavg()[0]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
