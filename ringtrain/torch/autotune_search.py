"""Autotuning's search and its files: Bayesian optimisation over ringtrain's knobs (on log2
scales, docs/autotune.md), the log in Horovod's CSV layout, and the best settings as a
``ringtrain run --config-file`` YAML. The Gaussian process standardises the scores, so ``noise``
(Horovod's ``--autotune-gaussian-process-noise``) is on that scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

#: Horovod's log columns (hierarchical collectives and the cache are not tuned here and are
#: logged as Horovod logs a knob held fixed), then ringtrain's own, then the score.
LOG_COLUMNS = ("hierarchical_allreduce", "hierarchical_allgather", "cache_enabled",
               "cycle_time_ms", "tensor_fusion_threshold", "threads_per_rank", "score")
_BUCKET_LOG2_MB = (0.0, 6.0)
_CYCLE_LOG2_MS = (-1.0, 4.0)


@dataclass(frozen=True)
class Setting:
    """One point of the search: gradient bucket MiB, engine cycle ms, intra-op threads."""

    bucket_mb: float
    cycle_time_ms: float
    threads: int

    @property
    def bucket_bytes(self) -> int:
        return max(1, int(self.bucket_mb * 1024 * 1024))


class Search:
    """Bayesian optimisation of :class:`Setting` scores (higher is better).

    Args:
        max_threads: Most intra-op threads worth trying (the rank's cores).
        seed: Seed of the optimiser's random choices (the same search every run).

    Raises:
        RuntimeError: ``bayesian-optimization`` is not installed.
    """

    def __init__(self, max_threads: int, noise: float, seed: int = 0) -> None:
        import numpy as np

        try:
            from bayes_opt import BayesianOptimization, acquisition
        except ImportError:
            raise RuntimeError("--autotune needs the bayesian-optimization package: "
                               "pip install 'ringtrain[autotune]'") from None
        bounds = {"bucket": _BUCKET_LOG2_MB, "cycle": _CYCLE_LOG2_MS}
        self._threads = max(1, max_threads)
        if self._threads > 1:
            bounds["threads"] = (1.0, float(self._threads))
        self._bo = BayesianOptimization(
            f=None, pbounds=bounds, random_state=seed, verbose=0,
            acquisition_function=acquisition.ExpectedImprovement(xi=0.01),
            allow_duplicate_points=True)
        # Fewer restarts of the kernel fit than the library's 5: a suggestion is made while
        # every rank waits, and 20 points do not need them.
        self._bo.set_gp_params(alpha=max(noise, 1e-6), n_restarts_optimizer=1)
        self._random = np.random.RandomState(seed)
        self.samples: list[tuple[Setting, float]] = []

    def register(self, setting: Setting, score: float) -> None:
        """Add a measured ``score`` of ``setting``."""
        point = {"bucket": _clip(math.log2(setting.bucket_mb), _BUCKET_LOG2_MB),
                 "cycle": _clip(math.log2(max(setting.cycle_time_ms, 1e-3)), _CYCLE_LOG2_MS)}
        if self._threads > 1:
            point["threads"] = float(min(max(setting.threads, 1), self._threads))
        # A setting measured again is a second sample of a noisy score, which the process
        # model should keep; the library takes a repeated point but prints a red line on the
        # training's stdout for it, so a repeat is registered a hair's breadth away instead.
        low, high = _BUCKET_LOG2_MB
        inward = 1e-9 if point["bucket"] < (low + high) / 2 else -1e-9  # stays inside the bounds
        while self._bo.space.params_to_array(point) in self._bo.space:
            point["bucket"] += inward
        self._bo.register(params=point, target=score)
        self.samples.append((setting, score))

    def suggest(self) -> Setting:
        """The next setting to try."""
        if not self.samples:
            point = self._bo.suggest()
        else:
            # The library's suggest(), with a lighter search of the acquisition's maximum (its
            # defaults, 10,000 random points and 10 L-BFGS-B runs, take seconds on a busy
            # core while every rank waits; 3 dimensions need far fewer).
            array = self._bo.acquisition_function.suggest(
                gp=self._bo._gp, target_space=self._bo.space, n_random=2000, n_smart=3,
                fit_gp=True, random_state=self._random)
            point = self._bo.space.array_to_params(array)
        threads = round(float(point["threads"])) if "threads" in point else self._threads
        return Setting(round(2 ** float(point["bucket"]), 2),
                       round(2 ** float(point["cycle"]), 2), int(threads))

    def best(self) -> tuple[Setting, float]:
        """The best setting measured so far and its score.

        Raises:
            ValueError: nothing registered yet.
        """
        if not self.samples:
            raise ValueError("no sample registered yet")
        return max(self.samples, key=lambda s: s[1])


def _clip(x: float, bounds: tuple[float, float]) -> float:
    return min(max(x, bounds[0]), bounds[1])


def log_header() -> str:
    """The log's first line."""
    return ",".join(LOG_COLUMNS)


def log_line(setting: Setting, score: float) -> str:
    """One sample as a log line: Horovod's columns (the bucket MiB as the fusion threshold,
    which DistributedOptimizer's buckets are), threads, then the score (steps per second)."""
    return ",".join(["0", "0", "1", f"{setting.cycle_time_ms:g}", f"{setting.bucket_mb:g}",
                     str(setting.threads), f"{score:.6g}"])


def best_config_yaml(setting: Setting, score: float, samples: int) -> str:
    """The best settings as a ``--config-file`` (Horovod's ``params`` section)."""
    return (f"# ringtrain run --autotune: best of {samples} sample(s), {score:.4g} steps/s\n"
            "params:\n"
            f"  bucket_mb: {setting.bucket_mb:g}\n"
            f"  cycle_time_ms: {setting.cycle_time_ms:g}\n"
            f"  threads_per_rank: {setting.threads}\n")


def best_config_path(log_file: str | None) -> Path:
    """Where the best settings go: beside the log (``LOG.best.yaml``), else
    ``autotune-best.yaml`` in the working directory."""
    return Path(f"{log_file}.best.yaml") if log_file else Path("autotune-best.yaml")
