"""`ringtrain run --horovod-compat`: unmodified Horovod scripts import ringtrain as `horovod`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ringtrain.torch as hvd
from ringtrain.errors import HorovodInternalError
from ringtrain.runner.plan import compat_shim_dir

SCRIPTS = Path(__file__).resolve().parent / "horovod_scripts"
RINGTRAIN = str(Path(sys.executable).with_name("ringtrain"))
# Variables a surrounding launcher may have set; the launched workers must see only ours.
_LAUNCHER_PREFIXES = ("HOROVOD_", "RINGTRAIN_", "OMPI_", "PMI_", "SLURM_", "TORCHELASTIC_")
_LAUNCHER_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                   "MASTER_PORT", "PYTHONPATH"}


def _launch(*argv: str) -> dict[int, list[str]]:
    """Run ``ringtrain run ARGV`` to completion; return each rank's stdout lines."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_LAUNCHER_PREFIXES) and k not in _LAUNCHER_NAMES}
    env |= {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([RINGTRAIN, "run", *argv], capture_output=True, text=True,
                            timeout=180, env=env)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    lines: dict[int, list[str]] = {}
    for line in result.stdout.splitlines():
        prefix, sep, text = line.partition("]<stdout>:")
        if sep:
            lines.setdefault(int(prefix.lstrip("[")), []).append(text)
    return lines


def test_unmodified_horovod_script_trains_on_two_ranks_with_equal_parameters():
    lines = _launch("--horovod-compat", "-np", "2", sys.executable,
                    str(SCRIPTS / "train_horovod.py"))
    reports = {rank: json.loads(out[-1]) for rank, out in lines.items()}
    assert sorted(reports) == [0, 1]
    for rank, report in reports.items():
        assert (report["rank"], report["size"], report["ranks_summed"]) == (rank, 2, 2)
        assert report["version"] == "0.28.1" and report["gloo_built"] and report["fp16"]
        assert report["internal_error_is_runtime"]
        assert report["hvd_module"].startswith("ringtrain.")
    # Broadcast start, averaged gradients: the ranks' models stay identical, bit for bit.
    assert reports[0]["params"] == reports[1]["params"]
    assert reports[0]["losses"] == reports[1]["losses"]
    assert len(reports[0]["losses"]) == 5


def test_without_compat_workers_cannot_import_horovod():
    probe = ("try:\n    import horovod\n    print('horovod at', horovod.__file__)\n"
             "except ModuleNotFoundError:\n    print('no horovod')\n")
    lines = _launch("-np", "2", sys.executable, "-c", probe)
    assert lines == {0: ["no horovod"], 1: ["no horovod"]}


@pytest.fixture
def shim_on_path(monkeypatch):
    """The shim importable in this process, as in a --horovod-compat worker; undone after."""
    monkeypatch.syspath_prepend(compat_shim_dir())
    yield
    for name in [m for m in sys.modules if m == "horovod" or m.startswith("horovod.")]:
        del sys.modules[name]


def test_shim_names_are_ringtrains_objects(shim_on_path):
    import horovod
    import horovod.torch as shim
    from horovod.common import elastic as common_elastic
    from horovod.common import exceptions, util
    from horovod.torch import compression, functions, mpi_ops
    from horovod.torch.elastic import ElasticSampler, TorchState, run

    assert horovod.__version__ == "0.28.1"
    for name in hvd.__all__:
        assert getattr(shim, name) is getattr(hvd, name), name
    assert shim.elastic is hvd.elastic and sys.modules["horovod.torch.elastic"] is hvd.elastic
    assert (ElasticSampler, TorchState, run) == (
        hvd.elastic.ElasticSampler, hvd.elastic.TorchState, hvd.elastic.run)
    assert (mpi_ops.Average, mpi_ops.Sum, mpi_ops.Adasum) == (hvd.Average, hvd.Sum, hvd.Adasum)
    assert mpi_ops.allreduce_async_ is hvd.allreduce_async_ and mpi_ops.init is hvd.init
    assert compression.Compression is hvd.Compression
    assert compression.FP16Compressor is hvd.Compression.fp16
    assert functions.broadcast_parameters is hvd.broadcast_parameters
    assert exceptions.HorovodInternalError is HorovodInternalError
    assert issubclass(exceptions.HostsUpdatedInterrupt, RuntimeError)
    assert common_elastic.ObjectState is hvd.elastic.ObjectState
    assert util.gloo_built(verbose=True) == hvd.gloo_built()
    assert not util.mpi_built() and util.nccl_built() == hvd.nccl_built()
    assert util.cuda_built() == torch.backends.cuda.is_built()
    assert util.extension_available("horovod.torch")
    assert not util.extension_available("horovod.tensorflow")


def test_shim_keras_names_are_ringtrain_keras_objects(shim_on_path):
    hvd_keras = pytest.importorskip("ringtrain.keras")
    import horovod.keras as shim
    import horovod.keras.callbacks as callbacks
    import horovod.tensorflow as tf_shim
    import horovod.tensorflow.keras as tf_keras
    from horovod.keras.elastic import KerasState, run
    from horovod.tensorflow.keras.callbacks import BroadcastGlobalVariablesCallback

    for name in hvd_keras.__all__:
        assert getattr(shim, name) is getattr(hvd_keras, name), name
        assert getattr(tf_keras, name) is getattr(hvd_keras, name), name
    assert callbacks is hvd_keras.callbacks and shim.callbacks is hvd_keras.callbacks
    assert BroadcastGlobalVariablesCallback is hvd_keras.callbacks.BroadcastGlobalVariablesCallback
    assert (KerasState, run) == (hvd_keras.elastic.KerasState, hvd_keras.elastic.run)
    with pytest.raises(AttributeError, match="no TensorFlow frontend"):
        tf_shim.DistributedOptimizer  # noqa: B018


@pytest.mark.slow  # about 50 s on the shared 2-core VM: pytest starts on every rank
def test_horovod_style_suite_passes_under_pytest_on_two_ranks_without_hanging():
    # join with allreduce, allgather and broadcast, sparse embeddings both ways, and ranks that
    # diverge, as Horovod runs its own suite: every rank runs pytest on the same file
    lines = _launch("--horovod-compat", "-np", "2", sys.executable, "-m", "pytest", "-q",
                    "-p", "no:cacheprovider", "--noconftest",
                    str(SCRIPTS / "horovod_style_suite.py"))
    assert sorted(lines) == [0, 1]
    for out in lines.values():
        summary = [line for line in out if " passed" in line or " failed" in line]
        assert summary and summary[-1].startswith("5 passed"), "\n".join(out)
