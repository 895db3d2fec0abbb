"""Elastic Keras end to end: `ringtrain run --min-np 1` with ``KerasState`` and its callbacks;
a worker is killed mid-epoch and the survivor goes on from the last commit."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

pytest.importorskip("ringtrain.keras")
from test_elastic_launch import Job, _discovery, _offer

SCRIPT = str(Path(__file__).resolve().parent / "keras_elastic_train.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_killed_keras_worker_is_survived_from_the_last_commit(tmp_path):
    _discovery(tmp_path, "localhost:2")
    job = Job(["-np", "2", "--min-np", "1", "--max-np", "2", "--reset-limit", "2",
               "--host-discovery-script", "./discover.sh", "--elastic-timeout", "60",
               sys.executable, SCRIPT], tmp_path,
              env={"RINGTRAIN_TEST_PAUSE": "1:1:3", "PYTHONPATH": str(ROOT)})
    try:
        job.wait_for(lambda e: e["event"] == "pause", timeout_s=180)
        os.kill(job.of("start", worker=1)[0]["pid"], signal.SIGKILL)
        _offer(tmp_path, "localhost:1")
        reset = job.wait_for(lambda e: e["event"] == "reset", timeout_s=120)
    finally:
        code, err = job.finish(timeout_s=240)
    assert code == 0, err
    # the survivor restored the last commit before the failure: epoch 1 after its batch 1
    # (commits every 2 batches, counted across epochs: batches 1, 3, 5, 7 of epoch 0, then the
    # epoch's end, then batch 1 of epoch 1)
    before = [e for e in job.events[:job.events.index(reset)]
              if e["event"] == "commit" and e["worker"] == 0]
    assert (before[-1]["epoch"], before[-1]["batch"]) == (1, 1)
    assert (reset["size"], reset["epoch"], reset["batch"]) == (1, 1, 1)
    # it trained the epochs left, alone, to the end
    after = [e for e in job.events[job.events.index(reset):] if e["event"] == "batch"]
    assert after and {e["size"] for e in after} == {1}
    assert {e["epoch"] for e in after} == {1, 2}
    done = job.of("done")
    assert [(e["worker"], e["size"], e["epoch"]) for e in done] == [(0, 1, 3)]
