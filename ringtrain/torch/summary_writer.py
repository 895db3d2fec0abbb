"""TensorBoard event files written without TensorFlow, whether or not it is installed.

``torch.utils.tensorboard`` writes through the ``tensorboard`` package, which uses TensorFlow for
its file I/O when it can import it and a small stub of it otherwise. Where TensorFlow is
installed (Keras on its TensorFlow backend, beside training on torch), that import took 6-8 s
of every process that opened a writer, and printed TensorFlow's start-up lines on its stderr,
for event files the stub writes alike. ``tensorboard.compat.notf`` is the package's own switch
to the stub (its ``no_tensorflow`` build target): :func:`summary_writer` sets it before the
writer is made, so no writer of ringtrain's imports TensorFlow. Local folders only: a
``gs://`` log dir would need TensorFlow's file systems.
"""

from __future__ import annotations

import sys
import types
from typing import Any

_NO_TENSORFLOW = "tensorboard.compat.notf"


def without_tensorflow() -> None:
    """Make every ``tensorboard`` writer of this process use the stub, not TensorFlow: call it
    before the first writer (or ``tensorboard.summary.writer``) is imported."""
    sys.modules.setdefault(_NO_TENSORFLOW, types.ModuleType(_NO_TENSORFLOW))


def summary_writer(log_dir: str, flush_secs: int = 2) -> Any:
    """A ``torch.utils.tensorboard.SummaryWriter`` on ``log_dir`` (created) that never imports
    TensorFlow.

    Raises:
        ImportError: The ``tensorboard`` package is not installed
            (``pip install 'ringtrain[tensorboard]'``).
    """
    without_tensorflow()
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir, flush_secs=flush_secs)
