"""Every collective × dtype × reduction on real 2- and 3-rank Gloo worlds, against references
computed locally from every rank's (deterministic) inputs."""

from __future__ import annotations

import torch

import ringtrain.torch as hvd

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.bool]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]


def _input(rank: int, dtype: torch.dtype, rows: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    if dtype is torch.bool:
        return torch.rand(rows, 4, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.rand(rows, 4, generator=g) * 2 + 0.5).to(dtype)
    return torch.randint(1, 4, (rows, 4), generator=g).to(dtype)


def _reference(inputs: list[torch.Tensor], op) -> torch.Tensor:
    dtype = inputs[0].dtype
    if dtype is torch.bool:
        stacked = torch.stack(inputs)
        return stacked.any(0) if op in (hvd.Sum, hvd.Max) else stacked.all(0)
    stacked = torch.stack([t.double() for t in inputs])
    if op is hvd.Sum:
        out = stacked.sum(0)
    elif op is hvd.Average:
        out = stacked.sum(0) / len(inputs)
        if not dtype.is_floating_point:
            out = out.trunc()
    elif op is hvd.Min:
        out = stacked.min(0).values
    elif op is hvd.Max:
        out = stacked.max(0).values
    else:
        out = stacked.prod(0)
    return out.to(dtype) if dtype.is_floating_point else out.to(torch.int64).to(dtype)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.is_floating_point:
        tol = 2e-2 if a.dtype in (torch.float16, torch.bfloat16) else 1e-6
        return torch.allclose(a.double(), b.double(), rtol=tol, atol=tol)
    return torch.equal(a, b)


def _allreduce_all() -> list[str]:
    n, r = hvd.size(), hvd.rank()
    failures = []
    for dtype in DTYPES:
        for op in OPS:
            if dtype is torch.bool and op is hvd.Average:
                continue
            expected = _reference([_input(i, dtype) for i in range(n)], op)
            mine = _input(r, dtype)
            sync = hvd.allreduce(mine, op=op, name=f"ar.{dtype}.{op}")
            inplace = mine.clone()
            hvd.allreduce_(inplace, op=op, name=f"ar_.{dtype}.{op}")
            handle = hvd.allreduce_async(mine, op=op, name=f"ara.{dtype}.{op}")
            asynced = hvd.synchronize(handle)
            for form, got in (("sync", sync), ("in-place", inplace), ("async", asynced)):
                if not _close(got, expected):
                    failures.append(f"{form} {dtype} {op}: {got.tolist()} != {expected.tolist()}")
            if not torch.equal(mine, _input(r, dtype)):
                failures.append(f"out-of-place allreduce modified its input ({dtype} {op})")
    return failures


def test_allreduce_every_dtype_and_op(world):
    for failures in world.run(_allreduce_all):
        assert failures == []


def _allgather_all() -> list[str]:
    n, r = hvd.size(), hvd.rank()
    failures = []
    for dtype in DTYPES:
        # ranks contribute different numbers of rows
        expected = torch.cat([_input(i, dtype, rows=i + 1) for i in range(n)])
        got = hvd.allgather(_input(r, dtype, rows=r + 1), name=f"ag.{dtype}")
        if not torch.equal(got, expected):
            failures.append(f"allgather {dtype}: {got.tolist()} != {expected.tolist()}")
        g1, g2 = hvd.grouped_allgather([_input(r, dtype, rows=r + 1), _input(r, dtype, rows=1)],
                                       name=f"gag.{dtype}")
        if not (torch.equal(g1, expected)
                and torch.equal(g2, torch.cat([_input(i, dtype, rows=1) for i in range(n)]))):
            failures.append(f"grouped allgather {dtype}")
    return failures


def test_allgather_uneven_first_dims(world):
    for failures in world.run(_allgather_all):
        assert failures == []


def _broadcast_all() -> list[str]:
    n, r = hvd.size(), hvd.rank()
    failures = []
    for root in range(n):
        for dtype in DTYPES:
            expected = _input(root, dtype)
            got = hvd.broadcast(_input(r, dtype), root_rank=root, name=f"bc.{root}.{dtype}")
            t = _input(r, dtype)
            hvd.broadcast_(t, root_rank=root, name=f"bc_.{root}.{dtype}")
            if not (torch.equal(got, expected) and torch.equal(t, expected)):
                failures.append(f"broadcast root {root} {dtype}")
    return failures


def test_broadcast_every_root_and_dtype(world):
    for failures in world.run(_broadcast_all):
        assert failures == []


def _alltoall_all() -> list:
    n, r = hvd.size(), hvd.rank()
    failures = []
    for dtype in DTYPES:
        # rank i sends (j + 1) rows to rank j, each row tagged with sender and receiver
        splits = [j + 1 for j in range(n)]
        rows = torch.cat([torch.full((j + 1, 2), 10 * r + j) for j in range(n)]).to(dtype)
        out, received = hvd.alltoall(rows, splits=splits, name=f"a2a.{dtype}")
        expected = torch.cat([torch.full((r + 1, 2), 10 * i + r) for i in range(n)]).to(dtype)
        if not torch.equal(out, expected) or received.tolist() != [r + 1] * n:
            failures.append(f"alltoall {dtype}: {out.tolist()} splits {received.tolist()}")
        even = hvd.alltoall(torch.arange(2 * n).to(dtype), name=f"a2a.even.{dtype}")
        expected_even = torch.tensor([2 * r, 2 * r + 1] * n).to(dtype)
        if not torch.equal(even, expected_even):
            failures.append(f"even alltoall {dtype}: {even.tolist()}")
    return failures


def test_alltoall_with_and_without_splits(world):
    for failures in world.run(_alltoall_all):
        assert failures == []


def _reducescatter_all() -> list[str]:
    n, r = hvd.size(), hvd.rank()
    failures = []
    for dtype in DTYPES:
        for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max):
            if dtype is torch.bool and op is hvd.Average:
                continue
            rows = 2 * n + 1  # uneven: the first rank gets one more row
            full = _reference([_input(i, dtype, rows=rows) for i in range(n)], op)
            sizes = [rows // n + (1 if i < rows % n else 0) for i in range(n)]
            start = sum(sizes[:r])
            expected = full[start:start + sizes[r]]
            got = hvd.reducescatter(_input(r, dtype, rows=rows), op=op, name=f"rs.{dtype}.{op}")
            if not _close(got, expected):
                failures.append(f"reducescatter {dtype} {op}: {got.tolist()} != "
                                f"{expected.tolist()}")
    return failures


def test_reducescatter_uneven_rows(world):
    for failures in world.run(_reducescatter_all):
        assert failures == []


def _scaled_and_grouped() -> list[str]:
    n, r = hvd.size(), hvd.rank()
    failures = []
    x = torch.full((5,), float(r + 1))
    total = sum(range(1, n + 1))
    got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5, name="scaled")
    if not torch.allclose(got, torch.full((5,), float(total))):
        failures.append(f"pre/postscale: {got}")
    if not torch.allclose(hvd.allreduce(x, average=True, name="legacy"),
                          torch.full((5,), total / n)):
        failures.append("average=True")
    outs = hvd.grouped_allreduce([x, torch.ones(2, 2) * r], op=hvd.Sum, name="grouped")
    if not (torch.allclose(outs[0], torch.full((5,), float(total)))
            and torch.allclose(outs[1], torch.full((2, 2), float(sum(range(n)))))):
        failures.append(f"grouped: {outs}")
    ts = [torch.ones(3) * r, torch.ones(1) * r]
    hvd.grouped_allreduce_(ts, op=hvd.Max, name="grouped_")
    if not all(torch.equal(t, torch.full_like(t, n - 1)) for t in ts):
        failures.append(f"grouped in place: {ts}")
    rs = hvd.grouped_reducescatter([torch.ones(n * 2) * r, torch.ones(n)], op=hvd.Sum,
                                   name="grs")
    if not (torch.equal(rs[0], torch.full((2,), float(sum(range(n)))))
            and torch.equal(rs[1], torch.full((1,), float(n)))):
        failures.append(f"grouped reducescatter: {rs}")
    nc = torch.arange(12.0).reshape(3, 4).t()  # non-contiguous, in place
    hvd.allreduce_(nc, op=hvd.Sum, name="noncontig")
    if not torch.equal(nc, torch.arange(12.0).reshape(3, 4).t() * n):
        failures.append("non-contiguous in-place allreduce")
    return failures


