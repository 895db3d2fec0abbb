"""Join the job, allreduce each rank's number, print this rank's view of the world as JSON.

Started by the tests of ``test_other_launchers.py`` under several launchers; it knows nothing of
them, as a user's script would not.
"""

import json
import os

import torch

import ringtrain.torch as hvd

torch.set_num_threads(1)
hvd.init()
mine = torch.tensor([float(hvd.rank() + 1)])
total = hvd.allreduce(mine, op=hvd.Sum, name="rank_sum")
mean = hvd.allreduce(mine, name="rank_mean")
gathered = hvd.allgather(mine, name="ranks")
root = hvd.broadcast(mine, root_rank=0, name="root")
# One write(2) of under PIPE_BUF bytes: ranks sharing a stdout pipe (torchrun) cannot interleave
# inside the line, even with PYTHONUNBUFFERED splitting print() into two writes.
report = json.dumps({
    "rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
    "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(),
    "cross_size": hvd.cross_size(), "sum": total.item(), "mean": mean.item(),
    "gathered": gathered.tolist(), "root": root.item(),
})
os.write(1, (report + "\n").encode())
hvd.shutdown()
