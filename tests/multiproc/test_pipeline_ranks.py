"""The pipeline and the step profiler on 2 real Gloo ranks: elastic commits of the sampler, the
exposed allreduce wait, the timeline and the per-rank metrics files."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

import ringtrain.torch as hvd
from ringtrain.data.sharding import ShardedSampler
from ringtrain.torch.step_profiler import StepProfiler


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


def _profiled_training(folder: str, timeline: str) -> dict:
    hvd.start_timeline(timeline)
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 4)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    profiler = StepProfiler(metrics_dir=folder)
    batches = [(torch.randn(8, 32), torch.randint(0, 4, (8,))) for _ in range(6)]
    t0 = time.perf_counter()
    for x, y in profiler.iterate(batches):
        with profiler.phase("forward_backward"):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            if hvd.rank() == 1:
                time.sleep(0.05)  # rank 0 then waits for rank 1's gradients
        profiler.optimizer_step(optimizer)
        optimizer.zero_grad()
    wall_ms = (time.perf_counter() - t0) / 6 * 1e3
    profiler.close()
    hvd.stop_timeline()
    return {**profiler.summary(), "wall_ms": wall_ms}


def test_profiler_sees_the_exposed_wait_and_writes_metrics_and_timeline(world2, tmp_path):
    timelines = [str(tmp_path / f"timeline{r}.json") for r in range(2)]
    results = world2.run_ranks(_profiled_training, [(str(tmp_path), t) for t in timelines])
    r0, r1 = results
    assert r0["communication_ms"] > 30, r0  # rank 0 waited for rank 1's sleep
    assert r1["forward_backward_ms"] > 45
    for r in results:
        assert abs(r["step_ms"] - r["wall_ms"]) < 0.05 * r["wall_ms"]
    for rank in range(2):
        lines = (tmp_path / f"steps.rank{rank}.jsonl").read_text().splitlines()
        assert len(lines) == 6 and json.loads(lines[0])["rank"] == rank
    events = json.loads(Path(timelines[0]).read_text())
    names = {e["name"] for e in events if e.get("ph") == "X"}
    assert {"forward_backward", "communication", "optimizer", "data"} <= names
