"""How DistributedOptimizer cuts parameters into gradient buckets."""

from __future__ import annotations

import torch

from ringtrain.torch import optimizer


def test_buckets_are_cut_from_the_end_by_dtype_within_the_size(monkeypatch):
    monkeypatch.setattr(optimizer, "BUCKET_BYTES", 100)
    a, b, c = (torch.nn.Parameter(torch.zeros(10)) for _ in range(3))  # 40 bytes each
    wide = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    buckets = optimizer._buckets([a, b, wide, c])
    assert [[id(p) for p in bucket] for bucket in buckets] == [
        [id(c), id(b)],  # reversed order; a third float32 would pass 100 bytes
        [id(wide)],      # another dtype, its own bucket
        [id(a)],
    ]