def test_scale_factors_grouped_and_non_contiguous(world):
    for failures in world.run(_scaled_and_grouped):
        assert failures == []


def _out_of_order() -> list[float]:
    r = hvd.rank()
    names = [f"ooo.{i}" for i in range(40)]
    order = names if r % 2 == 0 else names[::-1]
    handles = {name: hvd.allreduce_async(torch.full((7,), float(int(name.split('.')[1]))),
                                         name=name, op=hvd.Sum) for name in order}
    assert all(isinstance(hvd.poll(h), bool) for h in handles.values())
    return [hvd.synchronize(handles[name])[0].item() for name in names]


def test_async_submission_in_different_orders(world):
    for result in world.run(_out_of_order):
        assert result == [float(i * world.size) for i in range(40)]


def _adasum() -> list[float]:
    # orthogonal vectors add under Adasum, identical ones average
    r = hvd.rank()
    ortho = torch.zeros(hvd.size())
    ortho[r] = 1.0
    same = torch.full((3,), 2.0)
    return (hvd.allreduce(ortho, op=hvd.Adasum, name="adasum.ortho").tolist()
            + hvd.allreduce(same, op=hvd.Adasum, name="adasum.same").tolist())


def test_adasum_adds_orthogonal_and_averages_parallel(world):
    for result in world.run(_adasum):
        assert result == [1.0] * world.size + [2.0] * 3
