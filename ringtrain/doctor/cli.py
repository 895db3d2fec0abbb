"""`ringtrain doctor FOLDER`: synthetic vs real data side by side, where the time goes, what to do.

Runs under any launcher (``ringtrain run -np 2 python -m ringtrain.doctor FOLDER``, or as a job's
command); ``ringtrain doctor -np 2 FOLDER`` launches itself that way. Each rank trains
``--steps`` steps of the model on: synthetic data (the ceiling), torchvision's ImageFolder +
DataLoader (the common baseline), then each fix the advice proposes (ringtrain's decoder, a
packed pre-resized copy, GPU decoding), and reports throughput, the gap to synthetic data, the
step breakdown averaged over ranks, the slowest rank and how much of the gap each fix closed.
By default this is the quick check (about 90 s at most: a sample of the images, at most 10
steps per trial, fewer when the time runs short); ``--full`` runs the full check (every image,
20 steps per trial, no time bound). See ringtrain.doctor.budget.

``ringtrain doctor -np 2 -- python train.py ARGS`` runs the user's own script instead, unchanged
(it needs ``hvd.DistributedOptimizer``): with its first batch fed again every step, then as it
is, ``--repeats`` times each (alternating), stopping it after ``--warmup`` + ``--steps`` steps;
the same report, every figure with its 95 % interval, from the step profiler its optimizer gets
(see ringtrain.torch.auto_profile). Model options do not apply there.
"""

from __future__ import annotations

import argparse
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_MODELS = ("resnet50", "small-cnn")
#: Runs of each trial of a script: three give a Student t of 4.3 for the 95 % interval, where
#: two give 12.7 (an interval too wide to call anything).
DEFAULT_REPEATS = 3
#: Measured and warm-up steps of each run of a command after ``--``.
SCRIPT_STEPS, SCRIPT_WARMUP = 20, 3


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The options, and the user's script command (after ``--``; empty: none)."""
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="ringtrain doctor", description=__doc__.splitlines()[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                usage="%(prog)s [options] FOLDER | %(prog)s [options] -- "
                                      "COMMAND ...")
    p.add_argument("folder", type=Path, nargs="?",
                   help="image folder in ImageNet's layout (FOLDER/<class>/)")
    p.add_argument("-np", "--num-proc", type=int, default=None,
                   help="launch this many ranks on this host with `ringtrain run`")
    p.add_argument("--model", choices=_MODELS, default=None,
                   help="resnet50 (the reference; default with a GPU) or small-cnn (CPU-sized; "
                        "default without one)")
    p.add_argument("--batch-size", type=int, default=32, help="images per rank per step (32)")
    p.add_argument("--size", type=int, default=224, help="crop side in pixels (224)")
    p.add_argument("--steps", type=int, default=None,
                   help="measured steps per trial (a FOLDER's quick check: at most 10, fewer "
                        "when its time runs short; --full or a command: 20)")
    p.add_argument("--warmup", type=int, default=None,
                   help="unmeasured steps first (a FOLDER's quick check: 2; --full or a "
                        "command: 3)")
    p.add_argument("--full", action="store_true",
                   help="with a FOLDER: the full check: every image read (and packed), 20 "
                        "steps per trial, no time bound (minutes on a CPU)")
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="with a FOLDER: the quick check's bound on the whole run (90)")
    p.add_argument("--workers", type=int, default=None,
                   help="loader workers of the baseline (default: cores per rank - 1)")
    p.add_argument("--packed", type=Path, default=None,
                   help="a packed copy of FOLDER (`ringtrain data pack`); default: made in "
                        "--work-dir when the advice asks for one")
    p.add_argument("--work-dir", type=Path, default=Path("doctor"),
                   help="where the chart and a packed copy go (./doctor)")
    p.add_argument("--no-try", action="store_true", help="advise without trying the advice")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU)")
    p.add_argument("--repeats", type=int, default=None,
                   help="with a command: runs of each trial, alternating, for the 95 %% "
                        "intervals (default 3; 1: from windows of steps within each run)")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="with a command: seconds each run of it may take (1800)")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    _add_forecast_options(p)
    args = p.parse_args(argv)
    _check_mode(p, args, command)
    if min(args.batch_size, args.size, args.steps) < 1 or args.warmup < 0:
        p.error("--batch-size, --size and --steps must be positive, --warmup not negative")
    if args.num_proc is not None and args.num_proc < 1:
        p.error("-np must be positive")
    if args.timeout <= 0:
        p.error("--timeout must be positive")
    if (args.folder is None) == (not command):
        p.error("give an image FOLDER, or your training command after `--` "
                "(e.g. `ringtrain doctor -np 2 -- python train.py`), not both")
    _check_forecast_options(p, args, command)
    _check_repeats(p, args, command)
    return args, command


