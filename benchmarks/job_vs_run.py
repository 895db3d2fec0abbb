"""The README's main job on a local cluster against the same training under `ringtrain run`.

Submits ``examples/fashion_mnist_job.yaml`` (2 nodes x 1 process) to a local cluster of 2 nodes x
2 slots, as the README does, and runs the same command with ``ringtrain run -np 2`` on this
machine, alternating, ``--repeats`` pairs, one at a time so that they never share the cores.
Prints one JSON line: each run's training time as the example measures it (``wall_s``, from its
start to its summary: the same epochs on both sides) and test accuracy, and the ratio of the job's
median to the launcher's. Goal (issue 37): the job within 1.1x of ``ringtrain run -np 2``.

    python benchmarks/job_vs_run.py                                   # the README's 5 epochs
    python benchmarks/job_vs_run.py --args '--epochs 1' --repeats 3  # a quicker comparison
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jobs_ray_parity import collect, submit
from loopback_ray import job_server, machine, repo_root

from ringtrain.jobs.home import Home
from ringtrain.jobs.models import ClusterSpec

SPEC = repo_root() / "examples" / "fashion_mnist_job.yaml"


def launcher_run(extra_args: str, timeout_s: float) -> dict[str, object]:
    """``ringtrain run -np 2 python examples/fashion_mnist.py ARGS``: the example's summary."""
    with tempfile.TemporaryDirectory(prefix="ringtrain-run-") as out:
        argv = [sys.executable, "-m", "ringtrain.cli", "run", "-np", "2", sys.executable,
                "examples/fashion_mnist.py", "--output-dir", out, *shlex.split(extra_args)]
        started = time.time()
        done = subprocess.run(argv, cwd=repo_root(), capture_output=True, text=True,
                              timeout=timeout_s, check=True)
    line = next(x for x in reversed(done.stdout.splitlines()) if '{"example"' in x)
    summary = json.loads(line[line.index("{"):])
    return {"test_accuracy": summary["test_accuracy"], "in_script_wall_s": summary["wall_s"],
            "start_to_end_s": round(time.time() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--args", default="", help="appended to the example's command on both sides")
    p.add_argument("--repeats", type=int, default=1, help="pairs of runs (default 1)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    args = p.parse_args(argv)
    where = machine()
    jobs, runs = [], []
    with tempfile.TemporaryDirectory(prefix="ringtrain-job-vs-run-") as tmp:
        home = Home(Path(tmp) / "home")
        with job_server(home, ray_node_ip=None) as client:
            client.create_cluster(ClusterSpec(name="local", nodes=2, slots=2))
            for _ in range(args.repeats):
                t0 = time.time()
                jobs.append(collect(client, submit(home, SPEC, "local", args.args), t0,
                                    args.timeout))
                runs.append(launcher_run(args.args, args.timeout))
    job_s = statistics.median(float(j["in_script_wall_s"]) for j in jobs)
    run_s = statistics.median(float(r["in_script_wall_s"]) for r in runs)
    print(json.dumps({"benchmark": "job_vs_run", "machine": where, "args": args.args,
                      "job": jobs, "run": runs, "ratio_job_to_run": round(job_s / run_s, 3),
                      "goal": "<= 1.1"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
