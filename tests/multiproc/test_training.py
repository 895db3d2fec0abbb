"""DistributedOptimizer, SyncBatchNorm, join and the timeline on real multi-rank worlds: N ranks
on batch b must train exactly like one process on the concatenated batch N·b."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

import ringtrain.torch as hvd


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batches(steps: int, per_rank: int, ranks: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(ranks * per_rank, 6, generator=g),
             torch.randint(0, 3, (ranks * per_rank,), generator=g)) for _ in range(steps)]


def _train(optimizer_name: str, distributed: bool, passes: int = 1, compression=None,
           num_groups: int = 0):
    """Train 4 steps of ``passes`` micro-batches each; returns the final parameters.

    Distributed, rank r takes its slice of every batch; alone, the whole batch.
    """
    ranks, r = hvd.size(), hvd.rank()
    model = _model()
    params = model.parameters()
    opt = (torch.optim.SGD(params, lr=0.1, momentum=0.9) if optimizer_name == "sgd"
           else torch.optim.Adam(params, lr=0.01))
    if distributed:
        kwargs = {"compression": compression} if compression else {}
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       backward_passes_per_step=passes, num_groups=num_groups,
                                       **kwargs)
    loss_fn = torch.nn.CrossEntropyLoss()
    for i, (x, y) in enumerate(_batches(4 * passes, 4, ranks)):
        micro = x.shape[0] // ranks
        if distributed:
            x, y = x[r * micro:(r + 1) * micro], y[r * micro:(r + 1) * micro]
        loss_fn(model(x), y).backward()
        if (i + 1) % passes == 0:
            opt.step()
            opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _equivalence(optimizer_name: str, passes: int = 1, compression=None, num_groups: int = 0):
    dist = _train(optimizer_name, True, passes, compression, num_groups)
    # one process on the concatenated batch: the mean loss over N·b equals the average of the
    # ranks' mean losses, so its gradient is the ranks' averaged gradient
    single = _train(optimizer_name, False, passes)
    return max((a - b).abs().max().item() for a, b in zip(dist, single))


@pytest.mark.parametrize("optimizer_name", ["sgd", "adam"])
def test_n_ranks_train_like_one_process_on_the_whole_batch(world, optimizer_name):
    for diff in world.run(_equivalence, optimizer_name):
        assert diff < 1e-5


def test_backward_passes_per_step_accumulates_locally(world2):
    for diff in world2.run(_equivalence, "sgd", 2):
        assert diff < 1e-5


def test_gradients_reduced_in_groups_train_like_one_process(world):
    for diff in world.run(_equivalence, "sgd", 1, None, 2):
        assert diff < 1e-5


def _used_and_spare():
    """Two layers in one bucket, with an optimizer over both; tests leave `spare` unused."""
    torch.manual_seed(0)
    used, spare = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    params = list(used.parameters()) + list(spare.parameters())
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(params, lr=1.0),
        named_parameters=[(f"p{i}", p) for i, p in enumerate(params)])
    return used, spare, params, opt


def _backward_twice() -> str | None:
    used, _, _, opt = _used_and_spare()
    # `spare` has no gradient, so the bucket is still held when the second backward comes
    used(torch.ones(1, 3)).sum().backward()
    try:
        used(torch.ones(1, 3)).sum().backward()
    except AssertionError as exc:
        message = str(exc)
    else:
        message = None
    opt.synchronize()
    return message


def test_a_second_backward_before_step_is_refused(world2):
    for message in world2.run(_backward_twice):
        assert message is not None and "backward_passes_per_step" in message


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_compressed_gradients_stay_close(world2, compression):
    comp = getattr(hvd.Compression, compression)
    for diff in world2.run(_equivalence, "sgd", 1, comp):
        assert 0 < diff < 2e-2  # lossy on the wire, but close


def _reduced_gradients(op: str, predivide: float, compression: str | None) -> list[float]:
    """Rank r's gradients are all r + 1; the distinct values of every reduced gradient."""
    model = _model()
    kwargs = {"compression": getattr(hvd.Compression, compression)} if compression else {}
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   op=getattr(hvd, op), gradient_predivide_factor=predivide,
                                   **kwargs)
    loss = sum(p.sum() for p in model.parameters()) * (hvd.rank() + 1)
    loss.backward()
    opt.synchronize()
    return sorted({round(v, 6) for p in model.parameters() for v in p.grad.flatten().tolist()})


