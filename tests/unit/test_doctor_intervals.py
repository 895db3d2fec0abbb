"""The doctor's intervals: Student t for few repeats, ratios of estimates, and
a verdict and advice that call nothing inside them."""

from __future__ import annotations

import math

import pytest

from ringtrain.doctor.advice import ScriptMeasurements, advise_script
from ringtrain.doctor.intervals import Estimate, estimate, ratio, t975
from ringtrain.doctor.report import verdict
from ringtrain.doctor.trials import TrialResult

PHASES = {"data": 1.0, "h2d": 0.0, "forward_backward": 30.0, "communication": 4.0,
          "optimizer": 3.0, "other": 2.0, "step": 40.0}


def test_student_t_is_wide_for_few_repeats_and_normal_for_many():
    assert (t975(1), t975(2), t975(30)) == (12.706, 4.303, 2.042)
    assert abs(t975(120) - 1.980) < 0.003 and abs(t975(10_000) - 1.96) < 0.001
    with pytest.raises(ValueError, match="at least 1"):
        t975(0)


def test_an_estimate_is_the_mean_with_its_t_interval():
    e = estimate([10.0, 12.0, 14.0])  # sd 2: half = 4.303 * 2 / sqrt(3)
    assert e.mean == 12.0 and math.isclose(e.half, 4.303 * 2 / math.sqrt(3))
    assert (e.low, e.high) == (e.mean - e.half, e.mean + e.half)
    assert e.format(".1f", " ms") == "12.0 ± 5.0 ms" and e.to_json() == [e.low, e.high]
    assert estimate([5.0, 5.0]).half == 0.0
    with pytest.raises(ValueError, match="at least 2 measurements"):
        estimate([1.0])


def test_ratios_add_the_noise_in_quadrature():
    r = ratio(Estimate(50.0, 3.0), Estimate(100.0, 4.0))  # 6 % and 4 % relative
    assert r.mean == 0.5 and math.isclose(r.relative, math.hypot(0.06, 0.04))
    with pytest.raises(ValueError, match="denominator"):
        ratio(Estimate(1.0, 0.1), Estimate(0.0, 0.0))


def _repeated(name: str, rate: float, noise: float, **phases: float) -> TrialResult:
    """A trial measured 3 times: ``rate`` ± ``noise`` (relative), its phases ± 1 ms."""
    breakdown = {**PHASES, **phases}
    return TrialResult(name, name, 1, rate, breakdown, [breakdown["step"]], 0, noise=noise,
                       rates=[rate] * 3, breakdown_half_ms={p: 1.0 for p in breakdown})


def test_the_verdict_calls_a_bottleneck_only_outside_the_intervals():
    synthetic = _repeated("synthetic", 100.0, 0.03)
    clear = verdict(_repeated("real", 60.0, 0.03, data=20.0, step=66.0), synthetic, 0.0)
    assert clear.startswith("the input pipeline is your bottleneck: real data runs at 60% of "
                            "synthetic data's speed (57% to 63%); data wait is 20 ± 1 ms of a "
                            "66 ± 1 ms step")
    # 9 % slower, but either trial alone varies by 20 %: nothing can be said
    noisy = verdict(_repeated("real", 91.0, 0.2), _repeated("synthetic", 100.0, 0.2), 0.0)
    assert noisy.startswith("cannot tell whether the input pipeline is your bottleneck")
    assert "--repeats" in noisy
    same = verdict(_repeated("real", 98.0, 0.03), synthetic, 0.0)
    assert same.startswith("the input pipeline is not your bottleneck: data wait is 1 ± 1 ms "
                           "of a 40 ± 1 ms step") and same.endswith("within the noise)")


def test_script_advice_ignores_a_slowdown_and_a_wait_inside_their_intervals():
    real = {**PHASES, "step": 50.0, "data": 6.0, "forward_backward": 36.0}
    synthetic = {**PHASES, "step": 40.0, "data": 0.0}
    loud = advise_script(ScriptMeasurements(real, synthetic, 2, 2, 1, 0.02))
    assert any("slow training down" in a.message for a in loud)
    assert any(a.message.startswith("data wait is 12%") for a in loud)
    wide = {p: 8.0 for p in PHASES}  # each phase ± 8 ms: neither finding stands out of it
    quiet = advise_script(ScriptMeasurements(real, synthetic, 2, 2, 1, 0.02, wide, wide))
    assert not any("slow training down" in a.message or a.message.startswith("data wait")
                   for a in quiet), quiet
    told = advise_script(ScriptMeasurements({**real, "data": 20.0}, synthetic, 2, 2, 1, 0.02,
                                            {p: 1.0 for p in PHASES}))
    assert "(20.0 ± 1.0 of 50.0 ± 1.0 ms)" in told[0].message


def test_script_advice_says_when_nothing_stands_out_of_wide_noise():
    same = {**PHASES, "step": 42.0}
    said = advise_script(ScriptMeasurements(same, PHASES, 0, 2, 1, 0.5))
    assert len(said) == 1 and said[0].message.startswith("nothing stands out of the noise: "
                                                         "real data runs at 95%")
    assert "keeps up" in advise_script(ScriptMeasurements(same, PHASES, 0, 2, 1, 0.03))[0].message


def test_repeats_default_to_three_and_bad_ones_are_refused(capsys):
    from ringtrain.doctor.cli import parse_args

    args, command = parse_args(["--", "python", "train.py"])
    assert args.repeats == 3 and command == ["python", "train.py"]
    assert parse_args(["--repeats", "1", "--", "python", "t.py"])[0].repeats == 1
    for argv, said in ((["--repeats", "2", "photos"], "--repeats applies to a command"),
                       (["--repeats", "0", "--", "python", "t.py"], "must be positive"),
                       (["--repeats", "1", "--steps", "1", "--", "python", "t.py"],
                        "give --steps 2 or more")):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert said in capsys.readouterr().err
