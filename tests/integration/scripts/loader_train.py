"""A small Horovod-style training script that names nothing of the doctor (but for
``--generator``): a DataLoader whose
items take ``--item-ms`` to make, a small MLP, ``DistributedOptimizer``. Prints one JSON line
per rank at the end (steps trained). ``--generator``: batches from a plain generator instead,
iterated through ``profiled_batches`` (the documented hook for batches not from a DataLoader).
"""

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import ringtrain.torch as hvd
from ringtrain.torch.auto_profile import profiled_batches


class SlowItems(Dataset):
    """Random features and labels; each item costs ``item_ms`` of sleep, like a decode."""

    def __init__(self, n: int, item_ms: float) -> None:
        self.n, self.item_ms = n, item_ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.item_ms / 1e3)
        g = torch.Generator().manual_seed(i)
        return torch.randn(16, generator=g), int(torch.randint(0, 3, (), generator=g))


def _generated(data, sampler, batch_size):
    """Batches made in this process, item by item (``item_ms`` each), as they are asked for."""
    indices = list(sampler)
    for start in range(0, len(indices) - batch_size + 1, batch_size):
        chunk = [data[i] for i in indices[start:start + batch_size]]
        yield torch.stack([x for x, _ in chunk]), torch.tensor([y for _, y in chunk])


p = argparse.ArgumentParser()
p.add_argument("--item-ms", type=float, default=2.0)
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--items", type=int, default=160)
p.add_argument("--workers", type=int, default=0)
p.add_argument("--generator", action="store_true")
args = p.parse_args()

torch.set_num_threads(1)
hvd.init()
data = SlowItems(args.items, args.item_ms)
sampler = torch.utils.data.distributed.DistributedSampler(data, hvd.size(), hvd.rank())
loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
steps = 0
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    batches = (profiled_batches(_generated(data, sampler, args.batch_size)) if args.generator
               else loader)
    for x, y in batches:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        steps += 1
print(json.dumps({"rank": hvd.rank(), "steps": steps}), flush=True)
