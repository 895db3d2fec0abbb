"""How DistributedOptimizer (and the Keras one, and the forecast) cut parameters into gradient
buckets, and how a bucket describes itself."""

from __future__ import annotations

import torch

from ringtrain.torch.grad_bucket import Bucket, GradBucket, plan_buckets


def test_buckets_are_cut_from_the_end_by_dtype_within_the_size():
    a, b, c = (torch.nn.Parameter(torch.zeros(10)) for _ in range(3))  # 40 bytes each
    wide = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    buckets = plan_buckets([a, b, wide, c], 100)
    assert [[id(p) for p in bucket] for bucket in buckets] == [
        [id(c), id(b)],  # reversed order; a third float32 would pass 100 bytes
        [id(wide)],      # another dtype, its own bucket
        [id(a)],
    ]


def test_a_parameter_larger_than_the_size_is_a_bucket_of_its_own():
    small, big, last = (torch.zeros(n) for n in (2, 50, 3))  # 8, 200 and 12 bytes
    assert [[id(p) for p in bucket] for bucket in plan_buckets([small, big, last], 25)] == [
        [id(last)], [id(big)], [id(small)]]


def test_a_bucket_describes_its_bytes_and_readiness():
    bucket = GradBucket("b", [torch.zeros(3), torch.zeros(2, dtype=torch.float64)], {})
    assert bucket.describe(1.5) == Bucket("b", 3 * 4 + 2 * 8, 1.5)
    assert bucket.describe().ready_before_end_ms == 0.0