def _check_mode(p: argparse.ArgumentParser, args: argparse.Namespace,
                command: list[str]) -> None:
    """Check ``--full`` and ``--budget``, put the steps' defaults in ``args`` and a FOLDER's
    :class:`~ringtrain.doctor.budget.Check` in ``args.check`` (``None`` with a command)."""
    from ringtrain.doctor import budget

    args.check = None
    if command:
        if args.full or args.budget is not None:
            p.error("--full and --budget apply to an image FOLDER (a command's runs are "
                    "bounded by --steps, --repeats and --timeout)")
        args.steps = SCRIPT_STEPS if args.steps is None else args.steps
        args.warmup = SCRIPT_WARMUP if args.warmup is None else args.warmup
        return
    if args.full and args.budget is not None:
        p.error("--full has no time bound: leave out --budget (which bounds the quick check)")
    if args.budget is not None and args.budget <= 0:
        p.error("--budget must be positive")
    steps, warmup = ((budget.FULL_STEPS, budget.FULL_WARMUP) if args.full
                     else (budget.QUICK_STEPS, budget.QUICK_WARMUP))
    args.steps = steps if args.steps is None else args.steps
    args.warmup = warmup if args.warmup is None else args.warmup
    args.check = budget.Check(args.full, args.steps, args.warmup, None if args.full else (
        budget.QUICK_BUDGET_S if args.budget is None else args.budget))


def full_command(argv: list[str], ranks: int) -> str:
    """The command line of the full check of the run given ``argv``: the same options with
    ``--full`` and without ``--budget`` (``-np`` added for a run of several ranks that was
    launched without it, e.g. under ``ringtrain run``)."""
    rest, skip = [], False
    for token in argv:
        if skip or token.startswith("--budget="):
            skip = False
            continue
        if token == "--budget":
            skip = True
            continue
        rest.append(token)
    if ranks > 1 and "-np" not in rest and "--num-proc" not in rest:
        rest = ["-np", str(ranks), *rest]
    return shlex.join(["ringtrain", "doctor", "--full", *rest])


def _check_repeats(p: argparse.ArgumentParser, args: argparse.Namespace,
                   command: list[str]) -> None:
    """Check ``--repeats`` and put its default in ``args.repeats``."""
    if args.repeats is not None and (not command or args.forecast_spec is not None):
        p.error("--repeats applies to a command after `--` without --forecast (an image "
                "FOLDER's trials measure their noise by running synthetic data twice)")
    args.repeats = DEFAULT_REPEATS if args.repeats is None else args.repeats
    if args.repeats < 1:
        p.error("--repeats must be positive")
    if args.repeats == 1 and args.steps < 2:
        p.error("--repeats 1 measures the noise from windows of each run's steps: give "
                "--steps 2 or more")


# -- the scaling forecast (ringtrain.doctor.forecast) -------------------------------------------

