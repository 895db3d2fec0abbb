"""The shared-memory collectives, member by member: every op, dtype and reduction against the
same computation done locally, with slots small enough that each tensor takes several steps.

The members are threads of this process, each with its own mapping of one real segment under a
temporary directory; the segment code does not know the difference from processes.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest
import torch

from ringtrain.backends.shm import ShmGroup
from ringtrain.backends.shm_segment import (
    Member,
    Segment,
    SharedMemoryError,
    SharedMemorySpaceError,
    check_space,
    choose_slot_bytes,
    segment_bytes,
)
from ringtrain.op_types import ReduceOp

_SLOT = 256  # bytes: a 1000-element float32 tensor takes 16 steps
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool)
_OPS = (ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT)


def _segments(tmp_path: Path, n: int, members=None, slot: int = _SLOT) -> list[Segment]:
    members = members or [Member(r, os.getpid(), -1) for r in range(n)]
    path = tmp_path / "seg"
    out: list[Segment | None] = [None] * n

    def setup(i: int) -> None:
        seg = (Segment.create(path, members, slot, 10) if i == 0 else
               Segment.attach(path, members, i, slot, 10, 10))
        seg.mark_attached()
        if i == 0:
            seg.wait_attached()
            seg.unlink()
        out[i] = seg

    _together(n, setup)
    assert not path.exists()  # unlinked once every member mapped it
    return out  # type: ignore[return-value]


def _together(n: int, fn) -> list:
    results: list = [None] * n
    errors: list = []

    def run(i: int) -> None:
        try:
            results[i] = fn(i)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a member hung"
    if errors:
        raise errors[0]
    return results


def _input(dtype: torch.dtype, member: int, length: int = 1000) -> torch.Tensor:
    if dtype is torch.bool:
        return torch.arange(length) % (member + 2) == 0
    return (torch.arange(length) % 5 + member + 1).to(dtype)


def _expected(dtype: torch.dtype, op: ReduceOp, n: int, length: int = 1000) -> torch.Tensor:
    inputs = [_input(dtype, i, length) for i in range(n)]
    if dtype is torch.bool:
        out = inputs[0]
        for x in inputs[1:]:
            out = out | x if op in (ReduceOp.SUM, ReduceOp.MAX) else out & x
        return out
    combine = {ReduceOp.SUM: torch.add, ReduceOp.MIN: torch.minimum,
               ReduceOp.MAX: torch.maximum, ReduceOp.PRODUCT: torch.mul}[op]
    out = inputs[0]
    for x in inputs[1:]:
        out = combine(out, x)
    return out


# 1000 elements take several steps of reduce-scatter and all-gather; 7 fit one slot in every
# dtype and take the one-wait path where each member reduces all slots.
@pytest.mark.parametrize("length", [1000, 7])
@pytest.mark.parametrize("n", [2, 3])
def test_allreduce_every_dtype_and_op_matches_a_local_reduction(tmp_path, n, length):
    groups = [ShmGroup(s) for s in _segments(tmp_path, n)]

    def work(i: int) -> dict:
        out = {}
        for dtype in _DTYPES:
            for op in _OPS:
                t = _input(dtype, i, length)
                groups[i].allreduce_(t, op)
                out[dtype, op] = t
        return out

    results = _together(n, work)
    for dtype in _DTYPES:
        for op in _OPS:
            want = _expected(dtype, op, n, length)
            for i in range(n):
                assert torch.equal(results[i][dtype, op], want), (dtype, op, i)


# Lengths that start, end and straddle steps of 64 float32 elements (the 256-byte slot), some
# inside one member's part of a step, some 2-D: every piece is a whole tensor or a slice of one.
_LIST_SHAPES = [(3,), (64,), (5, 7), (1,), (130,), (2, 32), (61,), (200,)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool])
@pytest.mark.parametrize("n", [2, 3])
def test_allreduce_of_a_list_matches_one_of_each_tensor(tmp_path, n, dtype):
    groups = [ShmGroup(s) for s in _segments(tmp_path, n)]
    total = sum(torch.Size(shape).numel() for shape in _LIST_SHAPES)

    def pieces(i: int) -> list[torch.Tensor]:
        flat = _input(dtype, i, total)
        return [p.reshape(shape) for p, shape in zip(
            flat.split([torch.Size(s).numel() for s in _LIST_SHAPES]), _LIST_SHAPES)]

    def work(i: int) -> dict:
        out = {}
        for op in (ReduceOp.SUM, ReduceOp.MAX):
            tensors = [p.clone() for p in pieces(i)]
            groups[i].allreduce_list_(tensors, op)
            out[op] = tensors
        return out

    results = _together(n, work)
    for op in (ReduceOp.SUM, ReduceOp.MAX):
        want = _expected(dtype, op, n, total)
        for i in range(n):
            got = torch.cat([t.reshape(-1) for t in results[i][op]])
            assert torch.equal(got, want), (op, i)
            assert [tuple(t.shape) for t in results[i][op]] == _LIST_SHAPES


@pytest.mark.parametrize("n, phases", [(2, [1, 3]), (3, [1, 2, 3])])
def test_a_few_hundred_kib_take_one_wait_among_few_members(tmp_path, n, phases):
    # 48 Ki elements in slots of 1 MiB: 192 KiB of float32, which two members reduce in one
    # wait (each reads 384 KiB) and three in two (576 KiB); float16 (96 KiB) takes one wait
    # either way, int64 (384 KiB) two.
    length = 48 << 10
    groups = [ShmGroup(s) for s in _segments(tmp_path, n, slot=1 << 20)]
    published: list[list[int]] = [[] for _ in range(n)]
    for i, group in enumerate(groups):
        publish = group.segment.publish
        group.segment.publish = (  # type: ignore[method-assign]
            lambda step, phase, _i=i, _publish=publish: (published[_i].append(phase),
                                                         _publish(step, phase))[1])
    cases = [(dtype, op) for dtype in (torch.float32, torch.float16, torch.int64)
             for op in _OPS]

    def work(i: int) -> dict:
        out = {}
        for dtype, op in cases:
            t = _input(dtype, i, length)
            groups[i].allreduce_(t, op)
            out[dtype, op] = t
        return out

    results = _together(n, work)
    for dtype, op in cases:
        want = _expected(dtype, op, n, length)
        for i in range(n):
            assert torch.equal(results[i][dtype, op], want), (dtype, op, i)
    assert published[0][:len(phases)] == phases


def test_half_precision_sums_in_fp32(tmp_path):
    # 2048 + 1 + 1 in fp16 step by step is 2048 (2049 is not representable); in fp32, 2050.
    groups = [ShmGroup(s) for s in _segments(tmp_path, 3)]

    def work(i: int) -> torch.Tensor:
        t = torch.tensor([2048.0 if i == 0 else 1.0] * 4, dtype=torch.float16)
        groups[i].allreduce_(t, ReduceOp.SUM)
        return t

    for t in _together(3, work):
        assert t.tolist() == [2050.0] * 4


def test_allgather_broadcast_reducescatter_alltoall(tmp_path):
    n = 3
    groups = [ShmGroup(s) for s in _segments(tmp_path, n)]

    def work(i: int) -> dict:
        g = groups[i]
        gathered = torch.empty(n * 500, dtype=torch.float64)
        g.allgather(gathered, torch.arange(500, dtype=torch.float64) + 1000 * i)
        bcast = torch.full((777,), float(i))
        g.broadcast_(bcast, 1)
        scattered = torch.empty(300, dtype=torch.int32)
        source = torch.arange(n * 300, dtype=torch.int32) * (i + 1)
        g.reducescatter(scattered, source, ReduceOp.SUM)
        sends = [(i + k + 1) * 40 for k in range(n)]
        recv = [(j + i + 1) * 40 for j in range(n)]
        rows = torch.cat([torch.full((sends[k], 3), float(100 * i + k)) for k in range(n)])
        exchanged = torch.empty(sum(recv), 3)
        g.alltoall(exchanged, rows, recv, sends)
        return gathered, bcast, scattered, source, exchanged

    results = _together(n, work)
    total = sum(torch.arange(n * 300, dtype=torch.int32) * (j + 1) for j in range(n))
    for i, (gathered, bcast, scattered, source, exchanged) in enumerate(results):
        assert torch.equal(gathered, torch.cat([torch.arange(500, dtype=torch.float64) + 1000 * j
                                                for j in range(n)]))
        assert torch.equal(bcast, torch.full((777,), 1.0))
        assert torch.equal(scattered, total[i * 300:(i + 1) * 300])
        assert torch.equal(source, torch.arange(n * 300, dtype=torch.int32) * (i + 1))  # kept
        recv = [(j + i + 1) * 40 for j in range(n)]
        assert torch.equal(exchanged, torch.cat([torch.full((recv[j], 3), float(100 * j + i))
                                                 for j in range(n)]))


def test_a_dead_member_fails_the_wait_naming_it(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    members = [Member(0, os.getpid(), -1), Member(7, gone.pid, -1)]
    # member 1's mapping is made by this thread, as if that process had mapped it, then died
    seg, _ = _segments(tmp_path, 2, members)
    with pytest.raises(SharedMemoryError, match=r"^rank 7 \(pid \d+\) died \(its process is "
                                                r"gone: it exited or was killed\) during a "
                                                r"shared-memory allreduce on rank 0$"):
        ShmGroup(seg).allreduce_(torch.ones(10), ReduceOp.SUM)


def test_a_member_that_gives_up_fails_the_others(tmp_path):
    seg0, seg1 = _segments(tmp_path, 2)
    seg1.abort()
    # Noticed at a check, not at the segment's timeout (whose error says "did not reach").
    with pytest.raises(SharedMemoryError, match=r"^rank 1 \(pid \d+\) gave up \(its own "
                                                r"collective failed\) during a shared-memory "
                                                r"allgather on rank 0$"):
        ShmGroup(seg0).allgather(torch.empty(20), torch.ones(10))
    seg1.close()
    seg0.close()


def test_space_error_names_the_size_and_the_switch(tmp_path):
    needed = segment_bytes(4, 1 << 20)
    check_space(tmp_path, needed)  # plenty here
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    with pytest.raises(SharedMemorySpaceError,
                       match=r"is too small for ringtrain's shared-memory segment: it needs "
                             r"[\d.]+ MiB .*RINGTRAIN_SHM=0 \(`ringtrain run --no-shm`\)"):
        check_space(tmp_path, free + (1 << 40))


@pytest.mark.parametrize(("members", "free_mib", "slot_mib"), [
    (2, 1 << 20, 16), (4, 1 << 20, 8), (8, 1 << 20, 4), (16, 1 << 20, 2), (64, 1 << 20, 1),
    (2, 64, 4),  # Docker's default /dev/shm: a quarter of it for the segment
    (2, 3, 1),  # too little for anything: the smallest slots, which check_space then refuses
])
def test_slots_grow_with_the_space_and_shrink_with_the_members(members, free_mib, slot_mib):
    slot = choose_slot_bytes(members, free_mib << 20)
    assert slot == slot_mib << 20
    if slot_mib > 1:
        assert 2 * members * slot <= min(64 << 20, (free_mib << 20) // 4)


def test_members_agree_on_the_step_they_time_fastest(tmp_path):
    segments = _segments(tmp_path, 2, slot=64 << 10)
    groups = [ShmGroup(seg) for seg in segments]
    chosen = _together(2, lambda i: groups[i].choose_step([1 << 10, 64 << 10]))
    assert chosen[0] == chosen[1] and chosen[0] in (1 << 10, 64 << 10)
    assert all(seg.step_bytes == chosen[0] for seg in segments)
    tensors = [torch.arange(50_000, dtype=torch.float32) * (i + 1) for i in range(2)]
    _together(2, lambda i: groups[i].allreduce_(tensors[i], ReduceOp.SUM))  # several steps
    for t in tensors:
        assert torch.equal(t, torch.arange(50_000, dtype=torch.float32) * 3)
    with pytest.raises(ValueError, match="does not fit"):
        segments[0].set_step_bytes(128 << 10)
    for g in groups:
        g.close()


def test_attach_fails_when_the_creator_never_creates(tmp_path):
    members = [Member(0, os.getpid(), -1), Member(1, os.getpid(), -1)]
    with pytest.raises(SharedMemoryError, match="did not create the shared-memory segment"):
        Segment.attach(tmp_path / "never", members, 1, _SLOT, 10, setup_timeout_s=0.2)


def test_no_member_leaves_before_every_member_arrived(tmp_path):
    # The engine forgets a round's bell once a collective of every rank is done: a broadcast's
    # root, or an empty tensor, must still wait for the others.
    seg0, seg1 = _segments(tmp_path, 2)
    g0, g1 = ShmGroup(seg0), ShmGroup(seg1)
    done = threading.Event()

    def root() -> None:
        g0.broadcast_(torch.ones(3), 0)
        g0.allreduce_(torch.empty(0), ReduceOp.SUM)
        done.set()

    thread = threading.Thread(target=root)
    thread.start()
    assert not done.wait(0.5)  # member 1 has not arrived
    g1.broadcast_(torch.zeros(3), 0)
    g1.allreduce_(torch.empty(0), ReduceOp.SUM)
    thread.join(10)
    assert done.is_set() and seg0.step == seg1.step
