"""Per-rank shards of a data set: a new order every epoch, resumable mid-epoch, and an explicit
rule for the last batch.

:class:`ShardedSampler` is an :class:`ringtrain.torch.elastic.ElasticSampler`, so an elastic
``TorchState(sampler=...)`` commits, restores and synchronises it like Horovod's sampler: after a
failure the survivors re-shard what no rank has processed yet.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sized
from typing import Literal

from ringtrain.torch import runtime
from ringtrain.torch.elastic import ElasticSampler

LastBatch = Literal["partial", "pad", "drop"]
_LAST_BATCH = ("partial", "pad", "drop")


class ShardedSampler(ElasticSampler):
    """This rank's indices of an epoch, in batches of ``batch_size``.

    Each epoch the indices are shuffled with ``seed + epoch`` (the same order on every rank);
    indices recorded as processed (:meth:`record_batch`) are left out, so that an epoch resumes
    where its last commit was. Rank ``r`` takes every ``num_replicas``-th index from position
    ``r``; every rank gets the same number of indices, so ranks run the same number of steps.

    The last batch, by ``last_batch``:
        ``"partial"``: pad by repeating indices to a multiple of the number of ranks only; the
            last batch of each rank may be smaller than ``batch_size``.
        ``"pad"``: pad by repeating indices to whole batches on every rank.
        ``"drop"``: leave out the indices that do not fill a whole batch on every rank.

    Args:
        dataset: Anything with a length.
        batch_size: Indices per batch on each rank.
        last_batch: ``"partial"``, ``"pad"`` or ``"drop"``.
        shuffle: Shuffle the order each epoch.
        seed: The shuffle's base seed; ranks must agree on it.
        rank, num_replicas: This rank and the number of ranks; by default read from
            ``hvd.rank()`` and ``hvd.size()`` (so ``hvd.init()`` comes first), and read again
            after an elastic re-form. Pass both to use the sampler without ``hvd``.

    Raises:
        ValueError: ``batch_size`` is not positive, ``last_batch`` is not one of the three, or
            only one of ``rank``/``num_replicas`` is given or they disagree.
    """

    def __init__(self, dataset: Sized, batch_size: int, *, last_batch: LastBatch = "partial",
                 shuffle: bool = True, seed: int = 0, rank: int | None = None,
                 num_replicas: int | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if last_batch not in _LAST_BATCH:
            raise ValueError(f"last_batch must be one of {_LAST_BATCH}, got {last_batch!r}")
        if (rank is None) != (num_replicas is None):
            raise ValueError("pass both rank and num_replicas, or neither (to use hvd's)")
        if num_replicas is not None and rank is not None and not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in 0..{num_replicas - 1}, got {rank}")
        self.batch_size = batch_size
        self.last_batch = last_batch
        self._world = None if rank is None or num_replicas is None else (rank, num_replicas)
        super().__init__(dataset, shuffle=shuffle, seed=seed)

    def reset(self) -> None:
        """Recompute this rank's shard from the epoch, the processed indices and the world."""
        self.rank, self.num_replicas = self._world or (runtime.rank(), runtime.size())
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = [i for i in order if i not in self.processed_indices]
        unit = self.num_replicas * (1 if self.last_batch == "partial" else self.batch_size)
        count = len(self.remaining_indices)
        self.total_size = (count // unit if self.last_batch == "drop" else -(-count // unit)) * unit
        self.num_samples = self.total_size // self.num_replicas
        self._padded = list(itertools.islice(itertools.cycle(self.remaining_indices),
                                             self.total_size))
        self.indices = self._shard(self.rank)