def _add_forecast_options(p: argparse.ArgumentParser) -> None:
    from ringtrain.doctor.network_profiles import NAMES

    g = p.add_argument_group("scaling forecast (with a command after `--`)")
    g.add_argument("--forecast", metavar="SIZES", default=None,
                   help="forecast throughput, scaling efficiency and the limit at these numbers "
                        "of workers (e.g. 2,4,8,16,32) from 1-process runs, and run the sizes "
                        "that fit on this host to check it")
    g.add_argument("--network", choices=[*NAMES, "measured"], default="25gbit",
                   help="between hosts: a named profile (its assumptions are printed) or the "
                        "allreduce measured here (default 25gbit)")
    g.add_argument("--per-host", type=int, default=None, metavar="N",
                   help="workers per host (default: this host's GPUs, or its cores for CPU "
                        "training)")
    g.add_argument("--strategies", default="ring,hierarchical,ps",
                   help="ring, hierarchical, ps (one server per host) or ps:K, comma-separated "
                        "(default ring,hierarchical,ps)")
    g.add_argument("--no-check", action="store_true",
                   help="forecast only: do not run the sizes that fit on this host")


def _check_forecast_options(p: argparse.ArgumentParser, args: argparse.Namespace,
                            command: list[str]) -> None:
    """Parse ``--forecast``'s values into ``args.forecast_spec`` (``None``: no forecast)."""
    from ringtrain.doctor.forecast import ForecastSpec
    from ringtrain.doctor.forecast_model import Strategy

    args.forecast_spec = None
    if args.forecast is None:
        return
    if not command:
        p.error("--forecast needs your training command after `--`")
    if args.num_proc is not None:
        p.error("--forecast measures 1 process and launches the sizes it checks itself: "
                "leave out -np")
    if args.per_host is not None and args.per_host < 1:
        p.error("--per-host must be positive")
    try:
        sizes = ForecastSpec.parse_sizes(args.forecast)
        strategies = tuple(Strategy.parse(s.strip()) for s in args.strategies.split(",")
                           if s.strip())
    except ValueError as e:
        p.error(str(e))
    if not strategies:
        p.error("--strategies names none")
    args.forecast_spec = ForecastSpec(sizes, args.per_host, args.network, strategies,
                                      not args.no_check)


def main(argv: list[str]) -> int:
    """Run the doctor on this rank, or launch ``-np`` ranks of it."""
    from ringtrain.contract.env import read_worker_env

    started = time.monotonic()  # the quick check's budget bounds the whole run, imports too
    args, command = parse_args(argv)
    if command:
        if read_worker_env().launcher != "none":
            print("ringtrain doctor: with a command after `--` the doctor launches it itself; "
                  "run it from a shell (with -np N for N ranks), not under a launcher",
                  file=sys.stderr)
            return 2
        if args.forecast_spec is not None:
            from ringtrain.doctor.forecast import doctor_forecast

            return doctor_forecast(args, command, args.forecast_spec)
        from ringtrain.doctor.script import doctor_script

        return doctor_script(args, command)
    if args.num_proc is not None and read_worker_env().launcher == "none":
        rest = list(argv)
        i = rest.index("-np") if "-np" in rest else rest.index("--num-proc")
        del rest[i:i + 2]
        command = [sys.executable, "-m", "ringtrain.cli", "run", "-np", str(args.num_proc),
                   sys.executable, "-m", "ringtrain.doctor", *rest]
        return subprocess.run(command, check=False).returncode
    from ringtrain.errors import RingtrainError

    try:
        return _doctor(args, argv, started)
    except RingtrainError as e:  # a folder that is not an image folder, a bad packed copy
        print(f"ringtrain doctor: {e}", file=sys.stderr)
        return 2