@pytest.mark.parametrize(("op", "predivide", "compression", "expected"), [
    ("Average", 1.0, None, 1.5), ("Average", 2.0, None, 1.5), ("Average", 1.0, "fp16", 1.5),
    ("Sum", 1.0, None, 3.0)])
def test_reduced_gradients_follow_the_op(world2, op, predivide, compression, expected):
    for values in world2.run(_reduced_gradients, op, predivide, compression):
        assert values == [expected]


def _clip_and_amp() -> float:
    r, n = hvd.rank(), hvd.size()
    results = []
    for distributed in (True, False):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        if distributed:
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
        for x, y in _batches(3, 4, n):
            if distributed:
                x, y = x[r * 4:(r + 1) * 4], y[r * 4:(r + 1) * 4]
            loss = torch.nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            if distributed:
                opt.synchronize()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            if distributed:
                with opt.skip_synchronize():
                    scaler.step(opt)
            else:
                scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        results.append([p.detach().clone() for p in model.parameters()])
    return max((a - b).abs().max().item() for a, b in zip(*results))


def test_gradient_clipping_and_grad_scaler_with_skip_synchronize(world2):
    for diff in world2.run(_clip_and_amp):
        assert diff < 1e-5


def _misuse() -> dict:
    out = {}
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.randn(2, 6)).sum().backward()
    try:
        opt.zero_grad()
    except AssertionError as exc:
        out["zero_grad"] = str(exc)
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    out["warning"] = [str(w.message) for w in caught]
    named = list(model.named_parameters())
    for case, np_ in (("duplicate", [("w", named[0][1]), ("w", named[1][1])]),
                      ("missing", named[:1])):
        try:
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=np_)
        except ValueError as exc:
            out[case] = str(exc)
    return out


def test_misuse_is_reported(world2):
    for out in world2.run(_misuse):
        assert "zero_grad() was called after loss.backward()" in out["zero_grad"]
        assert any("optimizer.step() called without optimizer.skip_synchronize()" in w
                   for w in out["warning"])
        assert "unique" in out["duplicate"] and "'w'" in out["duplicate"]
        assert "not in it" in out["missing"]


def _join_training() -> tuple:
    r, n = hvd.rank(), hvd.size()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    for x, y in _batches(2 + r, 4, 1, seed=10 + r):  # uneven: rank r has 2 + r batches
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    last = hvd.join()
    # Reference: at each step, the gradients of the ranks that still had data, summed and
    # divided by the size of the world (joined ranks add zeros, as in Horovod).
    ref = _model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    data = [_batches(2 + i, 4, 1, seed=10 + i) for i in range(n)]
    for step in range(2 + n - 1):
        active = [i for i in range(n) if step < 2 + i]
        grads = []
        for i in active:
            ref.zero_grad()
            x, y = data[i][step]
            torch.nn.functional.cross_entropy(ref(x), y).backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        for p, *gs in zip(ref.parameters(), *grads):
            p.grad = sum(gs) / n
        ref_opt.step()
    vs_reference = max((a - b).abs().max().item()
                       for a, b in zip(model.parameters(), ref.parameters()))
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    final = hvd.allgather(torch.cat([p.detach().reshape(-1) for p in model.parameters()])[None])
    return last, vs_reference, (final - final[0]).abs().max().item()


def test_join_with_uneven_batches_joined_ranks_add_zeros_to_averages(world):
    for r, (last, vs_reference, spread) in enumerate(world.run(_join_training)):
        assert last == world.size - 1
        if r == last:  # the rank that trained through every step matches the reference
            assert vs_reference < 1e-5
        assert spread < 1e-6


