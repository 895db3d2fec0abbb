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
from contextlib import ExitStack
from pathlib import Path

from loopback_ray import (
    job_server,
    machine,
    rank_stdout,
    ray_test_cluster,
    repo_root,
    wait_until_ended,
)

from ringtrain.jobs import envvars
from ringtrain.jobs.client.jobs_client import JobsClient
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


def collect(client: JobsClient, job_id: str, submitted_at: float, timeout_s: float
            ) -> dict[str, object]:
    """The example's JSON summary once the job ended, plus the job's times."""
    job = wait_until_ended(client, job_id, timeout_s)
    out = rank_stdout(client, job_id)
    if job.state != JobState.SUCCEEDED:
        raise RuntimeError(f"job {job_id} on {job.cluster} {job.state.value}: {job.message}\n"
                           f"{out[-2000:]}")
    summary = json.loads(next(line for line in reversed(out.splitlines())
                              if line.startswith("{")))
    files = [f.path for f in client.list_files(job_id, "outputs/model")]
    return {"job": job_id, "test_accuracy": summary["test_accuracy"],
            "test_loss": summary["test_loss"], "epochs": summary["epochs"],
            "in_script_wall_s": summary["wall_s"],
            "submit_to_end_s": round(job.ended_at - submitted_at, 1),
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
    p.add_argument("--together", action="store_true",
                   help="submit the runs at once rather than one after the other (they share "
                        "the machine's cores: only the accuracies compare)")
    args = p.parse_args(argv)
    backends = args.backends.split(",")
    if not set(backends) <= {"local", "ray"}:
        p.error(f"--backends: local and/or ray, not {args.backends}")
    where = machine()
    runs: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="ringtrain-parity-") as tmp, ExitStack() as stack:
        home = Home(Path(tmp) / "home")
        address = stack.enter_context(ray_test_cluster(args.ray_nodes)) \
            if "ray" in backends else None
        client = stack.enter_context(job_server(home))
        client.create_cluster(ClusterSpec(name="local", nodes=2, slots=1))
        if address:
            client.create_cluster(ClusterSpec(name="ray", nodes=0, slots=1, backend="ray",
                                              address=address))
        submitted = {}
        for cluster in backends:
            t0 = time.time()
            submitted[cluster] = (submit(home, args.spec, cluster, args.args), t0)
            if not args.together:
                runs[cluster] = collect(client, *submitted[cluster], args.timeout)
        for cluster in backends:
            if cluster not in runs:
                runs[cluster] = collect(client, *submitted[cluster], args.timeout)
    result = {"benchmark": "jobs_ray_parity", "machine": where, "spec": str(args.spec),
              "args": args.args, "together": args.together, "ray_nodes": args.ray_nodes,
              **runs}
    if len(runs) == 2:
        result["accuracy_difference"] = round(runs["ray"]["test_accuracy"]
                                              - runs["local"]["test_accuracy"], 4)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
