"""CUDA tensors through NCCL (and the CPU/CUDA mismatch); skipped on machines without 2 GPUs."""

from __future__ import annotations

import pytest
import torch

import ringtrain.torch as hvd
from tests.multiproc.world import World

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2,
                                reason="needs 2 CUDA devices (NCCL wants one GPU per rank)")


def _cuda_collectives() -> dict:
    torch.cuda.set_device(hvd.local_rank())
    r = hvd.rank()
    dev = torch.device("cuda", hvd.local_rank())
    out = {}
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.int64, torch.int16):
        t = torch.full((1000,), r + 1, dtype=dtype, device=dev)
        got = hvd.allreduce(t, op=hvd.Sum, name=f"cuda.ar.{dtype}")
        out[f"ar.{dtype}"] = (got.device.type, got.float().mean().item())
    fused = [hvd.allreduce_async_(torch.full((10,), float(r), device=dev), op=hvd.Sum,
                                  name=f"cuda.fused.{i}") for i in range(20)]
    out["fused"] = [hvd.synchronize(h).sum().item() for h in fused]
    out["ag"] = hvd.allgather(torch.full((r + 1,), r, device=dev)).tolist()
    out["bc"] = hvd.broadcast(torch.full((3,), r, device=dev), root_rank=1).tolist()
    model = torch.nn.Linear(4, 2).to(dev)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.randn(8, 4, device=dev)).sum().backward()
    opt.step()
    spread = hvd.allreduce(model.weight.detach(), op=hvd.Max) - model.weight.detach()
    out["params_spread"] = spread.abs().max().item()
    return out


def test_collectives_on_cuda_tensors_use_nccl():
    world = World(2)
    try:
        for _r, out in enumerate(world.run(_cuda_collectives, timeout=180)):
            for dtype in ("float16", "bfloat16", "float32", "int64", "int16"):
                device, mean = out[f"ar.torch.{dtype}"]
                assert device == "cuda" and mean == pytest.approx(3.0)
            assert out["fused"] == [10.0] * 20
            assert out["ag"] == [0, 1, 1]
            assert out["bc"] == [1, 1, 1]
            assert out["params_spread"] == 0.0
    finally:
        world.close()


def _mixed_devices() -> str:
    device = "cuda" if hvd.rank() == 0 else "cpu"
    try:
        hvd.allreduce(torch.ones(2, device=device), name="mixed")
        return "no error"
    except RuntimeError as exc:
        return str(exc)


def test_cpu_on_one_rank_and_cuda_on_another_is_an_error():
    world = World(2)
    try:
        for message in world.run(_mixed_devices, timeout=120):
            assert "device" in message and "mixed" in message
    finally:
        world.close()
