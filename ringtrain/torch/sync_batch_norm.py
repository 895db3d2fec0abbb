"""Batch normalisation with statistics computed over the batches of all ranks."""

from __future__ import annotations

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from ringtrain.op_types import ReduceOp
from ringtrain.torch import autograd_ops, runtime


class SyncBatchNorm(_BatchNorm):
    """A drop-in for ``BatchNorm1d/2d/3d`` whose training statistics span all ranks.

    In training, the mean and (biased) variance are those of the concatenation of every rank's
    batch, computed in two differentiable allreduces (sum and count, then squared deviations), so
    gradients equal those of one process running ``BatchNorm`` on the whole batch. Running
    statistics are updated from the global batch. Evaluation uses the running statistics.
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (N, C, ...), got {input.dim()}D")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not self.training or runtime.current().topology.size == 1:
            return super().forward(input)
        dims = [0] + list(range(2, input.dim()))
        shape = [1, -1] + [1] * (input.dim() - 2)
        count = torch.tensor([input.numel() / input.size(1)], dtype=input.dtype,
                             device=input.device)
        sums = autograd_ops.allreduce(torch.cat([input.sum(dims), count]), op=ReduceOp.SUM)
        total = sums[-1]
        mean = sums[:-1] / total
        centered = input - mean.view(shape)
        var = autograd_ops.allreduce((centered * centered).sum(dims), op=ReduceOp.SUM) / total
        if self.track_running_stats:
            # the buffers that track_running_stats creates
            assert self.num_batches_tracked is not None and self.running_mean is not None
            assert self.running_var is not None
            with torch.no_grad():
                self.num_batches_tracked += 1
                momentum = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                            else self.momentum)
                unbiased = var * total / (total - 1).clamp(min=1)
                self.running_mean.mul_(1 - momentum).add_(mean.detach() * momentum)
                self.running_var.mul_(1 - momentum).add_(unbiased.detach() * momentum)
        out = centered * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module) -> torch.nn.Module:
        """Replace every ``BatchNorm*`` in ``module`` by a ``SyncBatchNorm`` with its state."""
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            sync = cls(module.num_features, module.eps, module.momentum, module.affine,
                       module.track_running_stats)
            sync.load_state_dict(module.state_dict())
            sync.train(module.training)
            return sync
        for name, child in module.named_children():
            module.add_module(name, cls.convert_sync_batchnorm(child))
        return module
