"""What a warm node cache adds to a job's start: the stage step a job with URL inputs runs.

A job whose inputs are URLs runs ``python -m ringtrain.storage.node_main stage PLAN RESULT`` on
each node (at once) before its preparation; a job with local inputs runs nothing there. So the
second job on a warm cache starts later than a job with local inputs by that step's time: the
interpreter and store library start, one listing of the input, the cache lookup and the hold.
This runs the step as the job runner does (a child process, the plan a file) against a real
SeaweedFS or Azurite on loopback, once cold, then ``--repeats`` times warm, and prints one JSON
line per store: the warm step's median seconds [bootstrap 95 %], the cold step's, and the floor
a peer process pays in the same run (``python -c 'import ringtrain.storage.node_main'``, which
every step needs before it does anything). Goal (issue 33): warm < 1 s.

The data is the Fashion-MNIST idx files of Debian's ``dataset-fashion-mnist`` (4 gzipped files,
30 MB) when installed, else 4 random files of the same sizes. Reproduce:
``python benchmarks/warm_cache.py`` (``--stores seaweedfs`` for one).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import storage  # benchmarks/storage.py: the stores the tests start, stopped either way
from stats import bootstrap_median_ci

FASHION = Path("/usr/share/datasets/fashion-mnist")
SIZES = (26_421_856, 29_491, 4_422_079, 5_125)  # the four gzipped idx files


def dataset(root: Path) -> Path:
    """The Fashion-MNIST files if installed, else random files as large."""
    if FASHION.is_dir() and any(FASHION.glob("*.gz")):
        return FASHION
    folder = root / "fashion"
    folder.mkdir()
    for i, size in enumerate(SIZES):
        (folder / f"part{i}.idx").write_bytes(os.urandom(size))
    return folder


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{proc.stdout}{proc.stderr}")
    return seconds


def measure(store: Any, data: Path, work: Path, repeats: int) -> dict[str, Any]:
    fs = store.fs()
    for path in data.iterdir():
        fs.put_file(str(path), f"{store.bucket}/fashion/{path.name}")
    plan = work / "plan.json"
    plan.write_text(json.dumps({
        "cache_root": str(work / "cache"), "cache_max_bytes": 10**10, "holder": "bench.0",
        "holder_pid": os.getpid(),
        "inputs": {"data": {"url": store.url("fashion"), "options": store.options}}}))
    plan.chmod(0o600)
    env = {**os.environ, "PYTHONPATH": str(storage.REPO)}
    stage = [sys.executable, "-m", "ringtrain.storage.node_main", "stage", str(plan),
             str(work / "result.json")]
    floor = [sys.executable, "-c", "import ringtrain.storage.node_main"]
    cold = timed(stage, env)
    warm, peer = [], []
    for _ in range(repeats):  # alternating, so that load changes touch both alike
        warm.append(timed(stage, env))
        peer.append(timed(floor, env))
    low, high = bootstrap_median_ci(warm)
    mid = sorted(warm)[len(warm) // 2]
    return {"benchmark": "warm_cache", "store": store.kind, "files": len(list(data.iterdir())),
            "bytes": sum(p.stat().st_size for p in data.iterdir()),
            "warm_stage_s": round(mid, 3), "warm_ci95": [round(low, 3), round(high, 3)],
            "cold_stage_s": round(cold, 3),
            "import_floor_s": round(sorted(peer)[len(peer) // 2], 3),
            "goal_warm_s": 1.0, "met": high < 1.0, "repeats": repeats,
            "machine": storage.machine()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=15, help="warm steps (default 15)")
    p.add_argument("--stores", type=lambda s: storage._list(s, ("seaweedfs", "azurite")),
                   default=["seaweedfs", "azurite"], help="default seaweedfs,azurite")
    args = p.parse_args(argv)
    servers = storage._servers()
    with tempfile.TemporaryDirectory(prefix="ringtrain-bench-warm-",
                                     ignore_cleanup_errors=True) as tmp, \
            storage.stopping_servers(servers):
        root = Path(tmp)
        data = dataset(root)
        for kind in args.stores:
            store = storage.start(servers, kind, root / kind)
            work = root / f"work-{kind}"
            work.mkdir()
            print(json.dumps(measure(store, data, work, args.repeats)), flush=True)
            storage.rmtree(work / "cache")
    return 0


if __name__ == "__main__":
    sys.exit(main())
