"""`ringtrain cluster create NAME --backend ray --local --nodes N` starts a private Ray cluster
of N nodes on this host, so that a job asking for N nodes runs on it as written.

Ray binds every interface it sees and `ray start` leaves daemons behind: the scenario runs in
a loopback-only network namespace with its own process IDs (`unshare -n -p -f --mount-proc`,
as root), where every Ray process ends with the namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.jobs.home import Home

from .conftest import CLI, wait_for

INSIDE = os.environ.get("RINGTRAIN_TEST_RAY_LOCAL") == "1"
ROOT = Path(__file__).resolve().parents[2]

# Each rank sums rank + 1 over the world and says so.
ALLREDUCE = ("python -c \"import torch, ringtrain.torch as hvd; hvd.init(); "
             "s = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum); "
             "print('sum', int(s.item()), 'of', hvd.size(), flush=True)\"")


@pytest.mark.slow
def test_local_ray_cluster_of_two_nodes_runs_a_two_node_job() -> None:
    if INSIDE:
        pytest.skip("this is the namespace already")
    pytest.importorskip("ray", reason="the ray extra is not installed")
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        pytest.skip("needs root, `unshare` and `ip` for a private namespace")
    env = {**os.environ, "RINGTRAIN_TEST_RAY_LOCAL": "1", "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
            "inside", str(Path(__file__))]
    proc = subprocess.run(["unshare", "-n", "-p", "-f", "--mount-proc", "sh", "-c",
                           'ip link set lo up && exec "$@"', "sh", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=400, check=False)
    report = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0 and " passed" in proc.stdout, report


@pytest.mark.skipif(not INSIDE, reason="runs in the namespace of the test above")
def test_inside(home: Home, cli: CLI, tmp_path: Path) -> None:
    rc, out, err = cli("cluster", "create", "big", "--backend", "ray", "--local", "--nodes", "2",
                       "--slots", "1", "-o", "json")
    assert rc == 0, err
    info = json.loads(out)
    assert info["target_nodes"] == 2
    assert len([n for n in info["machines"] if n["alive"]]) == 2
    spec = tmp_path / "job.yaml"
    spec.write_text(f"node_count: 2\nprocess_count_per_node: 1\ncommand: {json.dumps(ALLREDUCE)}\n")
    rc, out, err = cli("job", "submit", str(spec), "--cluster", "big", "-o", "json")
    assert rc == 0, err
    job_id = json.loads(out)["id"]

    def ended() -> dict | None:
        job = json.loads(cli("job", "show", job_id, "-o", "json")[1])
        return job if job["state"] in ("succeeded", "failed", "terminated") else None

    job = wait_for(ended, timeout_s=240, every_s=1.0)
    assert job["state"] == "succeeded", job
    assert "sum 3 of 2" in cli("job", "logs", job_id)[1]
