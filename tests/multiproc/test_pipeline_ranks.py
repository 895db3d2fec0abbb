"""The pipeline and the step profiler on 2 real Gloo ranks: elastic commits of the sampler, the
exposed allreduce wait, the timeline and the per-rank metrics files."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

import ringtrain.torch as hvd
from ringtrain.data.sharding import ShardedSampler
from ringtrain.torch.step_profiler import PHASES, StepProfiler
from tests.waiting import wait_until


def _elastic_sampler_round_trip() -> dict:
    sampler = ShardedSampler(range(40), 4, last_batch="pad", seed=1)
    state = hvd.elastic.TorchState(sampler=sampler, epoch=0)
    first = list(sampler)
    sampler.record_batch(0, 4)
    state.commit()
    sampler.record_batch(1, 4)  # lost: not committed
    state.restore()
    after_restore = sorted(sampler.processed_indices)
    state.sync()
    return {"rank": sampler.rank, "replicas": sampler.num_replicas, "first": first,
            "restored": after_restore, "remaining": list(sampler)}


def test_sharded_sampler_commits_and_restores_in_torch_state(world2):
    a, b = world2.run(_elastic_sampler_round_trip)
    assert (a["rank"], b["rank"], a["replicas"]) == (0, 1, 2)
    assert not set(a["first"]) & set(b["first"])
    done = set(a["first"][:4]) | set(b["first"][:4])
    assert set(a["restored"]) == set(b["restored"]) == done
    assert sorted(a["remaining"] + b["remaining"]) == sorted(set(range(40)) - done)
    assert len(a["remaining"]) % 4 == 0


_SLOW_S = 0.05


def _profiled_training(folder: str, timeline: str) -> dict:
    hvd.start_timeline(timeline)
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 4)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    steps = iter(range(6))
    if hvd.rank() == 0:  # rank 0 says when it waits for the step's gradients
        synchronize = optimizer.synchronize

        def announced() -> None:
            (Path(folder) / f"waits.{next(steps)}").touch()
            synchronize()

        optimizer.synchronize = announced  # type: ignore[method-assign]
    profiler = StepProfiler(metrics_dir=folder)
    batches = [(torch.randn(8, 32), torch.randint(0, 4, (8,))) for _ in range(6)]
    for x, y in profiler.iterate(batches):
        with profiler.phase("forward_backward"):
            if hvd.rank() == 1:  # slow: rank 0 waits for its gradients all along
                waiting = Path(folder) / f"waits.{next(steps)}"
                wait_until(waiting.exists, "rank 0 waiting for the step's gradients")
                time.sleep(_SLOW_S)
            torch.nn.functional.cross_entropy(model(x), y).backward()
        profiler.optimizer_step(optimizer)
        optimizer.zero_grad()
    profiler.close()
    hvd.stop_timeline()
    return {**profiler.summary(), "records": list(profiler.records)}


def test_profiler_sees_the_exposed_wait_and_writes_metrics_and_timeline(world2, tmp_path):
    timelines = [str(tmp_path / f"timeline{r}.json") for r in range(2)]
    results = world2.run_ranks(_profiled_training, [(str(tmp_path), t) for t in timelines])
    r0, r1 = results
    # Rank 1 slept while rank 0 waited, in every step: no load makes either shorter.
    assert r0["communication_ms"] >= _SLOW_S * 1e3, r0
    assert r1["forward_backward_ms"] >= _SLOW_S * 1e3, r1
    for r in results:
        for record in r["records"]:
            phases = sum(record[f"{p}_ms"] for p in PHASES)
            assert phases == pytest.approx(record["step_ms"], abs=1e-3), record
    for rank in range(2):
        lines = (tmp_path / f"steps.rank{rank}.jsonl").read_text().splitlines()
        assert len(lines) == 6 and json.loads(lines[0])["rank"] == rank
    events = json.loads(Path(timelines[0]).read_text())
    names = {e["name"] for e in events if e.get("ph") == "X"}
    assert {"forward_backward", "communication", "optimizer", "data"} <= names
