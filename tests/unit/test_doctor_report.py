"""The doctor's report: the verdict first, differences within the noise not called, progress
with the time left, the model chosen by device, a folder of splits named, a chart whose legend
covers no bar or label."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

from ringtrain.doctor.advice import Measurements, advise
from ringtrain.doctor.cli import _setup_notes, default_model
from ringtrain.doctor.progress import Progress
from ringtrain.doctor.report import as_text, chart_figure, verdict, within_noise
from ringtrain.doctor.trials import TrialResult

PHASES = {"data": 14.0, "h2d": 0.0, "forward_backward": 700.0, "communication": 40.0,
          "optimizer": 20.0, "other": 6.0, "step": 780.0}


def _trial(name: str, kind: str, ips: float, noise: float = 0.02, **phases: float) -> TrialResult:
    return TrialResult(name, kind, 1, ips, {**PHASES, **phases}, [780.0], 0, noise=noise)


def test_a_gap_within_the_noise_is_no_bottleneck_and_the_verdict_comes_first():
    synthetic, real = _trial("synthetic", "synthetic", 10.0), _trial("torchvision", "tv", 9.5)
    said = verdict(real, synthetic, noise=0.08)
    assert said.startswith("the input pipeline is not your bottleneck: data wait is 14 ms of "
                           "a 780 ms step")
    slow = _trial("torchvision", "tv", 6.0, data=300.0, step=1300.0)
    assert verdict(slow, synthetic, 0.08).startswith("the input pipeline is your bottleneck")
    text = as_text([synthetic, real], [], {"title": "t", "ceiling": "synthetic",
                                           "baseline": "torchvision", "noise": 0.08,
                                           "verdict": said})
    assert text.splitlines()[2] == f"verdict: {said}"
    assert within_noise(_trial("fix", "folder", 10.4), real, 0.1)
    assert not within_noise(_trial("fix", "folder", 12.0), real, 0.1)


def test_a_slowdown_inside_the_noise_is_not_advice():
    m = Measurements(32, 2, 1, 1, False, {**PHASES, "step": 705.6},
                     {**PHASES, "step": 780.0, "forward_backward": 770.0, "data": 14.0},
                     {"torchvision": 5.0, "folder": 2.0, "packed": 1.0}, 256)
    loud = advise(m)  # no noise known: 9 % slower compute reads as a finding
    assert any("slow training down" in a.message for a in loud)
    quiet = advise(Measurements(**{**m.__dict__, "noise": 0.12}))
    assert not any("slow training down" in a.message for a in quiet)
    assert "within the ±12% noise" in quiet[-1].message


def test_progress_says_the_time_left():
    now = [0.0]
    out = io.StringIO()
    progress = Progress(True, every_s=2.0, clock=lambda: now[0], out=out)
    progress.start("torchvision", 10)
    for done in range(1, 11):
        now[0] += 1.0
        progress.step(done)
    lines = out.getvalue().splitlines()
    assert lines[0] == "ringtrain doctor: trial torchvision: 10 steps"
    assert "trial torchvision: step 2/10, ~8 s left" in lines[1]
    assert lines[-1].endswith("done in 10 s") and len(lines) == 6


def test_the_model_follows_the_device_and_splits_are_not_classes():
    assert (default_model(False), default_model(True)) == ("small-cnn", "resnet50")
    args = argparse.Namespace(model=None, folder=Path("photos"))
    notes = _setup_notes(args, ["train", "val"], cuda=False)
    assert "small-cnn (no GPU here" in notes[0]
    assert "splits, not its classes; give photos/train" in notes[1]
    assert _setup_notes(argparse.Namespace(model="resnet50", folder=Path("p")),
                        ["cat", "dog"], False) == []


def test_the_legend_covers_no_bar_and_no_label():
    results = [_trial("synthetic", "synthetic", 10.0), _trial("torchvision", "tv", 6.0),
               _trial("ringtrain folder", "folder", 9.0)]
    fig = chart_figure(results)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (ax,) = fig.axes
    legend = fig.legends[0].get_window_extent(renderer)
    for artist in [*ax.texts, *ax.patches, ax]:
        assert not legend.overlaps(artist.get_window_extent(renderer)), artist
