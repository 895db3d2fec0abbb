"""A Horovod PyTorch script as Horovod's own examples write it (pytorch_mnist.py, shortened),
on Fashion-MNIST. Nothing here names ringtrain: run it unchanged with

    ringtrain run --horovod-compat -np 2 python examples/horovod_mnist.py --epochs 1
"""

import argparse
import gzip
from pathlib import Path

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--lr", type=float, default=0.01)
p.add_argument("--limit", type=int, default=0, help="first N training images (0: all)")
p.add_argument("--data-dir", type=Path, default=Path("/usr/share/datasets/fashion-mnist"))
args = p.parse_args()


def idx(name: str, offset: int) -> np.ndarray:
    with gzip.open(args.data_dir / name) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


hvd.init()
torch.manual_seed(42)
images = torch.from_numpy(idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28).copy())
labels = torch.from_numpy(idx("train-labels-idx1-ubyte.gz", 8).astype(np.int64))
if args.limit:
    images, labels = images[:args.limit], labels[:args.limit]
data = torch.utils.data.TensorDataset(images.float().div_(255), labels)
sampler = torch.utils.data.distributed.DistributedSampler(data, hvd.size(), hvd.rank())
loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, sampler=sampler)

model = torch.nn.Sequential(
    torch.nn.Conv2d(1, 10, 5), torch.nn.MaxPool2d(2), torch.nn.ReLU(),
    torch.nn.Conv2d(10, 20, 5), torch.nn.MaxPool2d(2), torch.nn.ReLU(), torch.nn.Flatten(),
    torch.nn.Linear(320, 50), torch.nn.ReLU(), torch.nn.Linear(50, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.5)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    avg = hvd.allreduce(loss.detach(), name="avg_loss")
    if hvd.rank() == 0:
        print(f"epoch {epoch + 1}: loss {avg.item():.4f} over {hvd.size()} processes", flush=True)
