"""A user's script's step records as the doctor's trial results, with 95 % intervals.

Every run of the script (``ringtrain doctor -- SCRIPT``) leaves one ``steps.rank<N>.jsonl`` per
rank. A trial the doctor ran R >= 2 times gives R measurements of each figure, one per run.
Run once, its measured steps are cut into windows of consecutive steps, each a measurement
(batch means: neighbouring steps are not independent, so the spread of single steps would make
the noise look smaller than it is). Either way a figure is the mean of its measurements with
the Student-t interval of that mean (:mod:`ringtrain.doctor.intervals`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ringtrain.doctor.intervals import estimate
from ringtrain.doctor.trials import TrialResult, result_of_ranks
from ringtrain.torch.step_profiler import summarize

#: The windows one run is cut into when a trial ran only once.
WINDOWS = 5


class ScriptRunError(RuntimeError):
    """The script failed, or trained no step the doctor could see."""


@dataclass(frozen=True)
class ScriptRun:
    """One run of the script: each rank's step records after the warm-up (as written by
    :class:`ringtrain.torch.step_profiler.StepProfiler`)."""

    ranks: list[list[Mapping[str, Any]]]

    @property
    def synthetic_seen(self) -> bool:
        """Whether the synthetic-data hook took effect (some batch was replaced)."""
        return any(r.get("synthetic") for records in self.ranks for r in records)

    @property
    def samples_known(self) -> bool:
        """Whether every step's batch size was seen (else rates are steps, not images, per
        second)."""
        return all(r.get("samples") for records in self.ranks for r in records)

    @property
    def workers(self) -> int | None:
        """The data loader's worker processes (``None``: no torch ``DataLoader`` was seen)."""
        seen = [r["loader_workers"] for records in self.ranks for r in records
                if "loader_workers" in r]
        return max(seen) if seen else None

    @property
    def steps(self) -> int:
        """Measured steps of the rank that recorded fewest."""
        return min(len(records) for records in self.ranks)


def read_run(out: Path, warmup: int) -> ScriptRun:
    """The run whose ``steps.rank<N>.jsonl`` files are in ``out``, leaving out each rank's
    first ``warmup`` steps.

    Raises:
        ScriptRunError: no rank recorded a step after the warm-up.
    """
    ranks: list[list[Mapping[str, Any]]] = []
    for path in sorted(out.glob("steps.rank*.jsonl"), key=_rank_of):
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        measured = [r for r in records if r["step"] >= warmup]
        if measured:
            ranks.append(measured)
    if not ranks:
        raise ScriptRunError(
            f"no step was profiled after {warmup} warm-up step(s) in {out}: the script must "
            "train with hvd.DistributedOptimizer (its step() ends each step) and run more than "
            "--warmup steps")
    return ScriptRun(ranks)


def _rank_of(path: Path) -> int:
    return int(path.name.removeprefix("steps.rank").removesuffix(".jsonl"))


def trial_result(name: str, data: str, runs: list[ScriptRun], samples_known: bool
                 ) -> TrialResult:
    """The trial's figures over its ``runs`` (windows of the one run when there is one), with
    their 95 % intervals; rates in samples per second when ``samples_known``, else steps per
    second.

    Raises:
        ScriptRunError: one run of fewer than 2 measured steps (no spread to measure).
        ValueError: no run.
    """
    if not runs:
        raise ValueError("a trial needs at least one run")
    workers = max((w for run in runs if (w := run.workers) is not None), default=None)
    if len(runs) >= 2:
        measurements = [_measure(name, data, workers, run.ranks, samples_known) for run in runs]
    else:
        (run,) = runs
        count = min(WINDOWS, run.steps)
        if count < 2:
            raise ScriptRunError(
                f"the {name} trial measured {run.steps} step(s) after the warm-up in one run "
                "(the script ended, or --steps stopped it): its noise comes from windows of "
                "its steps, so it needs 2 or more (a longer run or --steps >= 2), or "
                "--repeats of at least 2")
        cuts = [round(i * run.steps / count) for i in range(count + 1)]
        measurements = [_measure(name, data, workers,
                                 [records[a:b] for records in run.ranks], samples_known)
                        for a, b in zip(cuts, cuts[1:])]
    return _combine(name, data, workers, measurements)


def _measure(name: str, data: str, workers: int | None, ranks: list[list[Mapping[str, Any]]],
             samples_known: bool) -> TrialResult:
    """One measurement of the trial: the steps in ``ranks`` (each rank's, back to back)."""
    samples = (sum(r["samples"] for records in ranks for r in records) if samples_known
               else max(len(records) for records in ranks))
    return result_of_ranks(name, data, workers, [summarize(records) for records in ranks],
                           samples)


def _combine(name: str, data: str, workers: int | None, measurements: list[TrialResult]
             ) -> TrialResult:
    rate = estimate([m.images_per_second for m in measurements])
    phases = {p: estimate([m.breakdown_ms[p] for m in measurements])
              for p in measurements[0].breakdown_ms}
    ranks = len(measurements[0].step_ms_per_rank)
    per_rank = [estimate([m.step_ms_per_rank[i] for m in measurements]) for i in range(ranks)]
    slowest = max(range(ranks), key=lambda i: per_rank[i].mean)
    return TrialResult(
        name, data, workers, rate.mean, {p: e.mean for p, e in phases.items()},
        [e.mean for e in per_rank], slowest, noise=rate.relative,
        rates=[m.images_per_second for m in measurements],
        breakdown_half_ms={p: e.half for p, e in phases.items()},
        step_half_ms_per_rank=[e.half for e in per_rank])

