"""Shared by the benchmarks: how precisely a median ratio was measured on a noisy machine."""

from __future__ import annotations

import random
import statistics


def bootstrap_median_ci(values: list[float], resamples: int = 2000) -> tuple[float, float]:
    """A 95% percentile-bootstrap interval of the median of ``values`` (seeded: reproducible)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values)))
                     for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]
