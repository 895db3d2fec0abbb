"""Keras on JAX in a process confined to one CPU: the gradients' host callback must not wait
forever for a thread (ringtrain/keras/jax_threads.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                                reason="jax is not installed (the test extra has it: "
                                       "bash scripts/setup.sh)")

# A convolutional model: a dense one of the same size did not stop without the fix.
_TRAIN = """
import os

os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one CPU, before JAX starts
import numpy as np
import ringtrain.keras as hvd
import keras

hvd.init()
L = keras.layers
model = keras.Sequential([keras.Input((32, 32, 3)), L.Conv2D(32, 3, padding="same"),
                          L.MaxPooling2D(), L.Flatten(), L.Dense(64), L.Dense(10)])
model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(keras.optimizers.RMSprop(0.01)))
rng = np.random.default_rng(0)
model.fit(rng.random((64, 32, 32, 3), dtype=np.float32), rng.random((64, 10), dtype=np.float32),
          batch_size=32, epochs=1, verbose=0)
print("trained", sorted(os.sched_getaffinity(0)), os.environ.get("PJRT_NPROC"))
"""


def test_a_jax_rank_on_one_cpu_trains_through_its_host_callback():
    env = {k: v for k, v in os.environ.items() if k not in ("PJRT_NPROC", "NPROC")}
    env["KERAS_BACKEND"] = "jax"
    try:
        done = subprocess.run([sys.executable, "-c", _TRAIN], env=env, capture_output=True,
                              text=True, timeout=90, check=False)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"a JAX process on one CPU stopped in its first steps:\n{e.stderr}")
    assert done.returncode == 0, done.stderr[-3000:]
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("trained [") and line.endswith("] 2"), line  # one CPU, 2 threads