def _doctor(args: argparse.Namespace, argv: list[str], started: float) -> int:
    import torch

    import ringtrain.torch as hvd
    from ringtrain.data.image_folder import ImageFolder
    from ringtrain.data.tuning import cores_per_rank
    from ringtrain.doctor.budget import Budget
    from ringtrain.doctor.progress import Progress
    from ringtrain.doctor.trials import Workload

    hvd.init()
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{hvd.local_rank()}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    folder = ImageFolder(args.folder)
    classes = folder.classes
    if hvd.rank() == 0:
        for line in _setup_notes(args, classes, cuda):
            print(f"ringtrain doctor: {line}", file=sys.stderr, flush=True)
    args.model = args.model or default_model(cuda)
    if len(folder) < args.batch_size * hvd.size():
        if hvd.rank() == 0:
            print(f"ringtrain doctor: {args.folder} has fewer images than one step needs "
                  f"({args.batch_size} x {hvd.size()} ranks): lower --batch-size",
                  file=sys.stderr)
        hvd.shutdown()
        return 2
    sample, check_report = _check_images(args, argv, len(folder), hvd.size())
    if hvd.rank() == 0:
        print(f"ringtrain doctor: {_check_note(check_report)}", file=sys.stderr, flush=True)
    model = build_model(args.model, len(classes)).to(device)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    cores = cores_per_rank(hvd.local_size())
    work = Workload(model, optimizer, device, args.batch_size, args.size, args.steps,
                    args.warmup, args.folder, cores, args.packed, len(classes), args.bf16,
                    sample)
    results: list = []
    stop = signal.signal(signal.SIGTERM, _interrupt)  # `ringtrain run` stops ranks so
    try:
        return _trials(args, work, results, Progress(hvd.rank() == 0),
                       Budget(args.check.budget_s, started), check_report)
    except KeyboardInterrupt:
        if hvd.rank() == 0:
            _report_interrupted(args, results, device)
        return 130
    finally:
        signal.signal(signal.SIGTERM, stop)


def _check_images(args: argparse.Namespace, argv: list[str], images: int,
                  ranks: int) -> tuple[list[int] | None, dict]:
    """The indices of the images the check reads (``None``: every one), and what the report
    says of the check."""
    from ringtrain.doctor.budget import sample_size

    check, sample = args.check, None
    if not check.full:  # the same random images on every rank (a fixed seed)
        n = sample_size(images, warmup=check.warmup, steps=check.steps,
                        batch_size=args.batch_size, ranks=ranks)
        sample = sorted(random.Random(0).sample(range(images), n)) if n < images else None
    return sample, {"mode": "full" if check.full else "quick", "budget_s": check.budget_s,
                    "max_steps": check.steps, "warmup": check.warmup,
                    "images": images if sample is None else len(sample), "of_images": images,
                    "not_tried": [],
                    "full_command": None if check.full else full_command(argv, ranks)}


def _interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt


def _report_interrupted(args: argparse.Namespace, results: list, device) -> None:
    """What the trials finished before Ctrl-C (or the launcher's stop) measured."""
    from ringtrain.doctor import report

    if not results:
        print("ringtrain doctor: interrupted before the first trial ended; nothing measured",
              file=sys.stderr)
        return
    context = {"title": f"{args.model} on {args.folder}, interrupted after {len(results)} "
                        f"trial(s), {device}",
               "ceiling": max((r for r in results if r.data == "synthetic"),
                              key=lambda r: r.images_per_second, default=results[0]).name}
    print(report.as_text(results, [], context), flush=True)


