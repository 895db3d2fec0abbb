"""Fused allreduce batches on shared memory: the tensors of a batch are copied straight into the
segment and back, with no fusion buffer, and give the same results as reducing each tensor on
its own (every dtype, reduction and scale, small and large tensors, a joined rank); a rank
killed in the middle of one fails its peer, naming it.

Each rank of a `World` is its own process. With ``RINGTRAIN_SHM=0`` the same tests run on Gloo,
where batches go through the fusion buffer, and check that instead.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

import ringtrain.torch as hvd
from ringtrain.backends.shm import ShmGroup
from ringtrain.backends.shm_segment import Segment
from ringtrain.torch import runtime
from tests.multiproc.world import World, outcome_of, rank_0_after_rank_1_died

_SHM = os.environ.get("RINGTRAIN_SHM") != "0"
_MIB = 1 << 20
#: (dtype, tensor sizes in elements, op, prescale, postscale): each line is one batch (the
#: engine fuses by dtype, op and scales). Past 64 KiB a batch goes in steps of the 1 MiB slot,
#: so the large ones cross slots and tensors straddle steps; one is past the 4 MiB that goes
#: alone through a fusion buffer.
_SPECS = [
    (torch.float32, (7, 300_001, 40_000, 1_100_000), "Sum", 0.5, 3.0),
    (torch.float32, (3, 1000, 200), "Average", 1.0, 1.0),
    (torch.float32, (0, 5, 0, 9), "Sum", 1.0, 1.0),
    (torch.float32, (10, 20_000), "Min", 1.0, 1.0),
    (torch.float32, (4, 30_000), "Product", 1.0, 1.0),
    (torch.float16, (5, 200_000, 3), "Sum", 1.0, 1.0),
    (torch.bfloat16, (100, 2000), "Average", 2.0, 0.25),
    (torch.bfloat16, (100, 90_000), "Sum", 1.0, 1.0),
    (torch.float64, (10, 20_000), "Max", 1.0, 1.0),
    (torch.int32, (6, 50_000), "Sum", 1.0, 1.0),
    (torch.int64, (3, 5), "Average", 1.0, 1.0),
    (torch.int16, (9, 40_000), "Max", 1.0, 1.0),
    (torch.uint8, (9, 700), "Sum", 1.0, 1.0),
    (torch.int8, (9, 700), "Min", 1.0, 1.0),
    (torch.bool, (13, 70_000), "Sum", 1.0, 1.0),
    (torch.bool, (13, 70), "Min", 1.0, 1.0),
]


def _inputs(rank: int) -> list[list[torch.Tensor]]:
    batches = []
    for i, (dtype, sizes, _, _, _) in enumerate(_SPECS):
        g = torch.Generator().manual_seed(1000 * rank + i)
        tensors = []
        for size in sizes:
            if dtype is torch.bool:
                x = torch.rand(size, generator=g) < 0.5
            elif dtype.is_floating_point:
                x = (torch.rand(size, generator=g) + 0.5).to(dtype)
            else:
                x = torch.randint(0, 10, (size,), generator=g).to(dtype)
            tensors.append(x)
        batches.append(tensors)
    return batches


def _fused_and_one_by_one() -> tuple[list, list]:
    """Every batch submitted as one unit of async allreduces (fused), then the same tensors
    reduced one at a time, each a collective of its own."""
    batches = _inputs(hvd.rank())
    engine = runtime.current().engine
    handles = []
    with engine.one_round():
        for i, ((_, _, op, pre, post), tensors) in enumerate(zip(_SPECS, batches)):
            for j, t in enumerate(tensors):
                handles.append(hvd.allreduce_async(
                    t, op=getattr(hvd, op), name=f"fused.{i}.{j}", prescale_factor=pre,
                    postscale_factor=post))
    fused = [hvd.synchronize(h) for h in handles]
    alone = []
    for i, ((_, _, op, pre, post), tensors) in enumerate(zip(_SPECS, batches)):
        for j, t in enumerate(tensors):
            alone.append(hvd.allreduce(t, op=getattr(hvd, op), name=f"alone.{i}.{j}",
                                       prescale_factor=pre, postscale_factor=post))
    return fused, alone


def test_a_fused_batch_gives_what_each_tensor_alone_gives(world):
    results = world.run(_fused_and_one_by_one, timeout=120)
    n = len(results)
    ops = [op for (_, sizes, op, _, _) in _SPECS for _ in sizes]
    reference = results[0][1]
    for rank, (fused, alone) in enumerate(results):
        assert len(fused) == len(alone) == len(ops)
        for k, (a, b, op) in enumerate(zip(fused, alone, ops)):
            assert a.dtype == b.dtype and a.shape == b.shape, (rank, k)
            # Every rank gets the same bits; with 2 ranks a + b is b + a, so fused and alone
            # agree exactly. With 3, floating-point sums and products may round differently
            # depending on which rank reduced which piece (Gloo: in which order, and fp16 on
            # Gloo adds in fp16): by an ulp or two.
            assert torch.equal(b, reference[k]), (rank, k)
            if n == 2 or not a.is_floating_point() or op in ("Min", "Max"):
                assert torch.equal(a, b), (rank, k, op, a, b)
            else:
                ulp = torch.finfo(a.dtype).eps
                assert torch.allclose(a.double(), b.double(), rtol=2 * ulp, atol=0), (rank, k)
    # and the reductions are the right ones (integers: exact)
    inputs = [_inputs(r) for r in range(n)]
    for i, (dtype, _, op, _, _) in enumerate(_SPECS):
        if dtype in (torch.int32, torch.int16) and op in ("Sum", "Max"):
            stack = [torch.stack([inputs[r][i][j] for r in range(n)]) for j in
                     range(len(inputs[0][i]))]
            start = sum(len(s[1]) for s in _SPECS[:i])
            for j, s in enumerate(stack):
                want = s.sum(0).to(dtype) if op == "Sum" else s.max(0).values
                assert torch.equal(results[0][0][start + j], want), (i, j)


def _joined_peers_fused(first: int) -> dict:
    """Rank ``first`` joins at once; the others reduce fused batches of integer-valued floats
    and integers (exact sums), large and small."""
    r = hvd.rank()
    out: dict = {}
    if r != first:
        batch = [torch.full((5,), r + 1.0), torch.arange(300_001, dtype=torch.float32) % 7 + r,
                 torch.full((1_100_000,), 2.0 * r)]
        ints = [torch.full((7,), r + 3, dtype=torch.int32),
                torch.full((80_000,), r, dtype=torch.int32)]
        small = [torch.full((3,), r + 1.0), torch.full((1000,), 3.0)]
        with runtime.current().engine.one_round():
            hs = [hvd.allreduce_async(t, op=hvd.Sum, name=f"join.f.{j}", prescale_factor=0.5,
                                      postscale_factor=2.0) for j, t in enumerate(batch)]
            hs += [hvd.allreduce_async(t, op=hvd.Sum, name=f"join.i.{j}")
                   for j, t in enumerate(ints)]
            hs += [hvd.allreduce_async(t, op=hvd.Average, name=f"join.a.{j}")
                   for j, t in enumerate(small)]
        out["results"] = [hvd.synchronize(h) for h in hs]
    out["last"] = hvd.join()
    return out


def test_a_joined_rank_adds_zeros_to_a_fused_batch(world):
    n = len(world.run(hvd.rank))
    first = n - 1
    results = world.run(_joined_peers_fused, first, timeout=60)
    live = [r for r in range(n) if r != first]
    batch = [sum(torch.full((5,), r + 1.0) for r in live),
             sum(torch.arange(300_001, dtype=torch.float32) % 7 + r for r in live),
             sum(torch.full((1_100_000,), 2.0 * r) for r in live)]
    ints = [sum(torch.full((7,), r + 3, dtype=torch.int32) for r in live),
            sum(torch.full((80_000,), r, dtype=torch.int32) for r in live)]
    small = [sum(torch.full((3,), r + 1.0) for r in live), sum(torch.full((1000,), 3.0)
                                                                for r in live)]
    # Horovod's Average with a joined rank: the sum of the live ranks over the set's size
    want = ([t * 0.5 * 2.0 for t in batch] + ints
            + [t.mul_(1.0 / n) for t in small])
    for r in live:
        got = results[r]["results"]
        assert len(got) == len(want)
        for k, (a, b) in enumerate(zip(got, want)):
            assert torch.equal(a, b), (r, k, a[:5], b[:5])
    assert all(out["last"] == results[0]["last"] for out in results)


def _timed_unit(path: str) -> None:
    """The same unit twice (the first fills the response cache), the second on the timeline:
    two large tensors and two small ones, all float32 Sum."""
    tensors = [torch.ones(_MIB + 3), torch.ones(5), torch.ones(2 * _MIB), torch.ones(1000)]
    for k in range(2):
        if k == 1:
            hvd.start_timeline(path)
        with runtime.current().engine.one_round():
            hs = [hvd.allreduce_async_(t, op=hvd.Sum, name=f"unit.{j}")
                  for j, t in enumerate(tensors)]
        for h in hs:
            hvd.synchronize(h)
    hvd.stop_timeline()


def test_a_batch_on_shared_memory_skips_the_fusion_buffer(world2, tmp_path):
    path = str(tmp_path / "timeline.json")
    world2.run(_timed_unit, path)
    with open(path) as f:
        events = json.load(f)
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = [(names[e["tid"]], e) for e in events if e.get("ph") == "X"]
    reduce_spans = [e for row, e in spans if row.startswith("unit.") and e["name"] == "ALLREDUCE"]
    copies = [e for row, e in spans if e["name"].startswith("MEMCPY_")]
    assert len(reduce_spans) == 4
    if _SHM:
        # one collective for all four (the 4 MiB and 8 MiB tensors too), straight from the
        # tensors into the segment: no fusion buffer
        assert {e["args"]["fused"] for e in reduce_spans} == {4}
        assert copies == []
        assert {"SHM_ALLREDUCE"} <= {e["name"] for _, e in spans}
    else:
        # on Gloo the tensors of 4 MiB and more go alone; the small ones through the buffer
        assert sorted(e["args"]["fused"] for e in reduce_spans) == [1, 1, 2, 2]
        assert {e["name"] for e in copies} == {"MEMCPY_IN_FUSION_BUFFER",
                                              "MEMCPY_OUT_FUSION_BUFFER"}


def _die_inside_a_fused_allreduce() -> str:
    """Rank 1 SIGKILLs itself inside a fused shared-memory allreduce, after reducing its piece
    of the first step but before telling the others; rank 0 reports what its operations
    raised."""
    if hvd.rank() == 1:
        fused = ShmGroup.allreduce_list_

        def dying(self, tensors, op):
            def publish(step, phase):
                if phase == 2:
                    os.kill(os.getpid(), signal.SIGKILL)
                Segment.publish(self.segment, step, phase)

            self.segment.publish = publish
            fused(self, tensors, op)

        ShmGroup.allreduce_list_ = dying  # type: ignore[method-assign]
    tensors = [torch.ones(300_000), torch.ones(5), torch.ones(1_200_000)]

    def fused_batch() -> None:
        with runtime.current().engine.one_round():
            hs = [hvd.allreduce_async_(t, name=f"fused.kill.{j}") for j, t in enumerate(tensors)]
        for h in hs:
            hvd.synchronize(h)

    return outcome_of(fused_batch)


@pytest.mark.skipif(not _SHM, reason="shared memory is off")
def test_a_rank_killed_inside_a_fused_allreduce_fails_its_peer():
    world = World(2)
    try:
        outcome = rank_0_after_rank_1_died(world, _die_inside_a_fused_allreduce)
    finally:
        world.close()
    assert outcome.startswith("HorovodInternalError: a collective failed on rank 0, because "
                              "rank 1 (host "), outcome
    assert " died (its process is gone: it exited or was killed): " in outcome, outcome
    assert "shared-memory allreduce" in outcome, outcome
