"""Training curves the job service's dashboard plots: rank 0's scalars as TensorBoard events.

``torch.utils.tensorboard.SummaryWriter`` (through :mod:`ringtrain.torch.summary_writer`, which
never imports TensorFlow) writes them under ``<output dir>/tb``, inside the
job's outputs, where the service finds and reads them as they grow (``ringtrain job metrics
ID`` prints them; ``tensorboard --logdir`` reads them too). Per step (every ``every`` steps):
``train/loss``, ``train/lr`` and ``train/images_per_s`` over all ranks; per epoch, whatever the
example reports (``epoch/...``, against the epoch number). Other ranks, and installs without
the ``tensorboard`` package (``pip install ringtrain[tensorboard]``), log nothing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import ringtrain.torch as hvd
from ringtrain.torch.summary_writer import summary_writer


class TrainingCurves:
    """Logs scalars on rank 0; a no-op elsewhere.

    Args:
        output_dir: the example's output folder; events go to its ``tb`` sub-folder.
        every: log the step scalars every this many steps.
    """

    def __init__(self, output_dir: Path, every: int = 10):
        self.every = every
        self.steps = 0
        self._images = 0
        self._since = time.perf_counter()
        self.writer: Any = None
        if hvd.rank() != 0:
            return
        try:
            self.writer = summary_writer(str(Path(output_dir) / "tb"))
        except ImportError:  # the tensorboard package is missing: no curves, training goes on
            print("training curves off: `pip install tensorboard` to log them", flush=True)

    def step(self, loss: Any, optimizer: Any, images: int) -> None:
        """After one optimizer step on ``images`` images of this rank."""
        self.steps += 1
        self._images += images
        if self.writer is None or self.steps % self.every:
            return
        now = time.perf_counter()
        w = self.writer
        # A loss tensor still holds its graph: its value without it (float() would warn).
        value = loss.detach().item() if hasattr(loss, "detach") else float(loss)
        w.add_scalar("train/loss", value, self.steps)
        w.add_scalar("train/lr", optimizer.param_groups[0]["lr"], self.steps)
        w.add_scalar("train/images_per_s", self._images * hvd.size() / (now - self._since),
                     self.steps)
        self._images, self._since = 0, now

    def epoch(self, epoch: int, **values: float) -> None:
        """After an epoch: each value as ``epoch/<name>`` at step ``epoch``."""
        if self.writer is not None:
            for name, value in values.items():
                self.writer.add_scalar(f"epoch/{name}", value, epoch)
            self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        if self.writer is not None:
            self.writer.close()
