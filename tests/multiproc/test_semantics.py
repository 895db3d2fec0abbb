"""Errors, join, process sets, barrier, object helpers, autograd and re-initialisation on real
multi-rank worlds."""

from __future__ import annotations

import pytest
import torch

import ringtrain.torch as hvd
from tests.multiproc.world import WorkerError, World


def _mismatches() -> dict[str, str]:
    r = hvd.rank()
    cases = {
        "shape": lambda: hvd.allreduce(torch.ones(r + 1), name="mm.shape"),
        "dtype": lambda: hvd.allreduce(torch.ones(2, dtype=torch.float32 if r else torch.float64),
                                       name="mm.dtype"),
        "trailing": lambda: hvd.allgather(torch.ones(2, r + 1), name="mm.trailing"),
        "root": lambda: hvd.broadcast(torch.ones(2), root_rank=r, name="mm.root"),
        "op": lambda: hvd.allreduce(torch.ones(2), op=hvd.Sum if r else hvd.Max, name="mm.op"),
    }
    messages = {}
    for case, call in cases.items():
        try:
            call()
            messages[case] = "no error"
        except RuntimeError as exc:
            messages[case] = str(exc)
        # the job stays usable: the next collective works
        ok = hvd.allreduce(torch.ones(1), op=hvd.Sum, name=f"after.{case}")
        assert ok.item() == hvd.size(), f"collective after {case} mismatch failed"
    return messages


def test_mismatches_fail_on_every_rank_and_name_the_tensor(world):
    for messages in world.run(_mismatches):
        assert "mm.shape" in messages["shape"] and "shape" in messages["shape"]
        assert "rank 0: [1]" in messages["shape"] and "rank 1: [2]" in messages["shape"]
        assert "dtype" in messages["dtype"] and "float64" in messages["dtype"]
        assert "trailing dimensions" in messages["trailing"]
        assert "root rank" in messages["root"]
        assert "reduction op" in messages["op"]


def _duplicate_name() -> str:
    # A name leaves the in-flight set once every rank has run it, so each rank repeats a name
    # its peer has not submitted yet: rank 0 checks "dup" before releasing rank 1 through "go",
    # rank 1 checks "dup2" before releasing rank 0 through "go2".
    mine, theirs = ("dup", "dup2") if hvd.rank() == 0 else ("dup2", "dup")
    if hvd.rank() == 1:
        hvd.allreduce(torch.ones(1), name="go")
    handle = hvd.allreduce_async(torch.ones(1), name=mine)
    try:
        hvd.allreduce_async(torch.ones(1), name=mine)
        message = "no error"
    except ValueError as exc:
        message = str(exc)
    if hvd.rank() == 0:
        hvd.allreduce(torch.ones(1), name="go")
    hvd.allreduce(torch.ones(1), name="go2")
    other = hvd.allreduce_async(torch.ones(1), name=theirs)
    hvd.synchronize(handle)
    hvd.synchronize(other)
    return message


def test_same_name_twice_in_flight_is_a_value_error(world2):
    for rank, message in enumerate(world2.run(_duplicate_name)):
        assert "already in flight" in message and ("dup" if rank == 0 else "dup2") in message


def _one_name_changing_tensors() -> tuple[list, int]:
    """One name submitted with tensors and arguments that change, each twice (the second time
    from the response cache); then unnamed operations, each under a name of its own."""
    from ringtrain.torch import runtime

    r = hvd.rank() + 1
    cases = [(torch.ones(2), hvd.Sum, 1.0), (torch.ones(3), hvd.Sum, 1.0),
             (torch.ones(3, dtype=torch.float64), hvd.Sum, 1.0), (torch.ones(3), hvd.Sum, 2.0),
             (torch.ones(3), hvd.Max, 1.0), (torch.ones(2, 2), hvd.Sum, 1.0)]
    results = []
    for tensor, op, prescale in cases:
        for _ in range(2):
            out = hvd.allreduce(tensor * r, name="same", op=op, prescale_factor=prescale)
            results.append((list(out.shape), str(out.dtype), out.flatten().tolist()))
    kept = runtime.METAS_KEPT
    runtime.METAS_KEPT = len(runtime.current().metas) + 3
    try:
        for _ in range(10):
            hvd.allreduce(torch.ones(1), op=hvd.Sum)
        same = hvd.allreduce(torch.ones(2), name="same", op=hvd.Sum)  # a known name, described
        over = len(runtime.current().metas) - runtime.METAS_KEPT
    finally:
        runtime.METAS_KEPT = kept
    try:  # rank 0's tensor grows where the others' does not: a mismatch, as on first use
        hvd.allreduce(torch.ones(2 if hvd.rank() else 3), name="same", op=hvd.Sum)
        mismatch = "no error"
    except RuntimeError as exc:
        mismatch = str(exc)
    return results + [same.tolist(), mismatch], over


