"""Real data against synthetic data on image files, with torchvision's loader beside it.

    python benchmarks/input_pipeline.py [--np 2] [--model small-cnn] [--size 128] [--rounds 3]

Makes a folder of real photographs (`ringtrain data photos`, JPEG crops of the deepforest
aerial images) and a packed copy of it (`ringtrain data pack`) in a temporary folder unless
``--folder``/``--packed`` are given, then trains the model under `ringtrain run -np N` fed by:
synthetic data (the ceiling), torchvision's ImageFolder + DataLoader (the common baseline, one
worker per rank as a user would start), ringtrain's pipeline on the JPEG files and on the packed
copy (workers chosen by ringtrain.data.tuning). The trials are interleaved for ``--rounds``
rounds, so that the machine's load drifts over all of them alike; ``vs_synthetic`` is the median
over rounds of each trial's images/s over that round's synthetic run. One JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launch import launch_json

_TRIALS = (("synthetic", "synthetic", None), ("torchvision", "torchvision", 1),
           ("ringtrain_files", "folder", None), ("ringtrain_packed", "packed", None))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--model", choices=["small-cnn", "resnet50"], default="small-cnn")
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--photos", type=int, default=600, help="photos to make when no --folder")
    p.add_argument("--folder", type=Path)
    p.add_argument("--packed", type=Path)
    p.add_argument("--bf16", action="store_true")
    args = p.parse_args()
    if args.worker:
        return _worker(args)
    with tempfile.TemporaryDirectory() as tmp:
        folder, packed = args.folder, args.packed
        if folder is None:
            _ringtrain("data", "photos", f"{tmp}/photos", "--count", str(args.photos))
            folder = Path(tmp) / "photos" / "train"
        if packed is None:
            _ringtrain("data", "pack", str(folder), f"{tmp}/packed", "--size",
                       str(round(args.size / 0.875)))
            packed = Path(tmp) / "packed"
        worker_args = _without_paths(sys.argv[1:]) + ["--folder", str(folder), "--packed",
                                                      str(packed)]
        t0 = time.time()
        result = launch_json(__file__, args.np, worker_args)
    result.update(ranks=args.np, machine=platform.machine(), wall_s=round(time.time() - t0, 1),
                  date=time.strftime("%Y-%m-%d"))
    print(json.dumps(result))
    return 0


def _without_paths(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--folder", "--packed", "--np"):
            skip = True
        else:
            out.append(a)
    return out


def _ringtrain(*argv: str) -> None:
    subprocess.run([sys.executable, "-m", "ringtrain.cli", *argv], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _worker(args: argparse.Namespace) -> int:
    import torch

    import ringtrain.torch as hvd
    from ringtrain.data.image_folder import ImageFolder
    from ringtrain.data.tuning import cores_per_rank
    from ringtrain.doctor.advice import TrialSpec
    from ringtrain.doctor.cli import build_model
    from ringtrain.doctor.trials import Workload, run_trial

    hvd.init()
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{hvd.local_rank()}" if cuda else "cpu")
    classes = ImageFolder(args.folder).classes
    model = build_model(args.model, len(classes)).to(device)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    work = Workload(model, optimizer, device, args.batch_size, args.size, args.steps,
                    args.warmup, args.folder, cores_per_rank(hvd.local_size()), args.packed,
                    len(classes), args.bf16)
    rates: dict[str, list[float]] = {name: [] for name, _, _ in _TRIALS}
    breakdowns: dict[str, list[dict]] = {name: [] for name, _, _ in _TRIALS}
    workers: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, data, n in _TRIALS:
            r = run_trial(TrialSpec(name, data, n), work)
            rates[name].append(r.images_per_second)
            breakdowns[name].append(r.breakdown_ms)
            workers[name] = r.workers
    median = {name: statistics.median(v) for name, v in rates.items()}
    # Where the gap goes: each phase's median over rounds (so one disturbed round does not
    # pass for a phase's cost).
    phases = {name: {k: round(statistics.median(b[k] for b in rounds), 1) for k in rounds[0]}
              for name, rounds in breakdowns.items()}
    # Paired by round: each trial against the synthetic run of its own round, so that the load
    # of the moment cancels out.
    paired = {name: statistics.median(r / s for r, s in zip(v, rates["synthetic"]))
              for name, v in rates.items()}
    if hvd.rank() == 0:
        print(json.dumps({
            "model": args.model, "size": args.size, "batch_size": args.batch_size,
            "device": str(device), "images": len(ImageFolder(args.folder)),
            "img_per_s": {k: round(v, 1) for k, v in median.items()},
            "vs_synthetic": {k: round(v, 3) for k, v in paired.items()},
            "all_img_per_s": {k: [round(x, 1) for x in v] for k, v in rates.items()},
            "workers": workers, "median_breakdown_ms": phases}))
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