def _sync_batch_norm() -> tuple:
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(5)
    full = torch.randn(4 * n, 3, 5, 5)
    weight = torch.randn(3)
    mine = full[4 * r:4 * (r + 1)].clone().requires_grad_()
    sync = hvd.SyncBatchNorm(3)
    ref = torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        sync.weight.copy_(weight)
        ref.weight.copy_(weight)
    loss_weights = torch.randn(full.shape)
    out = sync(mine)
    (out * loss_weights[4 * r:4 * (r + 1)]).sum().backward()
    whole = full.clone().requires_grad_()
    ref_out = ref(whole)
    (ref_out * loss_weights).sum().backward()
    ref_slice = ref_out[4 * r:4 * (r + 1)]
    return ((out - ref_slice).abs().max().item(),
            (mine.grad - whole.grad[4 * r:4 * (r + 1)]).abs().max().item(),
            (sync.running_var - ref.running_var).abs().max().item(),
            # weight gradients: each rank holds its share; their sum is the reference's
            (hvd.allreduce(sync.weight.grad, op=hvd.Sum) - ref.weight.grad).abs().max().item())


def test_sync_batch_norm_equals_batch_norm_on_the_concatenated_batch(world):
    for diffs in world.run(_sync_batch_norm):
        assert max(diffs) < 1e-3, diffs


def _timeline(path: str) -> None:
    hvd.start_timeline(path)
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.randn(4, 6)).sum().backward()
    opt.step()
    hvd.broadcast(torch.ones(2), root_rank=0, name="timeline.bcast")
    hvd.stop_timeline()


def _timeline_events(world, fn, tmp_path) -> list[dict]:
    """Run ``fn(path)`` on every rank and return the timeline rank 0 wrote to ``path``."""
    path = str(tmp_path / "timeline.json")
    world.run(fn, path)
    with open(path) as f:
        return json.load(f)


def test_timeline_names_each_tensor_and_its_phases(world2, tmp_path):
    events = _timeline_events(world2, _timeline, tmp_path)
    rows = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    phases: dict[str, set] = {}
    for e in events:
        if e.get("ph") == "X":
            phases.setdefault(rows[e["tid"]], set()).add(e["name"])
    # each gradient's row shows its copies into and out of its bucket; the bucket's row (named
    # after its parameters, last to first) shows the collective
    for name in ("0.weight", "0.bias", "2.weight", "2.bias"):
        memcpy = {"MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER"}
        assert memcpy <= phases[f"allreduce.{name}"]
    bucket = "allreduce.2.bias..0.weight"
    library = "GLOO" if os.environ.get("RINGTRAIN_SHM") == "0" else "SHM"  # ranks share a host
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", f"{library}_ALLREDUCE"} <= phases[bucket]
    assert {"NEGOTIATE_BROADCAST", "BROADCAST"} <= phases["timeline.bcast"]


def _bucket_steps(path: str) -> None:
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    for step in range(4):
        if step == 2:  # steps 0-1 fill the response cache; 2-3 run as unit rounds
            hvd.start_timeline(path)
        model(torch.randn(4, 6)).sum().backward()
        opt.step()
        opt.zero_grad()
    hvd.stop_timeline()


def test_a_bucket_of_gradients_runs_as_one_collective(world2, tmp_path):
    events = _timeline_events(world2, _bucket_steps, tmp_path)
    copies = [e for e in events if e.get("name") == "MEMCPY_IN_FUSION_BUFFER"]
    collectives = [e for e in events if e.get("name") == "ALLREDUCE"]
    # the model's 4 gradients fit one bucket: each of the 2 steps copies four gradients into it
    # and runs one collective
    assert len(copies) == 8 and {e["args"]["bucket"] for e in copies} == {
        "allreduce.2.bias..0.weight"}
    assert len(collectives) == 2, collectives


def _negotiations_while_training(metric_every_step: bool) -> tuple[int, list[float], float]:
    """Train 6 steps after 2 warm-up steps; count the negotiation rounds of the 6."""
    from ringtrain.torch import runtime

    backend = runtime.current().engine._backend
    negotiations = []
    control_allreduce = backend.control_allreduce

    def counted(counts):
        negotiations.append(1)
        control_allreduce(counts)

    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    metric = 0.0
    for i, (x, y) in enumerate(_batches(8, 4, hvd.size())):
        if i == 2:
            negotiations.clear()
            backend.control_allreduce = counted
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if metric_every_step:  # a metric averaged by a collective submitted on its own
            metric = hvd.allreduce(torch.tensor([float(hvd.rank())]), name="metric").item()
    backend.control_allreduce = control_allreduce
    return len(negotiations), [p.detach().sum().item() for p in model.parameters()], metric