def test_a_name_resubmitted_with_other_tensors_or_arguments_is_described_anew(world):
    n = world.size
    total = n * (n + 1) // 2
    expected = [([2], "torch.float32", [total] * 2), ([3], "torch.float32", [total] * 3),
                ([3], "torch.float64", [total] * 3), ([3], "torch.float32", [2 * total] * 3),
                ([3], "torch.float32", [n] * 3), ([2, 2], "torch.float32", [total] * 4)]
    for results, over in world.run(_one_name_changing_tensors):
        *reduced, same, mismatch = results
        assert reduced == [case for case in expected for _ in range(2)]
        assert same == [float(n)] * 2
        assert "same" in mismatch and "rank 0: [3]" in mismatch and "rank 1: [2]" in mismatch
        assert over <= 0  # the metas a runtime keeps stay within METAS_KEPT


def _bad_arguments() -> list[str]:
    errors = []
    for call in (lambda: hvd.allreduce(torch.ones(2), op=hvd.Sum, average=True),
                 lambda: hvd.allreduce(torch.ones(2, dtype=torch.bool)),
                 lambda: hvd.broadcast(torch.ones(2), root_rank=99),
                 lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64)),
                 lambda: hvd.alltoall(torch.ones(5), splits=[1, 1]),
                 lambda: hvd.allreduce(torch.ones(2, device="meta")),
                 lambda: hvd.allreduce(torch.ones(2).to_sparse()),
                 lambda: hvd.allreduce_([1.0, 2.0]),
                 lambda: hvd.broadcast(torch.ones(2).to_sparse(), root_rank=0),
                 lambda: hvd.allgather(torch.ones(2, device="meta"))):
        try:
            call()
            errors.append("no error")
        except ValueError as exc:
            errors.append(str(exc))
    return errors


def test_bad_arguments_are_refused_before_queueing(world2):
    for errors in world2.run(_bad_arguments):
        assert "no error" not in errors
        assert "either op= or" in errors[0]
        assert "boolean" in errors[1]
        assert "root_rank" in errors[2]
        assert "complex64" in errors[3]
        assert "splits" in errors[4]
        assert "tensors on meta are not supported" in errors[5]
        assert "needs a dense tensor" in errors[6]
        assert "expects torch.Tensor arguments, got list" in errors[7]
        assert "broadcast needs a dense tensor" in errors[8]
        assert "allgather: tensors on meta are not supported" in errors[9]


def _join_uneven() -> tuple:
    r = hvd.rank()
    sums = []
    # rank r has r + 1 batches; a joined rank adds zeros, and averages divide by the size
    for step in range(r + 1):
        sums.append(hvd.allreduce(torch.tensor([float(r + 1)]), name=f"join.step.{step}").item())
    last = hvd.join()
    return sums, last


def test_join_lets_ranks_with_more_data_go_on(world):
    n = world.size
    results = world.run(_join_uneven)
    for _r, (sums, last) in enumerate(results):
        assert last == n - 1
        for step, value in enumerate(sums):
            active = [i + 1 for i in range(n) if i >= step]
            assert value == pytest.approx(sum(active) / n)


def _process_sets() -> dict:
    r, n = hvd.rank(), hvd.size()
    evens = hvd.add_process_set([i for i in range(n) if i % 2 == 0])
    out = {"size": evens.size(), "rank": evens.rank(), "included": evens.included()}
    if evens.included():
        out["sum"] = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, name="ps.sum",
                                   process_set=evens).item()
        out["gather"] = hvd.allgather(torch.tensor([r]), name="ps.gather",
                                      process_set=evens).tolist()
        hvd.barrier(process_set=evens)
    else:
        try:
            hvd.allreduce(torch.ones(1), process_set=evens)
        except ValueError as exc:
            out["refused"] = str(exc)
    out["global"] = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="ps.global").item()
    try:
        hvd.add_process_set([i for i in range(n) if i % 2 == 0])
    except ValueError as exc:
        out["duplicate"] = str(exc)
    out["removed"] = hvd.remove_process_set(evens)
    return out


def test_process_sets_restrict_collectives(world):
    n = world.size
    evens = [i for i in range(n) if i % 2 == 0]
    for r, out in enumerate(world.run(_process_sets)):
        assert out["size"] == len(evens) and out["included"] == (r in evens)
        assert out["global"] == n and out["removed"] is True
        assert "already registered" in out["duplicate"]
        if r in evens:
            assert out["sum"] == sum(evens) and out["gather"] == evens
            assert out["rank"] == evens.index(r)
        else:
            assert out["rank"] == -1 and "not a member" in out["refused"]


