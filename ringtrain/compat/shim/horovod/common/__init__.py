"""``horovod.common``: the framework-independent names that PyTorch scripts import."""