def _trials(args: argparse.Namespace, work, results: list, progress, budget,
            check: dict) -> int:
    """Run the trials (each result appended to ``results``), then report on rank 0."""
    import ringtrain.torch as hvd
    from ringtrain.doctor.advice import TrialSpec
    from ringtrain.doctor.budget import fits, trial_steps
    from ringtrain.doctor.trials import run_trial

    baseline_workers = args.workers if args.workers is not None else max(1, work.cores - 1)
    pack_size = round(args.size / 0.875)

    def plan(trials_left: int):
        """The measured steps of a trial with ``trials_left`` trials to go (itself included)."""
        def steps(step_s: float | None) -> int:
            if step_s is None:  # no warm-up step was timed: the slowest step measured so far
                step_s = max((r.breakdown_ms["step"] for r in results), default=0.0) / 1e3
            return trial_steps(budget.left_s(), step_s, trials_left, warmup=work.warmup,
                               steps=work.steps)
        return steps

    # The fixes are not known before the advice: the first trials leave time for as many as
    # it may try (a packed copy and ringtrain's decoder; GPU decoding too with CUDA).
    fixes = 0 if args.no_try else (3 if work.device.type == "cuda" else 2)
    synthetic = run_trial(TrialSpec("synthetic", "synthetic"), work, progress, plan(3 + fixes))
    results.append(synthetic)
    baseline = run_trial(TrialSpec("torchvision", "torchvision", baseline_workers), work,
                         progress, plan(2 + fixes))
    results.append(baseline)
    # Synthetic data again: what two runs of one trial differ by is the noise no finding may
    # hide in (load drifting on the machine included).
    again = run_trial(TrialSpec("synthetic (again)", "synthetic"), work, progress,
                      plan(1 + fixes))
    results.append(again)
    noise = max(abs(synthetic.images_per_second - again.images_per_second)
                / max(synthetic.images_per_second, again.images_per_second),
                synthetic.noise, again.noise, baseline.noise)
    advice = _advise(args, work, synthetic, baseline, noise, baseline_workers, pack_size)
    tries = [a.trial for a in ([] if args.no_try else advice) if a.trial is not None]
    for i, trial in enumerate(tries):
        # A fix takes its warm-up and at least MIN_STEPS steps of about the baseline's length:
        # one that no longer fits in the budget is advised, not tried (rank 0 decides for all).
        if not hvd.broadcast_object(fits(budget.left_s(), baseline.breakdown_ms["step"] / 1e3,
                                         warmup=work.warmup),
                                    root_rank=0, name=f"doctor.fits.{trial.name}"):
            check["not_tried"].append(trial.name)
            continue
        if trial.data == "packed" and work.packed is None:
            out = args.work_dir / (f"packed-{pack_size}" if work.sample is None
                                   else f"packed-{pack_size}-sample")
            work.packed = _pack(args.folder, out, pack_size, work.sample)
        results.append(run_trial(trial, work, progress, plan(len(tries) - i)))
    _report(args, work, results, advice, baseline, noise, check)
    hvd.shutdown()
    return 0


def _advise(args: argparse.Namespace, work, synthetic, baseline, noise: float,
            baseline_workers: int, pack_size: int) -> list:
    """Rank 0's advice from the first trials and every rank's decoding costs, on every rank."""
    import ringtrain.torch as hvd
    from ringtrain.data.tuning import worker_budget
    from ringtrain.doctor.advice import Measurements, advise

    cuda = work.device.type == "cuda"
    # Every rank measures decoding at once (so cores are as busy as in training); rank 0
    # advises, and every rank gets its advice, so that all run the same trials.
    costs = hvd.allgather_object(_decode_costs(args.folder, args.packed, args.size, pack_size))
    advice = None
    if hvd.rank() == 0:
        advice = advise(Measurements(
            args.batch_size, work.cores, worker_budget(work.cores, cpu_training=not cuda),
            baseline_workers, cuda, synthetic.breakdown_ms, baseline.breakdown_ms,
            {k: sum(c[k] for c in costs) / len(costs) for k in costs[0]}, pack_size, noise))
    return hvd.broadcast_object(advice, root_rank=0)


def _report(args: argparse.Namespace, work, results: list, advice: list, baseline,
            noise: float, check: dict) -> None:
    """How much of the gap each trial closed, then the report and its chart from rank 0."""
    import ringtrain.torch as hvd
    from ringtrain.doctor import report

    ceiling = max((r for r in results if r.data == "synthetic"),
                  key=lambda r: r.images_per_second)
    for r in results:
        if r.data != "synthetic":
            r.gap_closed = report.gap_closed(r, baseline, ceiling)
    if hvd.rank() != 0:
        return
    more = ("measure longer (--steps)" if check["mode"] == "full" else
            f"run the full check ({check['full_command']})")
    title = (f"{args.model} on {args.folder}, {hvd.size()} rank(s), batch "
             f"{args.batch_size} per rank, {args.size} px, {work.device}")
    context = {"title": title, "model": args.model, "folder": str(args.folder),
               "ranks": hvd.size(), "ceiling": ceiling.name, "baseline": baseline.name,
               "noise": noise, "verdict": report.verdict(baseline, ceiling, noise, more),
               "batch_size": args.batch_size, "size": args.size, "device": str(work.device),
               "cores_per_rank": work.cores, "check": check}
    print(report.render(results, advice, context, args.work_dir, args.output))


