"""The quick check's bounds (ringtrain.doctor.budget): each trial's share of the time left, the
fewest steps kept when the budget is spent, the image sample, the options that choose the
check, and what the report says of it (the images and steps used, the command of the full
check)."""

from __future__ import annotations

import io
import math

import pytest

from ringtrain.doctor.advice import Advice, TrialSpec
from ringtrain.doctor.budget import (
    FULL_STEPS,
    FULL_WARMUP,
    MIN_STEPS,
    QUICK_BUDGET_S,
    QUICK_STEPS,
    QUICK_WARMUP,
    REPORT_RESERVE_S,
    Budget,
    Check,
    fits,
    sample_size,
    trial_steps,
)
from ringtrain.doctor.cli import full_command, parse_args
from ringtrain.doctor.progress import Progress
from ringtrain.doctor.report import as_json, as_text
from ringtrain.doctor.trials import TrialResult


def test_a_trial_gets_its_share_of_the_time_left_within_its_bounds():
    # 60 s for 3 trials of 1 s steps, 2 warm-up steps each for the 2 later ones: (60 - 4) / 3
    assert trial_steps(60.0, 1.0, 3, warmup=2, steps=100) == 18
    assert trial_steps(60.0, 1.0, 3, warmup=2, steps=10) == 10  # never more than asked
    assert trial_steps(math.inf, 5.0, 3, warmup=2, steps=20) == 20  # the full check
    # A spent budget (or one too short for anything) still measures the fewest steps.
    assert trial_steps(-3.0, 1.0, 2, warmup=2, steps=10) == MIN_STEPS
    assert trial_steps(1.0, 1.0, 5, warmup=2, steps=10) == MIN_STEPS
    assert trial_steps(-3.0, 1.0, 2, warmup=2, steps=2) == 2  # fewer asked: fewer kept
    assert fits(10.0, 2.0, warmup=2) and not fits(9.9, 2.0, warmup=2)


def test_the_sample_is_what_one_trial_reads_and_the_clock_counts_down():
    assert sample_size(1000, warmup=2, steps=10, batch_size=32, ranks=1) == 384
    assert sample_size(1000, warmup=2, steps=10, batch_size=32, ranks=4) == 1000
    now = [100.0]
    budget = Budget(90.0, started=95.0, clock=lambda: now[0])
    assert budget.left_s() == 90.0 - 5.0 - REPORT_RESERVE_S
    now[0] = 200.0
    assert budget.left_s() < 0
    assert Budget(None, clock=lambda: now[0]).left_s() == math.inf


def test_the_options_choose_the_quick_or_the_full_check(capsys):
    quick, _ = parse_args(["photos"])
    assert quick.check == Check(False, QUICK_STEPS, QUICK_WARMUP, QUICK_BUDGET_S)
    full, _ = parse_args(["--full", "photos"])
    assert full.check == Check(True, FULL_STEPS, FULL_WARMUP, None)
    assert parse_args(["--budget", "30", "--steps", "4", "photos"])[0].check == Check(
        False, 4, QUICK_WARMUP, 30.0)
    script, _ = parse_args(["--", "python", "train.py"])  # a command's runs are unchanged
    assert (script.check, script.steps, script.warmup) == (None, 20, 3)
    for argv, said in ((["--full", "--budget", "9", "photos"], "--full has no time bound"),
                       (["--budget", "0", "photos"], "--budget must be positive"),
                       (["--full", "--", "python", "t.py"], "apply to an image FOLDER")):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert said in capsys.readouterr().err


def test_the_full_command_keeps_the_options_but_the_budget():
    assert full_command(["photos", "--budget", "30", "--size", "64"], 1) == (
        "ringtrain doctor --full photos --size 64")
    assert full_command(["--budget=30", "my photos"], 2) == (
        "ringtrain doctor --full -np 2 'my photos'")
    assert full_command(["-np", "2", "photos"], 2) == "ringtrain doctor --full -np 2 photos"


def _result(name: str, data: str, steps: int) -> TrialResult:
    phases = {"data": 1.0, "h2d": 0.0, "forward_backward": 8.0, "communication": 0.0,
              "optimizer": 1.0, "other": 0.0, "step": 10.0}
    return TrialResult(name, data, 0, 100.0, phases, [10.0], 0, measured_steps=steps)


def test_the_report_states_the_images_and_steps_used_and_how_to_run_the_full_check():
    results = [_result("synthetic", "synthetic", 10), _result("torchvision", "torchvision", 4)]
    advice = [Advice("pre-resize", TrialSpec("packed", "packed", 1))]
    check = {"mode": "quick", "budget_s": 90.0, "max_steps": 10, "warmup": 2, "images": 48,
             "of_images": 80, "not_tried": ["packed"],
             "full_command": "ringtrain doctor --full photos"}
    context = {"title": "t", "ceiling": "synthetic", "baseline": "torchvision", "check": check}
    text = as_text(results, advice, context)
    assert "  - pre-resize [not tried: packed]" in text
    assert ("quick check (bounded to 90 s): 48 of 80 images (a random sample); measured steps "
            "per trial (at most 10): synthetic 10, torchvision 4; not tried within the budget: "
            "packed") in text
    assert text.splitlines()[-1].endswith(": ringtrain doctor --full photos")
    report = as_json(results, advice, context)
    assert report["advice"][0]["tried"] is None and report["check"]["images"] == 48
    assert [t["measured_steps"] for t in report["trials"]] == [10, 4]
    full = as_text(results, [], {**context, "check": {**check, "mode": "full"}})
    assert "full check: all 48 images" in full and "--full" not in full


def test_progress_follows_a_trial_planned_after_its_warm_up():
    now = [0.0]
    out = io.StringIO()
    progress = Progress(True, every_s=100.0, clock=lambda: now[0], out=out)
    progress.start("torchvision", 12)
    progress.step(1)
    progress.resize(5)  # 2 warm-up steps, then 3 measured ones fit the budget
    for done in range(2, 6):
        now[0] += 1.0
        progress.step(done)
    assert out.getvalue().splitlines()[-1].endswith("trial torchvision: done in 4 s")