def _reducescatter_adasum() -> list[str]:
    refused = []
    for call in (lambda: hvd.reducescatter(torch.ones(4), op=hvd.Adasum),
                 lambda: hvd.reducescatter_async(torch.ones(4), op=hvd.Adasum),
                 lambda: hvd.grouped_reducescatter([torch.ones(4)], op=hvd.Adasum)):
        try:
            call()
            refused.append("no error")
        except hvd.HorovodInternalError as exc:  # Horovod's type (its core aborts the request)
            refused.append(f"{isinstance(exc, ValueError)}: {exc}")
    # refused before anything was queued: the job goes on
    refused.append(str(hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after.adasum").item()))
    return refused


def test_reducescatter_with_adasum_raises_horovods_error_type(world2):
    for refused in world2.run(_reducescatter_adasum):
        for message in refused[:3]:
            assert message.startswith("True: reducescatter does not support Adasum")
        assert refused[3] == "2.0"


def _objects() -> tuple:
    r = hvd.rank()
    obj = hvd.broadcast_object({"from": r, "t": torch.arange(3) * r}, root_rank=1)
    gathered = hvd.allgather_object(("rank", r))
    return obj["from"], obj["t"].tolist(), gathered


def test_broadcast_and_allgather_objects(world):
    for _r, (frm, t, gathered) in enumerate(world.run(_objects)):
        assert frm == 1 and t == [0, 1, 2]
        assert gathered == [("rank", i) for i in range(world.size)]


def _gradients() -> dict:
    r = hvd.rank()
    x = torch.full((2,), float(r + 1), requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum, name="grad.ar").sum().backward()
    ar = x.grad.tolist()
    with torch.no_grad():  # nothing to record: the same result, and x left as it was
        untracked = hvd.allreduce(x, op=hvd.Sum, name="grad.untracked")
        grouped = hvd.grouped_allreduce([x, x * 2], op=hvd.Sum, name="grad.untracked.group")
        copied = hvd.broadcast(x, root_rank=0, name="grad.untracked.bc")
    plain = (untracked.tolist(), untracked.requires_grad, x.tolist())
    plain_more = ([g.tolist() for g in grouped], [g.requires_grad for g in grouped],
                  copied.tolist(), copied.requires_grad)
    y = torch.full((r + 1,), float(r + 1), requires_grad=True)
    (hvd.allgather(y, name="grad.ag") * 2).sum().backward()
    ag = y.grad.tolist()
    z = torch.full((2,), float(r), requires_grad=True)
    hvd.broadcast(z, root_rank=0, name="grad.bc").sum().backward()
    bc = z.grad.tolist()
    return {"ar": ar, "ag": ag, "bc": bc, "plain": plain, "plain_more": plain_more}


def test_gradients_flow_through_synchronous_collectives(world):
    n = world.size
    for r, g in enumerate(world.run(_gradients)):
        assert g["ar"] == [float(n)] * 2  # d/dx of sum over ranks of allreduce-sum
        total = float(sum(range(1, n + 1)))
        assert g["plain"] == ([total] * 2, False, [float(r + 1)] * 2)
        assert g["plain_more"] == ([[total] * 2, [2 * total] * 2], [False, False], [1.0, 1.0],
                                   False)
        assert g["ag"] == [2.0] * (r + 1)  # averaged gradient, this rank's slice
        assert g["bc"] == ([1.0, 1.0] if r == 0 else [0.0, 0.0])


def _weights(rank: int, rows: int, cols: int = 2) -> torch.Tensor:
    """A loss weight per output element, different on every rank (so ranks' gradients differ)."""
    return torch.arange(rows * cols, dtype=torch.float64).reshape(rows, cols) + 10 * rank


def _scatter_rows(total: int, n: int) -> list[int]:
    return [total // n + (1 if i < total % n else 0) for i in range(n)]


def _reducescatter_gradients(op_name: str, prescale: float, postscale: float) -> dict:
    op, n, r = getattr(hvd, op_name), hvd.size(), hvd.rank()
    rows = 2 * n + 1  # uneven: rank 0 receives one more row
    x = torch.ones(rows, 2, dtype=torch.float64, requires_grad=True)
    y = torch.ones(n, 2, dtype=torch.float64, requires_grad=True)
    out = hvd.reducescatter(x, op=op, prescale_factor=prescale, postscale_factor=postscale,
                            name=f"rs.grad.{op_name}.{prescale}")
    (out * _weights(r, out.shape[0])).sum().backward()
    grouped = hvd.grouped_reducescatter([x, y], op=op, prescale_factor=prescale,
                                        postscale_factor=postscale,
                                        name=f"grs.grad.{op_name}.{prescale}")
    x_grad_single = x.grad.clone()
    x.grad = None
    sum((g * _weights(r, g.shape[0])).sum() for g in grouped).backward()
    return {"single": x_grad_single, "grouped": (x.grad, y.grad),
            "requires_grad": [g.requires_grad for g in grouped]}


@pytest.mark.parametrize("op_name, prescale, postscale", [
    ("Sum", 1.0, 1.0), ("Average", 1.0, 1.0), ("Sum", 2.0, 0.25), ("Average", 3.0, 0.5)])
def test_reducescatter_gradient_is_horovods_scaled_allgather(world, op_name, prescale,
                                                             postscale):
    # Horovod's HorovodReducescatter.backward: allgather of the output gradients, times the
    # member count for Sum, times the pre- and postscale factors.
    n = world.size
    scale = prescale * postscale * (n if op_name == "Sum" else 1)
    rows_x = _scatter_rows(2 * n + 1, n)
    gathered_x = torch.cat([_weights(i, rows_x[i]) for i in range(n)]) * scale
    gathered_y = torch.cat([_weights(i, 1) for i in range(n)]) * scale
    for result in world.run(_reducescatter_gradients, op_name, prescale, postscale):
        assert torch.equal(result["single"], gathered_x)
        assert torch.equal(result["grouped"][0], gathered_x)
        assert torch.equal(result["grouped"][1], gathered_y)
        assert result["requires_grad"] == [True, True]


def _grouped_allgather_gradients() -> dict:
    r = hvd.rank()
    a = torch.ones(r + 1, 2, dtype=torch.float64, requires_grad=True)  # rows differ per rank
    b = torch.ones(2, 2, dtype=torch.float64, requires_grad=True)
    ga, gb = hvd.grouped_allgather([a, b], name="gag.grad")
    ((ga * _weights(r, ga.shape[0])).sum() + (gb * _weights(r, gb.shape[0])).sum()).backward()
    return {"a": a.grad, "b": b.grad, "requires_grad": [ga.requires_grad, gb.requires_grad]}


def test_grouped_allgather_gradient_is_this_ranks_rows_of_the_averaged_gradient(world):
    # Horovod's HorovodGroupedAllgather.backward: grouped allreduce (Average) of the output
    # gradients, then each input's own rows.
    n = world.size
    rows_a = n * (n + 1) // 2
    mean_a = sum(_weights(i, rows_a) for i in range(n)) / n
    mean_b = sum(_weights(i, 2 * n) for i in range(n)) / n
    for r, result in enumerate(world.run(_grouped_allgather_gradients)):
        start_a = r * (r + 1) // 2
        assert torch.allclose(result["a"], mean_a[start_a:start_a + r + 1])
        assert torch.allclose(result["b"], mean_b[2 * r:2 * r + 2])
        assert result["requires_grad"] == [True, True]


def _reinit() -> list[float]:
    first = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="reinit").item()
    hvd.shutdown()
    assert not hvd.is_initialized()
    hvd.init()
    second = hvd.allreduce(torch.ones(1) * 2, op=hvd.Sum, name="reinit").item()
    return [first, second, hvd.size(), hvd.local_size()]


def test_init_after_shutdown(world2):
    for result in world2.run(_reinit):
        assert result == [2.0, 4.0, 2, 2]


def _topology() -> tuple:
    return (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
            hvd.cross_size(), hvd.is_homogeneous(), hvd.gloo_enabled(), hvd.mpi_built())


def test_topology_and_build_probes(world):
    for r, t in enumerate(world.run(_topology)):
        assert t == (r, world.size, r, world.size, 0, 1, True, True, False)


def _after_peer_exit(rank_to_die: int) -> str:
    import os

    if hvd.rank() == rank_to_die:
        os._exit(0)
    try:
        hvd.allreduce(torch.ones(1), name="orphan")
        return "no error"
    except hvd.HorovodInternalError as exc:
        return str(exc)


def test_peer_exit_raises_horovod_internal_error_not_a_hang():
    world = World(2)
    try:
        with pytest.raises(WorkerError) as info:
            world.run(_after_peer_exit, 1, timeout=60)
    except TimeoutError:
        pytest.fail("a rank hung after its peer exited")
    finally:
        world.close()
    survivor = info.value.results[0]
    assert survivor.startswith("a collective failed on rank 0, because rank 1 (host "), survivor
    assert "died (its process is gone: it exited or was killed)" in survivor
