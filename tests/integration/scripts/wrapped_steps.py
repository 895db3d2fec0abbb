"""Steps of a profiled ``DistributedOptimizer`` under everything a training script wraps around
``optimizer.step``: each of torch's LR schedulers, AMP's ``GradScaler`` and gradient clipping
(Horovod's ``synchronize()`` / ``skip_synchronize()`` pattern). One world of one process;
prints one JSON line per case: ``{"case", "steps", "records", "lrs"}`` (``records``: the
steps the profiler finished; ``lrs``: the learning rate at each step).
"""

import json
import warnings

import torch
import torch.nn.functional as F
from torch.optim import lr_scheduler as sched

import ringtrain.torch as hvd
from ringtrain.torch.auto_profile import AutoProfile, ProfileRequest
from ringtrain.torch.step_profiler import StepProfiler

STEPS = 4

SCHEDULERS = {
    "LambdaLR": lambda o: sched.LambdaLR(o, lambda s: 0.5 ** s),
    "MultiplicativeLR": lambda o: sched.MultiplicativeLR(o, lambda s: 0.5),
    "StepLR": lambda o: sched.StepLR(o, 1),
    "MultiStepLR": lambda o: sched.MultiStepLR(o, [1, 2]),
    "ConstantLR": lambda o: sched.ConstantLR(o, factor=0.5, total_iters=2),
    "LinearLR": lambda o: sched.LinearLR(o, total_iters=3),
    "ExponentialLR": lambda o: sched.ExponentialLR(o, 0.5),
    "SequentialLR": lambda o: sched.SequentialLR(
        o, [sched.ConstantLR(o, factor=0.5, total_iters=1), sched.ExponentialLR(o, 0.5)],
        milestones=[1]),
    "CosineAnnealingLR": lambda o: sched.CosineAnnealingLR(o, 3),
    "ChainedScheduler": lambda o: sched.ChainedScheduler(
        [sched.StepLR(o, 1), sched.ExponentialLR(o, 0.5)]),
    "ReduceLROnPlateau": lambda o: sched.ReduceLROnPlateau(o, patience=0),
    "CyclicLR": lambda o: sched.CyclicLR(o, 0.01, 0.1, step_size_up=2),
    "OneCycleLR": lambda o: sched.OneCycleLR(o, max_lr=0.1, total_steps=STEPS + 1),
    "CosineAnnealingWarmRestarts": lambda o: sched.CosineAnnealingWarmRestarts(o, 2),
    "PolynomialLR": lambda o: sched.PolynomialLR(o, total_iters=3),
}


def run(case: str) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    profile = AutoProfile(optimizer, ProfileRequest(), StepProfiler("cpu", metrics_dir=False))
    scheduler = SCHEDULERS[case](optimizer) if case in SCHEDULERS else None
    scaler = torch.amp.GradScaler("cpu") if case == "GradScaler" else None
    lrs = []
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    for _ in range(STEPS):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            optimizer.synchronize()
            scaler.unscale_(optimizer)
            with optimizer.skip_synchronize():
                scaler.step(optimizer)
            scaler.update()
        elif case == "clip_grad_norm":
            loss.backward()
            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            with optimizer.skip_synchronize():
                optimizer.step()
        else:
            loss.backward()
            optimizer.step()
        if isinstance(scheduler, sched.ReduceLROnPlateau):
            scheduler.step(1.0)  # never better: the rate drops every step
        elif scheduler is not None:
            scheduler.step()
    return {"case": case, "steps": STEPS, "records": len(profile.profiler.records), "lrs": lrs}


hvd.init()
for case in [*SCHEDULERS, "GradScaler", "clip_grad_norm"]:
    with warnings.catch_warnings():
        # "lr_scheduler.step() before optimizer.step()": the scheduler lost track of the step
        warnings.filterwarnings("error", message=".*lr_scheduler.step.*")
        print(json.dumps(run(case)), flush=True)
