"""An elastic Horovod-style training script for the launcher's elastic tests.

Linear regression on a fixed dataset, in steps of ``GLOBAL_BATCH`` samples, sharded by
``hvd.elastic.ElasticSampler``, gradients averaged by ``DistributedOptimizer`` (whose
``load_state_dict`` in a restore drops the failed step, as Horovod's does), committed every
``COMMIT`` batches. Every rank prints JSON lines of what
it does (start, batch, commit, reset, epoch, done); the state also carries ``trained``, the
samples of the committed batches of this epoch (all ranks'), so a test can check that no
committed sample is trained twice. ``RINGTRAIN_TEST_PAUSE=WORKER:EPOCH:BATCH`` makes that
worker of the first world announce itself and sleep there, so that a test can kill it at a
known point (its peers then wait in that batch's allreduce), in a world of 3 ranks
(``RINGTRAIN_TEST_PAUSE_SIZE``: another size). ``RINGTRAIN_TEST_PACE_ONE=1`` paces a world of
one rank too, so that a test can grow it back before training ends.
"""

from __future__ import annotations

import json
import math
import os
import time

import torch

import ringtrain.torch as hvd

EPOCHS = 4
GLOBAL_BATCH = 12  # split over the ranks, so any world of 1, 2 or 3 takes the same steps
COMMIT = 2
SAMPLES = 144  # a multiple of the global batch: no epoch ever needs padding
PACE_S = 0.15  # per batch of a multi-rank world, so that hosts can come and go meanwhile


def dataset() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.01 * torch.randn(SAMPLES, 1,
                                                                              generator=g)
    return x, y


def worker() -> int:
    return int(os.environ.get("RINGTRAIN_ELASTIC_WORKER", os.environ.get("HOROVOD_RANK", 0)))


def report(event: str, **fields) -> None:
    print(json.dumps({"event": event, "worker": worker(), **fields}), flush=True)


def pause_here(epoch: int, batch: int) -> bool:
    target = os.environ.get("RINGTRAIN_TEST_PAUSE")
    return (target == f"{worker()}:{epoch}:{batch}"
            and os.environ.get("RINGTRAIN_ELASTIC_GENERATION", "1") == "1"
            and hvd.size() == int(os.environ.get("RINGTRAIN_TEST_PAUSE_SIZE", "3")))


def main() -> None:
    hvd.init()
    report("start", pid=os.getpid())
    x, y = dataset()
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(range(SAMPLES), shuffle=True, seed=3)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, commits=0,
                                   trained=())
    state.register_reset_callbacks([
        lambda: report("reset", rank=hvd.rank(), size=hvd.size(), commits=state.commits)])

    @hvd.elastic.run
    def train(state):
        batch = GLOBAL_BATCH // hvd.size()
        while state.epoch < EPOCHS:
            shard = list(state.sampler)
            for b in range(math.ceil(len(shard) / batch)):
                if pause_here(state.epoch, b):
                    report("pause")
                    time.sleep(120)
                idx = shard[b * batch:(b + 1) * batch]
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x[idx]), y[idx]).backward()
                optimizer.step()
                state.sampler.record_batch(b, batch)
                state.trained += tuple(i for part in hvd.allgather_object(idx) for i in part)
                report("batch", rank=hvd.rank(), size=hvd.size(), epoch=state.epoch,
                       commits=state.commits, indices=idx)
                if hvd.size() > 1 or os.environ.get("RINGTRAIN_TEST_PACE_ONE") == "1":
                    time.sleep(PACE_S)
                if (b + 1) % COMMIT == 0:
                    state.commits += 1
                    report("commit", size=hvd.size(), commits=state.commits)
                    state.commit()
            if hvd.rank() == 0:
                report("epoch", epoch=state.epoch, trained=list(state.trained))
            state.epoch += 1
            state.trained = ()
            state.sampler.set_epoch(state.epoch)
            state.commits += 1
            state.commit()

    train(state)
    report("done", rank=hvd.rank(), size=hvd.size(),
           weight=model.weight.detach().flatten().tolist(), bias=model.bias.item())


if __name__ == "__main__":
    main()
