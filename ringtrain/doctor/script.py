"""``ringtrain doctor [-np N] -- SCRIPT ...``: the doctor on the user's own training script.

The script runs twice, unchanged, each time with the variables of
:mod:`ringtrain.torch.auto_profile` set: once fed its first batch again at every step (the
synthetic-data ceiling), once as it is. Its ``DistributedOptimizer`` profiles every step into
``steps.rank<N>.jsonl`` files in the trial's folder; this module reads them back into the
doctor's trial results.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ringtrain.doctor.progress import Progress
from ringtrain.doctor.trials import TrialResult, result_of_ranks
from ringtrain.torch.auto_profile import PROFILE_VAR, STEPS_VAR, SYNTHETIC_VAR
from ringtrain.torch.step_profiler import METRICS_DIR_VAR, summarize


class ScriptRunError(RuntimeError):
    """The script failed, or trained no step the doctor could see."""


@dataclass(frozen=True)
class ScriptTrial:
    """One run of the script: its result, whether the synthetic-data hook took effect
    (``synthetic_seen``: some batch was replaced) and whether batch sizes were seen (else the
    result's rate is steps, not images, per second)."""

    result: TrialResult
    synthetic_seen: bool
    samples_known: bool


def run_script(command: list[str], num_proc: int | None, out: Path, *, synthetic: bool,
               steps: int, timeout_s: float, progress: Progress | None = None) -> None:
    """Run ``command`` (under ``ringtrain run -np num_proc`` when given) with step profiling on,
    writing the step records to ``out`` (emptied first) and stopping after ``steps`` steps.

    Raises:
        ScriptRunError: the command exited with a status other than 0, or ran past
            ``timeout_s`` (it is then stopped).
    """
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != SYNTHETIC_VAR}
    env.update({PROFILE_VAR: "1", STEPS_VAR: str(steps), METRICS_DIR_VAR: str(out)})
    if synthetic:
        env[SYNTHETIC_VAR] = "1"
    launch = ([sys.executable, "-m", "ringtrain.cli", "run", "-np", str(num_proc)]
              if num_proc is not None else [])
    kind = "synthetic-data" if synthetic else "real-data"
    # Its own process group, so that a timeout or Ctrl-C stops the launcher and its ranks.
    proc = subprocess.Popen([*launch, *command], env=env, start_new_session=True)
    progress = progress or Progress(False)
    progress.start(f"{kind} run", steps)
    deadline = time.monotonic() + timeout_s
    try:
        while (status := proc.poll()) is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(command, timeout_s)
            time.sleep(0.5)
            progress.step(min(_steps_recorded(out), steps - 1))
        progress.step(steps)
    except subprocess.TimeoutExpired:
        _stop(proc)
        raise ScriptRunError(f"the script ran past --timeout {timeout_s:g} s in the {kind} run "
                             "and was stopped: lower --steps, or raise --timeout") from None
    except KeyboardInterrupt:
        _stop(proc)
        raise
    if status != 0:
        raise ScriptRunError(f"the script exited with status {status} in the {kind} run "
                             f"({' '.join(command)})")


def _steps_recorded(out: Path) -> int:
    """Steps rank 0 of the script has finished so far (lines of its step records)."""
    try:
        with open(out / "steps.rank0.jsonl", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the script's process group (``ringtrain run`` then stops its ranks), SIGKILL
    if it is still there after 30 s."""
    for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def read_trial(name: str, data: str, out: Path, warmup: int) -> ScriptTrial:
    """The trial's result from the ``steps.rank<N>.jsonl`` files in ``out``, leaving out each
    rank's first ``warmup`` steps.

    Raises:
        ScriptRunError: no rank recorded a step after the warm-up.
    """
    ranks = []
    for path in sorted(out.glob("steps.rank*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        measured = [r for r in records if r["step"] >= warmup]
        if measured:
            ranks.append(measured)
    if not ranks:
        raise ScriptRunError(
            f"no step was profiled after {warmup} warm-up step(s) in {out}: the script must "
            "train with hvd.DistributedOptimizer (its step() ends each step) and run more than "
            "--warmup steps")
    every = [r for records in ranks for r in records]
    samples_known = all(r.get("samples") for r in every)
    samples = (sum(r["samples"] for r in every) if samples_known
               else max(len(records) for records in ranks))
    workers = [r["loader_workers"] for r in every if "loader_workers" in r]
    result = result_of_ranks(name, data, max(workers) if workers else None,
                             [summarize(records) for records in ranks], samples)
    return ScriptTrial(result, any(r.get("synthetic") for r in every), samples_known)


def doctor_script(args: argparse.Namespace, command: list[str]) -> int:
    """Run the script with synthetic then real data, and report as the doctor does.

    Returns:
        0, or 1 when a run of the script failed or trained no visible step.
    """
    import torch

    from ringtrain.data.tuning import cores_per_rank, worker_budget
    from ringtrain.doctor import report
    from ringtrain.doctor.advice import ScriptMeasurements, advise_script

    steps = args.warmup + args.steps
    trials: list[ScriptTrial] = []
    progress = Progress(True)
    try:
        for name, synthetic_data in (("synthetic", True), ("real", False)):
            out = args.work_dir / name
            run_script(command, args.num_proc, out, synthetic=synthetic_data, steps=steps,
                       timeout_s=args.timeout, progress=progress)
            trials.append(read_trial(name, name, out, args.warmup))
    except ScriptRunError as e:
        print(f"ringtrain doctor: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        done = "; ".join(f"{t.result.name}: {t.result.images_per_second:.1f} "
                         f"{'img/s' if t.samples_known else 'steps/s'} "
                         f"(±{t.result.noise:.0%}), data wait {t.result.breakdown_ms['data']:.1f}"
                         f" of a {t.result.breakdown_ms['step']:.1f} ms step" for t in trials)
        print(f"ringtrain doctor: interrupted; measured so far: {done or 'nothing'}",
              file=sys.stderr)
        return 130
    synthetic, real = trials
    results = [t.result for t in trials] if synthetic.synthetic_seen else [real.result]
    ceiling = "synthetic" if synthetic.synthetic_seen else "real"
    cores = cores_per_rank(args.num_proc or 1)
    # The script's device is not recorded: a host with CUDA is taken to train on it.
    budget = worker_budget(cores, cpu_training=not torch.cuda.is_available())
    noise = max(real.result.noise, synthetic.result.noise)
    advice = advise_script(ScriptMeasurements(
        real.result.breakdown_ms,
        synthetic.result.breakdown_ms if synthetic.synthetic_seen else None,
        real.result.workers, cores, budget, noise))
    unit = "img/s" if real.samples_known else "steps/s"
    ranks = len(real.result.step_ms_per_rank)  # the script may launch its own ranks
    context = {"title": f"{' '.join(command)}, {ranks} rank(s) x {args.steps} measured "
                        "step(s)",
               "command": command, "ranks": ranks, "ceiling": ceiling,
               "rate_unit": unit, "baseline": "real", "noise": noise,
               "verdict": (report.verdict(real.result, synthetic.result, noise)
                           if synthetic.synthetic_seen else None)}
    chart = args.work_dir / "breakdown.png"
    report.write_chart(results, chart, unit)
    if args.output == "json":
        print(json.dumps({**report.as_json(results, advice, context), "chart": str(chart)}))
    else:
        print(report.as_text(results, advice, context) + f"\n\nchart: {chart}")
    return 0
