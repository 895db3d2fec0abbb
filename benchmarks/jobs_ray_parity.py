"""The README's main job on a local and on a Ray cluster: the same spec, the same accuracy.

Submits ``examples/fashion_mnist_job.yaml`` with the CLI, unchanged, to a local 2-node cluster
and then to a ray cluster attached to a Ray test cluster of ``--ray-nodes`` raylets on this
machine (``--cluster`` is the only difference), one after the other so that they do not share
the cores, and prints one JSON line: each run's test accuracy, wall time from submit to the end,
and the accuracy difference.

    unshare -n sh -c 'ip link set lo up && exec python benchmarks/jobs_ray_parity.py'

``--args`` appends to the job's command (e.g. ``--args '--limit-train 2000 --epochs 2'`` for a
quick run); without it the spec runs as the README submits it. Goal (issue 13): the Ray run
reaches the local run's accuracy.
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

from loopback_ray import (job_server, machine, rank_stdout, ray_test_cluster, repo_root,
                          wait_until_ended)

from ringtrain.jobs import envvars
from ringtrain.jobs.client import JobsClient
from ringtrain.jobs.home import Home
from ringtrain.jobs.models import ClusterSpec, JobState


def submit(home: Home, spec: Path, cluster: str, extra_args: str) -> str:
    """``ringtrain job submit SPEC --cluster CLUSTER`` from the checkout; returns the job id."""
    if extra_args:  # a copy of the spec with the arguments appended to its command
        import yaml

        data = yaml.safe_load(spec.read_text())
        data["command"] = f"{data['command']} {extra_args}"
        spec = home.root / f"{spec.stem}-{cluster}.yaml"
        spec.write_text(yaml.safe_dump(data))
    out = subprocess.run([sys.executable, "-m", "ringtrain.cli", "job", "submit", str(spec),
                          "--cluster", cluster, "-o", "json"], cwd=repo_root(), check=True,
                         capture_output=True, text=True,
                         env={**os.environ, envvars.HOME: str(home.root)}).stdout
    return json.loads(out)["id"]


def run_job(client: JobsClient, home: Home, spec: Path, cluster: str, extra_args: str,
            timeout_s: float) -> dict[str, object]:
    """One run of the spec on ``cluster``: the example's JSON summary plus the job's times."""
    t0 = time.time()
    job_id = submit(home, spec, cluster, extra_args)
    job = wait_until_ended(client, job_id, timeout_s)
    out = rank_stdout(client, job_id)
    if job.state != JobState.SUCCEEDED:
        raise RuntimeError(f"job {job_id} on {cluster} {job.state.value}: {job.message}\n"
                           f"{out[-2000:]}")
    summary = json.loads(next(line for line in reversed(out.splitlines())
                              if line.startswith("{")))
    files = [f.path for f in client.list_files(job_id, "outputs/model")]
    return {"job": job_id, "test_accuracy": summary["test_accuracy"],
            "test_loss": summary["test_loss"], "epochs": summary["epochs"],
            "in_script_wall_s": summary["wall_s"], "submit_to_end_s": round(time.time() - t0, 1),
            "model_saved": "outputs/model/model.pt" in files}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", type=Path, default=repo_root() / "examples" / "fashion_mnist_job.yaml")
    p.add_argument("--args", default="", help="appended to the job's command")
    p.add_argument("--ray-nodes", type=int, default=2, help="raylets of the Ray test cluster")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per job")
    p.add_argument("--backends", default="local,ray",
                   help="the runs to make, in order (default local,ray)")
    args = p.parse_args(argv)
    backends = args.backends.split(",")
    if not set(backends) <= {"local", "ray"}:
        p.error(f"--backends: local and/or ray, not {args.backends}")
    where = machine()
    with tempfile.TemporaryDirectory(prefix="ringtrain-parity-") as tmp, \
            ray_test_cluster(args.ray_nodes) as address:
        home = Home(Path(tmp) / "home")
        with job_server(home) as client:
            client.create_cluster(ClusterSpec(name="local", nodes=2, slots=1))
            client.create_cluster(ClusterSpec(name="ray", nodes=0, slots=1, backend="ray",
                                              address=address))
            runs = {c: run_job(client, home, args.spec, c, args.args, args.timeout)
                    for c in backends}
    result = {"benchmark": "jobs_ray_parity", "machine": where, "spec": str(args.spec),
              "args": args.args, "ray_nodes": args.ray_nodes, **runs}
    if len(runs) == 2:
        result["accuracy_difference"] = round(runs["ray"]["test_accuracy"]
                                              - runs["local"]["test_accuracy"], 4)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
