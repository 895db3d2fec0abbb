"""Elastic jobs end to end: the CLI against a real server on loopback with its SQLite store, a
3-node elastic job training with ``hvd.elastic.run`` and the elastic sampler on Gloo; one node's
rank is killed with SIGKILL mid-epoch, the job goes on on 2 nodes from the last commit, grows
onto a node that a resize adds, and succeeds with an uninterrupted run's result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.jobs.home import Home

from .conftest import CLI, wait_for
from .test_e2e import job_state, spec_file

SCRIPT = Path(__file__).resolve().parents[1] / "integration" / "elastic_train.py"
SAMPLES = 144


def _events(job_dir: Path, worker: int) -> list[dict]:
    """The JSON lines a worker printed (``elastic_train.py`` reports what it does)."""
    path = job_dir / "stdouterr" / f"rank.{worker}" / "stdout"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{") and line.endswith("}")]


def _of(events: list[dict], kind: str, **fields: object) -> list[dict]:
    return [e for e in events
            if e["event"] == kind and all(e.get(k) == v for k, v in fields.items())]


@pytest.mark.slow
def test_an_elastic_job_survives_a_lost_node_and_grows_onto_a_new_one(
        home: Home, cli: CLI, tmp_path: Path) -> None:
    assert cli("cluster", "create", "el", "--nodes", "3")[0] == 0
    # Worker 1 (node 1) stops in batch 6 of epoch 0 of the first world, its peers waiting for it
    # in that batch's allreduce; it is killed there.
    command = f"RINGTRAIN_TEST_PAUSE=1:0:6 exec {sys.executable} {SCRIPT}"
    spec = spec_file(tmp_path, "elastic", node_count=3, min_nodes=2, max_nodes=3,
                     command=command, environment={"OMP_NUM_THREADS": "1"})
    rc, out, err = cli("job", "submit", spec, "--cluster", "el")
    assert rc == 0, err
    job_id = out.strip()
    job_dir = Path(job_state(cli, job_id)["job_dir"])

    pause = wait_for(lambda: _of(_events(job_dir, 1), "pause"), timeout_s=120)[0]
    victim = _of(_events(job_dir, 1), "start")[0]["pid"]
    os.kill(victim, signal.SIGKILL)

    # The job goes on on nodes 0 and 2, and says which node it lost and why.
    wait_for(lambda: _of(_events(job_dir, 0), "batch", size=2), timeout_s=60)
    lost = "lost node 1 (worker 1 on node1.localhost was killed by signal SIGKILL)"
    shrunk = wait_for(lambda: (j := job_state(cli, job_id))["nodes"] == [0, 2] and j,
                      timeout_s=30)
    assert shrunk["state"] == "running"
    assert shrunk["message"] == f"elastic: running on nodes 0, 2; {lost}"
    cluster = json.loads(cli("cluster", "show", "el", "-o", "json")[1])
    assert cluster["node_counts"] == {"idle": 1, "preparing": 0, "running": 2, "leaving": 0,
                                      "unusable": 0}

    # A node added to the cluster joins the job at its next commit (the lost one does not).
    assert cli("cluster", "resize", "el", "--nodes", "4")[0] == 0
    wait_for(lambda: _of(_events(job_dir, 3), "batch", size=3), timeout_s=60)

    done = wait_for(lambda: (j := job_state(cli, job_id))["state"] in
                    ("succeeded", "failed") and j, timeout_s=120)
    assert done["state"] == "succeeded", done["message"]
    assert done["nodes"] == [0, 2, 3] and done["message"] == lost
    assert pause["worker"] == 1

    # The survivors went on from the last commit: none lost.
    survivors = _events(job_dir, 0)
    first_reset = next(i for i, e in enumerate(survivors) if e["event"] == "reset")
    last_commit = max(e["commits"] for e in survivors[:first_reset] if e["event"] == "commit")
    assert survivors[first_reset]["commits"] == last_commit
    assert _of(survivors, "batch", size=2)[0]["commits"] == last_commit

    # Every sample was trained on exactly once within each epoch (the committed batches).
    epochs = _of(survivors, "epoch")
    assert [e["epoch"] for e in epochs] == [0, 1, 2, 3]
    for epoch in epochs:
        assert sorted(epoch["trained"]) == list(range(SAMPLES))

    # The result is an uninterrupted run's (one process taking the same global batches).
    finals = [_of(_events(job_dir, w), "done") for w in (0, 2, 3)]
    assert all(len(f) == 1 for f in finals)
    assert len({json.dumps(f[0]["weight"]) for f in finals}) == 1
    reference = subprocess.run([sys.executable, str(SCRIPT)], cwd=tmp_path, capture_output=True,
                               text=True, timeout=120,
                               env={k: v for k, v in os.environ.items()
                                    if not k.startswith(("HOROVOD_", "RINGTRAIN_"))})
    assert reference.returncode == 0, reference.stderr
    expected = json.loads(reference.stdout.splitlines()[-1])
    got = finals[0][0]
    for value, want in zip(got["weight"] + [got["bias"]], expected["weight"] + [expected["bias"]]):
        assert value == pytest.approx(want, abs=1e-5)
