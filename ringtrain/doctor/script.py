"""``ringtrain doctor [-np N] -- SCRIPT ...``: the doctor on the user's own training script.

Two trials, each run ``--repeats`` times, unchanged, with the variables of
:mod:`ringtrain.torch.auto_profile` set: fed its first batch again at every step (the
synthetic-data ceiling), and as it is. The runs alternate between the trials, so that load
drifting on the machine weighs on both alike. The script's ``DistributedOptimizer`` profiles
every step into ``steps.rank<N>.jsonl`` files in the run's folder;
:mod:`ringtrain.doctor.script_results` reads them back into figures with 95 % intervals.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ringtrain.doctor.progress import Progress
from ringtrain.doctor.script_results import ScriptRun, ScriptRunError, read_run, trial_result
from ringtrain.doctor.trials import TrialResult
from ringtrain.torch.auto_profile import PROFILE_VAR, STEPS_VAR, SYNTHETIC_VAR
from ringtrain.torch.step_profiler import METRICS_DIR_VAR


def run_script(command: list[str], num_proc: int | None, out: Path, *, synthetic: bool,
               steps: int, timeout_s: float, progress: Progress | None = None,
               label: str | None = None) -> None:
    """Run ``command`` (under ``ringtrain run -np num_proc`` when given) with step profiling on,
    writing the step records to ``out`` (emptied first) and stopping after ``steps`` steps;
    ``label`` names the run in progress lines (default: which data it is fed).

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
    progress.start(label or f"{kind} run", steps)
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


def doctor_script(args: argparse.Namespace, command: list[str]) -> int:
    """Run the script's trials ``args.repeats`` times each, and report as the doctor does;
    returns 0, 1 when a run of the script failed or trained no visible step, 130 on Ctrl-C
    (what was measured so far is printed)."""
    runs: dict[str, list[ScriptRun]] = {"synthetic": [], "real": []}
    # Ctrl-C stops the trials and reports them, also when this process was started with SIGINT
    # ignored (a background job of a shell), which Python would otherwise keep.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _run_trials(args, command, runs)
        return _report(args, command, runs)
    except ScriptRunError as e:
        print(f"ringtrain doctor: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"ringtrain doctor: interrupted; measured so far: {_so_far(runs)}",
              file=sys.stderr)
        return 130


def _run_trials(args: argparse.Namespace, command: list[str],
                runs: dict[str, list[ScriptRun]]) -> None:
    """Synthetic, real, synthetic, real, ...: ``args.repeats`` runs of each into ``runs``."""
    progress = Progress(True)
    for name in runs:  # no run of an earlier doctor may be read as one of this one's
        shutil.rmtree(args.work_dir / name, ignore_errors=True)
    for i in range(1, args.repeats + 1):
        for name, synthetic in (("synthetic", True), ("real", False)):
            if synthetic and runs[name] and not runs[name][0].synthetic_seen:
                continue  # the hook replaced no batch: repeating it would measure nothing new
            out = args.work_dir / name / f"run{i}"
            run_script(command, args.num_proc, out, synthetic=synthetic,
                       steps=args.warmup + args.steps, timeout_s=args.timeout,
                       progress=progress, label=f"{name}-data run {i}/{args.repeats}")
            runs[name].append(read_run(out, args.warmup))


def _measured(runs: dict[str, list[ScriptRun]]) -> tuple[dict[str, list[ScriptRun]], bool]:
    """The trials worth reporting (no synthetic one when its hook replaced no batch: those
    runs fed real data), and whether their rates are in samples (else steps) per second."""
    synthetic = runs["synthetic"]
    kept = {name: r for name, r in runs.items() if r and (
        name != "synthetic" or synthetic[0].synthetic_seen)}
    return kept, all(run.samples_known for r in kept.values() for run in r)


def _so_far(runs: dict[str, list[ScriptRun]]) -> str:
    """The trials finished before Ctrl-C, each with what its runs can say."""
    kept, samples_known = _measured(runs)
    unit = "img/s" if samples_known else "steps/s"
    said = []
    for name, trial_runs in kept.items():
        try:
            r = trial_result(name, name, trial_runs, samples_known)
        except ScriptRunError:
            said.append(f"{name}: {len(trial_runs)} run(s), too few steps for a figure")
            continue
        said.append(f"{name}: {r.images_per_second:.1f} ± {r.images_per_second * r.noise:.1f} "
                    f"{unit} ({len(trial_runs)} run(s)), data wait {_ms(r, 'data')} of a "
                    f"{_ms(r, 'step')} ms step")
    return "; ".join(said) or "nothing"


def _ms(r: TrialResult, phase: str) -> str:
    return f"{r.breakdown_ms[phase]:.1f} ± {r.breakdown_half_ms[phase]:.1f}"


def _report(args: argparse.Namespace, command: list[str],
            runs: dict[str, list[ScriptRun]]) -> int:
    import math

    import torch

    from ringtrain.data.tuning import cores_per_rank, worker_budget
    from ringtrain.doctor import report
    from ringtrain.doctor.advice import ScriptMeasurements, advise_script

    kept, samples_known = _measured(runs)
    trials = {name: trial_result(name, name, r, samples_known) for name, r in kept.items()}
    real, synthetic = trials["real"], trials.get("synthetic")
    results = [t for t in (synthetic, real) if t is not None]
    cores = cores_per_rank(args.num_proc or 1)
    # The script's device is not recorded: a host with CUDA is taken to train on it.
    budget = worker_budget(cores, cpu_training=not torch.cuda.is_available())
    # The relative interval of real / synthetic speed: what a difference must exceed.
    noise = math.hypot(real.noise, synthetic.noise) if synthetic else real.noise
    advice = advise_script(ScriptMeasurements(
        real.breakdown_ms, synthetic.breakdown_ms if synthetic else None, real.workers, cores,
        budget, noise, real.breakdown_half_ms,
        synthetic.breakdown_half_ms if synthetic else {}))
    unit = "img/s" if samples_known else "steps/s"
    ranks = len(real.step_ms_per_rank)  # the script may launch its own ranks
    repeats = len(kept["real"])
    batch = {r["samples"] for run in kept["real"] for records in run.ranks for r in records
             if samples_known}
    context = {"title": (f"{' '.join(command)}, {ranks} rank(s)"
                         + (f", batch {batch.pop()} per rank" if len(batch) == 1 else "")
                         + f", {args.steps} measured step(s) x {repeats} run(s) per trial"),
               "command": command, "ranks": ranks, "ceiling": "synthetic" if synthetic else "real",
               "rate_unit": unit, "baseline": "real", "noise": noise, "repeats": repeats,
               "noise_from": (f"{repeats} runs of each trial" if repeats > 1 else
                              f"{len(real.rates)} windows of consecutive steps in its one run"),
               "verdict": report.verdict(real, synthetic, noise) if synthetic else None}
    print(report.render(results, advice, context, args.work_dir, args.output, unit))
    return 0