def test_steady_training_runs_buckets_without_negotiating(world2):
    # the bucket's last member rings the bucket itself: no control collective per step
    results = world2.run(_negotiations_while_training, False)
    assert [n for n, _, _ in results] == [0, 0]
    assert results[0][1] == pytest.approx(results[1][1])


def test_buckets_and_operations_submitted_on_their_own_interleave(world2):
    results = world2.run(_negotiations_while_training, True)
    # the metric, submitted on its own on an empty queue, is counted as a unit of one: once
    # cached it runs in a unit round like the buckets, with no negotiation (the pending watch's
    # probe may still start one when a rank lags by over a second). Rounds are collective:
    # counts agree.
    (n0, _, _), (n1, _, _) = results
    assert n0 == n1 and n0 < 6  # it negotiated once or twice a step before
    assert [m for _, _, m in results] == [0.5, 0.5]
    assert results[0][1] == pytest.approx(results[1][1])


def _train_on_ranks_0_and_1() -> tuple[list[float], float]:
    pair = hvd.add_process_set([0, 1])
    model = _model(seed=hvd.rank())  # members start apart: only the set's averaging joins them
    params = None
    if hvd.rank() in (0, 1):
        hvd.broadcast_parameters(model.state_dict(), root_rank=0, process_set=pair)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       process_set=pair)
        for x, y in _batches(4, 2, 1, seed=10 + hvd.rank()):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        params = [p.detach().sum().item() for p in model.parameters()]
    total = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after_pair").item()
    hvd.remove_process_set(pair)
    return params, total


def test_training_on_a_process_set_leaves_the_other_ranks_free(world3):
    results = world3.run(_train_on_ranks_0_and_1)
    assert results[0][0] == pytest.approx(results[1][0])
    assert [total for _, total in results] == [3.0, 3.0, 3.0]


def _unused_on_rank_1() -> list[float]:
    used, spare, params, opt = _used_and_spare()
    for _ in range(3):
        out = used(torch.ones(1, 3)).sum()
        if hvd.rank() == 0:
            out = out + spare(torch.ones(1, 3)).sum()
        out.backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().sum().item() for p in params]


def test_a_bucket_with_a_gradient_missing_on_one_rank_still_completes(world2):
    # rank 1 never uses `spare`: its bucket is submitted at step() with zeros for it, and
    # both ranks apply the same averaged update
    first, second = world2.run(_unused_on_rank_1)
    assert first == pytest.approx(second)


OPTIMIZERS = ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam",
              "RAdam", "ASGD", "Rprop"]


def _broadcast_state(name: str) -> float:
    r = hvd.rank()
    torch.manual_seed(100 + r)  # ranks start different
    model = torch.nn.Linear(5, 3)
    kwargs = {"lr": 0.01 * (r + 1)}
    if name == "SGD":
        kwargs["momentum"] = 0.9
    opt = getattr(torch.optim, name)(model.parameters(), **kwargs)
    if r == 0:  # only the root has taken a step, so only it has (lazily created) state
        model(torch.randn(4, 5)).sum().backward()
        opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    # one identical step everywhere must now give identical parameters
    opt.zero_grad()
    torch.manual_seed(7)
    model(torch.randn(4, 5)).sum().backward()
    opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = hvd.allgather(flat[None])
    lr_spread = hvd.allgather(torch.tensor([opt.param_groups[0]["lr"]]))
    return max((gathered - gathered[0]).abs().max().item(),
               (lr_spread - lr_spread[0]).abs().max().item())


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_broadcast_optimizer_state_for_every_torch_optimizer(world2, name):
    for spread in world2.run(_broadcast_state, name):
        assert spread == 0.0
