"""ringtrain: Horovod's distributed training model on torch.distributed."""

__version__ = "0.1.0"
