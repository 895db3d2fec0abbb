"""An unmodified Horovod PyTorch training script (nothing here names ringtrain).

``test_horovod_compat.py`` runs it with ``ringtrain run --horovod-compat``; it prints one JSON line
per rank with what the test compares across ranks.
"""

import json

import horovod
import horovod.torch as hvd
import torch
import torch.nn.functional as F
from horovod.common.exceptions import HorovodInternalError
from horovod.common.util import gloo_built
from horovod.torch.compression import Compression
from horovod.torch.mpi_ops import Average, Sum

torch.set_num_threads(1)
hvd.init()
torch.manual_seed(1234 + hvd.rank())  # ranks start different; broadcast must fix that

model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size(), momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=hvd.Compression.fp16, op=hvd.Average)

state = hvd.elastic.TorchState(model=model, optimizer=optimizer, batch=0)
losses = []
for step in range(5):
    data = torch.randn(16, 8)  # each rank its own batch, as with a DistributedSampler
    target = torch.randint(0, 3, (16,))
    optimizer.zero_grad()
    loss = F.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()
    state.batch = step
    state.commit()
    losses.append(hvd.allreduce(loss.detach(), name="loss", op=Average).item())

ranks = hvd.allreduce(torch.tensor(1), name="ranks", op=Sum).item()
params = torch.cat([p.detach().flatten() for p in model.parameters()])
print(json.dumps({
    "rank": hvd.rank(), "size": hvd.size(), "ranks_summed": ranks, "losses": losses,
    "params": params.tolist(), "version": horovod.__version__, "gloo_built": gloo_built(),
    "fp16": Compression.fp16 is hvd.Compression.fp16,
    "internal_error_is_runtime": issubclass(HorovodInternalError, RuntimeError),
    "hvd_module": hvd.allreduce.__module__,
}), flush=True)
hvd.shutdown()
