"""A small training loop for `ringtrain run --autotune`: an MLP on random batches,
``DistributedOptimizer``; prints one JSON line per rank at the end with the buckets it ended
with and the threads it runs."""

import argparse
import json

import torch
import torch.nn.functional as F

import ringtrain.torch as hvd

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
args = p.parse_args()

hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                            torch.nn.ReLU(), torch.nn.Linear(512, 10))
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
for _ in range(args.steps):
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
tuner = optimizer._autotuner
print(json.dumps({"rank": hvd.rank(), "done": tuner is not None and tuner.done,
                  "bucket_bytes": optimizer._bucket_bytes, "threads": torch.get_num_threads(),
                  "weight0": float(model[0].weight.detach().sum())}), flush=True)
hvd.shutdown()
