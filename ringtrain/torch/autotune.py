"""``ringtrain run --autotune``: tune the gradient bucket size, cycle time and threads online.

Driven by ``DistributedOptimizer.step()``, so every rank reaches each decision at the same step;
rank 0 searches (:mod:`ringtrain.torch.autotune_search`) and broadcasts each setting. Samples,
scores and the files written: docs/autotune.md, "How it runs".
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable

import torch

from ringtrain.engine.config import AutotuneConfig, EngineConfig
from ringtrain.torch import ops, runtime
from ringtrain.torch.autotune_search import (
    Search,
    Setting,
    best_config_path,
    best_config_yaml,
    log_header,
    log_line,
)

log = logging.getLogger(__name__)
_MIB = 1024 * 1024


class Autotuner:
    """The online tuning of one ``DistributedOptimizer``, which started with ``knobs`` (whose
    ``autotune`` is set); ``clock``: seconds, monotonic (tests pass their own)."""

    def __init__(self, optimizer, knobs: EngineConfig,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._optimizer = optimizer
        assert knobs.autotune is not None  # made only when autotune is on
        self._config: AutotuneConfig = knobs.autotune
        self._clock = clock
        rt = runtime.current()
        self._engine = rt.engine
        self._rank = rt.env.rank
        self.current = Setting(knobs.bucket_bytes / _MIB, knobs.cycle_time_ms,
                               torch.get_num_threads())
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        max_threads = max(1, cores // max(1, runtime.local_size()))
        # Only rank 0 searches; it fails here, before training, without the library.
        self._search = (Search(max_threads, self._config.gaussian_process_noise)
                        if self._rank == 0 else None)
        self._log = None
        if self._rank == 0 and self._config.log_file:
            self._log = open(self._config.log_file, "w", encoding="utf-8")  # noqa: SIM115
            self._log.write(log_header() + "\n")
            self._log.flush()
        self._warmup_left = self._config.warmup_samples
        self._scored = 0
        self._steps = 0
        self._start: float | None = None
        self.done = False

    def after_step(self) -> None:
        """Count a finished step; at the end of a sample, score it and move on (collective:
        every rank calls it after the same step)."""
        if self.done:
            return
        now = self._clock()
        if self._start is None:  # the settling step after a change ends here
            self._start = now
            return
        self._steps += 1
        if self._steps < self._config.steps_per_sample:
            return
        rate = torch.tensor([self._steps / max(now - self._start, 1e-9)], dtype=torch.float64)
        score = float(ops.allreduce_(rate, op=ops.Min, name="autotune.score")[0])
        self._steps = 0
        if self._warmup_left > 0:
            self._warmup_left -= 1
            self._start = self._clock()
            return
        # The decision travels as numbers: bucket MiB, cycle ms, threads, done.
        decision = torch.zeros(4, dtype=torch.float64)
        if self._rank == 0:
            chosen, finished = self._decide(score)
            decision = torch.tensor([chosen.bucket_mb, chosen.cycle_time_ms, chosen.threads,
                                     float(finished)], dtype=torch.float64)
        ops.broadcast_(decision, root_rank=0, name="autotune.decision")
        setting = Setting(float(decision[0]), float(decision[1]), int(decision[2]))
        done = bool(decision[3])
        self._apply(setting)
        if done:
            self.done = True
            self._finish()
        self._start = None

    def close(self) -> None:
        """Stop tuning (the world it tuned is gone): close rank 0's log; nothing is written."""
        self.done = True
        if self._log is not None:
            self._log.close()
            self._log = None

    def _decide(self, score: float) -> tuple[Setting, bool]:
        """Rank 0: record the sample, then the next setting, or the best when the search is
        over."""
        assert self._search is not None  # rank 0 has one
        self._search.register(self.current, score)
        self._scored += 1
        if self._log is not None:
            self._log.write(log_line(self.current, score) + "\n")
            self._log.flush()
        if self._scored >= self._config.max_samples:
            return self._search.best()[0], True
        return self._search.suggest(), False

    def _apply(self, setting: Setting) -> None:
        self._optimizer.set_bucket_bytes(setting.bucket_bytes)
        self._engine.set_cycle_time(setting.cycle_time_ms)
        torch.set_num_threads(setting.threads)
        self.current = setting

    def _finish(self) -> None:
        if self._rank != 0:
            return
        assert self._search is not None  # rank 0 has one
        best, score = self._search.best()
        path = best_config_path(self._config.log_file)
        path.write_text(best_config_yaml(best, score, self._scored), encoding="utf-8")
        if self._log is not None:
            self._log.close()
        print(f"ringtrain autotune: best of {self._scored} samples: bucket {best.bucket_mb:g} "
              f"MiB, cycle {best.cycle_time_ms:g} ms, {best.threads} thread(s) "
              f"({score:.3g} steps/s); written to {path} (ringtrain run --config-file {path})",
              file=sys.stderr, flush=True)
