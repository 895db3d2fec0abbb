"""Elastic `ringtrain run` whose world shrinks to a single rank: it must keep training.

A world of 2 loses worker 1 mid-step (SIGKILL while worker 0 waits in that step's gradient
allreduce); worker 0 restores the last commit and goes on alone, in a world of size 1 where
``DistributedOptimizer`` reduces nothing, and, when the discovery script offers the slot again,
in a world of 2 once more. Either way the job ends as an uninterrupted run would.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import elastic_train
import pytest
from test_elastic_launch import SCRIPT, Job, _discovery, _offer, one_process_result

STEPS = elastic_train.EPOCHS * elastic_train.SAMPLES // elastic_train.GLOBAL_BATCH
# worker 1 of the first world (of 2) stops in epoch 0's third batch, after one commit
PAUSE = {"RINGTRAIN_TEST_PAUSE": "1:0:2", "RINGTRAIN_TEST_PAUSE_SIZE": "2"}


def _kill_the_paused_worker(job: Job) -> None:
    job.wait_for(lambda e: e["event"] == "pause")
    os.kill(job.of("start", worker=1)[0]["pid"], signal.SIGKILL)


def _assert_trained_like_one_process(job: Job, workers: list[int]) -> None:
    """Every epoch trained each sample once (as far as the commits go) and every worker left
    ends with the weights of one process that trained on the whole batches."""
    epochs = job.of("epoch")
    assert [e["epoch"] for e in epochs] == list(range(elastic_train.EPOCHS))
    for epoch in epochs:
        assert sorted(epoch["trained"]) == list(range(elastic_train.SAMPLES))
    done = job.of("done")
    assert sorted(e["worker"] for e in done) == workers
    assert len({json.dumps([e["weight"], e["bias"]]) for e in done}) == 1
    expected = one_process_result()
    for got, want in zip(done[0]["weight"] + [done[0]["bias"]],
                         expected["weight"] + [expected["bias"]]):
        assert got == pytest.approx(want, abs=1e-5)


def test_a_world_shrunk_to_one_rank_trains_to_the_end(tmp_path):
    job = Job(["-np", "2", "--min-np", "1", "--max-np", "2", "-H", "localhost:2",
               sys.executable, SCRIPT], tmp_path, env=PAUSE)
    try:
        _kill_the_paused_worker(job)
    finally:
        code, err = job.finish()
    assert code == 0, err
    [reset] = job.of("reset")
    assert (reset["worker"], reset["size"], reset["commits"]) == (0, 1, 1)
    before, after = job.events[:job.events.index(reset)], job.events[job.events.index(reset):]
    # The steps of the last commit before the failure count, the failed one does not: with the
    # steps trained alone that makes the steps of an uninterrupted run.
    committed = [e for e in before if e["event"] == "batch" and e["worker"] == 0
                 and e["commits"] < reset["commits"]]
    alone = [e for e in after if e["event"] == "batch"]
    assert {(e["worker"], e["size"]) for e in alone} == {(0, 1)}
    assert len(committed) + len(alone) == STEPS
    _assert_trained_like_one_process(job, workers=[0])


@pytest.mark.slow  # ~30 s: both worlds of 2 train at the script's pace
def test_a_world_of_one_rank_grows_back_to_two(tmp_path):
    _discovery(tmp_path, "localhost:2")
    job = Job(["-np", "2", "--min-np", "1", "--max-np", "2", "--reset-limit", "3",
               "--host-discovery-script", "./discover.sh", "--elastic-timeout", "60",
               sys.executable, SCRIPT], tmp_path,
              env={**PAUSE, "RINGTRAIN_TEST_PACE_ONE": "1"})
    try:
        _kill_the_paused_worker(job)
        _offer(tmp_path, "localhost:1")
        job.wait_for(lambda e: e["event"] == "batch" and e["size"] == 1)
        _offer(tmp_path, "localhost:2")  # the slot comes back: a new worker joins at a commit
        job.wait_for(lambda e: e["event"] == "batch" and e["size"] == 2 and e["worker"] == 2)
    finally:
        code, err = job.finish()
    assert code == 0, err
    assert [(e["worker"], e["size"]) for e in job.of("reset")] == [(0, 1), (0, 2)]
    _assert_trained_like_one_process(job, workers=[0, 2])