def _check_note(check: dict) -> str:
    """What rank 0 says of the check before the trials: quick (bounded, and how to run the
    full one) or full."""
    if check["mode"] == "full":
        return (f"full check: all {check['images']} images, {check['max_steps']} measured "
                "steps per trial, no time bound")
    return (f"quick check: {check['images']} of {check['of_images']} images, at most "
            f"{check['max_steps']} measured steps per trial, {check['budget_s']:.0f} s at most; "
            f"the full check: {check['full_command']}")


def default_model(cuda: bool) -> str:
    """ResNet-50 (the reference) on a GPU; the small CNN on a CPU, where a ResNet-50 step of
    32 images takes seconds and a trial minutes."""
    return "resnet50" if cuda else "small-cnn"


def _setup_notes(args: argparse.Namespace, classes: list[str], cuda: bool) -> list[str]:
    """What rank 0 says before the trials: the model chosen and why, a folder whose "classes"
    are a data set's splits."""
    notes = []
    if args.model is None:
        why = ("a GPU is here" if cuda else
               "no GPU here: a ResNet-50 trial takes minutes on a CPU; --model resnet50 to "
               "measure it anyway")
        notes.append(f"model {default_model(cuda)} ({why})")
    splits = {"train", "val", "valid", "validation", "test"}
    if classes and set(classes) <= splits:
        notes.append(f"warning: the class folders of {args.folder} are {', '.join(classes)}: "
                     f"those are a data set's splits, not its classes; give "
                     f"{args.folder / classes[0]} (FOLDER/<class>/<image>)")
    return notes


def build_model(name: str, num_classes: int):
    """The doctor's model by name: ``resnet50`` or ``small-cnn``."""
    if name == "resnet50":
        from ringtrain.models.resnet import resnet50

        return resnet50(num_classes=num_classes)
    from ringtrain.models.small_cnn import SmallCNN

    return SmallCNN(num_classes)


def _decode_costs(folder: Path, packed: Path | None, size: int, pack_size: int) -> dict:
    """CPU ms per image for the baseline, ringtrain's decoder and a packed copy (a sample of 32
    images packed into a temporary folder when no packed copy is given)."""
    from torch.utils.data import Subset

    from ringtrain.data.classification import ClassificationImages
    from ringtrain.data.image_folder import ImageFolder
    from ringtrain.data.packed import PackedImages, write_packed
    from ringtrain.data.tuning import measure_decode_ms
    from ringtrain.doctor.trials import torchvision_dataset

    source = ImageFolder(folder)
    sample = sorted(random.Random(0).sample(range(len(source)), min(32, len(source))))
    costs = {
        "torchvision": measure_decode_ms(Subset(torchvision_dataset(folder, size), sample)),
        "folder": measure_decode_ms(Subset(ClassificationImages(source, size), sample)),
    }
    with tempfile.TemporaryDirectory() as tmp:
        if packed is None:
            packed = Path(tmp) / "sample"
            write_packed((source.read(i) for i in sample), packed, classes=source.classes,
                         size=pack_size)
        costs["packed"] = measure_decode_ms(ClassificationImages(PackedImages(packed), size))
    return costs


def _pack(folder: Path, out: Path, size: int, sample: list[int] | None = None) -> Path:
    """A packed copy of ``folder``, or of its images ``sample`` only, made by local rank 0 of
    each host. A whole copy is reused when present; a sample's is made again every run (it
    follows the folder and the options, and takes seconds)."""
    import ringtrain.torch as hvd
    from ringtrain.data.image_folder import ImageFolder
    from ringtrain.data.packed import write_packed

    if hvd.local_rank() == 0 and (sample is not None or not (out / "meta.json").exists()):
        if sample is not None:
            shutil.rmtree(out, ignore_errors=True)
        source = ImageFolder(folder)
        indices = range(len(source)) if sample is None else sample
        write_packed((source.read(i) for i in indices), out, classes=source.classes,
                     size=size)
    hvd.barrier()
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
