"""`ringtrain env`: the environment block to paste into a bug report."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys


def collect() -> dict[str, object]:
    """Versions and capabilities of this installation (imports torch)."""
    import torch
    import torch.distributed as dist

    from ringtrain import __version__

    return {
        "ringtrain": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "cuda_devices": torch.cuda.device_count(),
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available(),
        "mpi": False,
        "torchvision": _version("torchvision"),
        "keras": _version("keras"),  # read from its metadata: importing picks a backend
        "keras_backend": os.environ.get("KERAS_BACKEND"),
        "cpu_count": os.cpu_count(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "horovod_variables": {k: v for k, v in sorted(os.environ.items())
                              if k.startswith("HOROVOD_")},
        "ringtrain_variables": {k: v for k, v in sorted(os.environ.items())
                                if k.startswith("RINGTRAIN_") and "TOKEN" not in k},
    }


def _version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (``None``: not installed), without importing
    it: torchvision's import can warn, and a bug report should not change what it reports."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ringtrain env", description=__doc__)
    parser.add_argument("-o", "--output", choices=["text", "json"], default="text")
    args = parser.parse_args(argv)
    info = collect()
    if args.output == "json":
        print(json.dumps(info))
        return 0
    for key, value in info.items():
        print(f"{key + ':':<20} {value}")
    return 0
