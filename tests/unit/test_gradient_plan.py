"""The gradient recorder on a real one-process DistributedOptimizer (a child process: the
engine's world of one), and the plan file's round trip."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.torch.grad_bucket import Bucket
from ringtrain.torch.gradient_plan import GradientPlan, read_plan

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
import json, sys
from pathlib import Path
import torch
import ringtrain.torch as hvd
from ringtrain.torch.gradient_plan import GradientRecorder
from tests.clock import FakeClock

torch.manual_seed(0)
clock = FakeClock()

class Slow(torch.nn.Module):
    '''Backward of this layer takes 20 ms of the recorder's clock: what comes after it in
    backward is ready that much later.'''
    def forward(self, x):
        return SlowGrad.apply(x)

class SlowGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()
    @staticmethod
    def backward(ctx, g):
        clock.advance(0.02)
        return g

hvd.init()
model = torch.nn.Sequential(torch.nn.Linear(8, 100), Slow(), torch.nn.Linear(100, 100))
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
recorder = GradientRecorder(optimizer, Path(sys.argv[1]), clock=clock)
for _ in range(4):
    optimizer.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
recorder.write()
hvd.shutdown()
"""


def test_recorder_writes_bucket_bytes_and_when_backward_made_them(tmp_path):
    path = tmp_path / "gradients.rank0.json"
    subprocess.run([sys.executable, "-c", _SCRIPT, str(path)], check=True, timeout=120,
                   cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                        # every gradient a bucket of its own
                        "RINGTRAIN_BUCKET_BYTES": "1"})
    plan = read_plan(tmp_path)
    assert plan is not None and plan.device == "cpu" and plan.steps == 3
    # Linear(100, 100) then Linear(8, 100): weights and biases, each a bucket of its own.
    assert sorted(b.nbytes for b in plan.buckets) == [400, 400, 3200, 40_000]
    # Earliest ready first: the last layer's gradients come first in backward, 20 ms of the
    # slow layer's backward before the first layer's, which are ready at its end.
    assert {b.nbytes for b in plan.buckets[:2]} == {400, 40_000}
    offsets = [b.ready_before_end_ms for b in plan.buckets]
    assert offsets == pytest.approx([20.0, 20.0, 0.0, 0.0], abs=1e-6)


def test_plan_round_trip_and_refusal(tmp_path):
    plan = GradientPlan("cuda", [Bucket("b", 10, 1.5)], 7)
    assert GradientPlan.from_json(plan.to_json()) == plan
    assert read_plan(tmp_path) is None
    (tmp_path / "gradients.rank0.json").write_text(json.dumps({"buckets": []}))
    with pytest.raises(ValueError, match="not a gradient plan"):
        read_plan(tmp_path)
