"""The doctor's report: text for people, JSON for programs, a PNG chart of the breakdowns."""

from __future__ import annotations

import json
from pathlib import Path

from ringtrain.doctor.advice import THRESHOLD, Advice
from ringtrain.doctor.intervals import Estimate, ratio
from ringtrain.doctor.trials import TrialResult
from ringtrain.torch.step_profiler import PHASES

_COLOURS = {"data": "#d62728", "h2d": "#ff7f0e", "forward_backward": "#2ca02c",
            "communication": "#9467bd", "optimizer": "#1f77b4", "other": "#7f7f7f"}


def gap_closed(result: TrialResult, baseline: TrialResult, synthetic: TrialResult) -> float:
    """The fraction of the baseline's gap to synthetic data that ``result`` closes (1: all of
    it; above 1: it ran faster than ``synthetic``, i.e. within the run's noise)."""
    gap = synthetic.images_per_second - baseline.images_per_second
    if gap <= 0:
        return 1.0
    return (result.images_per_second - baseline.images_per_second) / gap


def speed_ratio(real: TrialResult, ceiling: TrialResult, noise: float) -> Estimate:
    """Real data's throughput as a fraction of ``ceiling``'s, with its 95 % interval: from
    both trials' intervals when they were repeated, else ``noise`` on either side."""
    if real.rates and ceiling.rates:
        return ratio(_rate(real), _rate(ceiling))
    mean = real.images_per_second / ceiling.images_per_second
    return Estimate(mean, mean * noise)


def _rate(r: TrialResult) -> Estimate:
    return Estimate(r.images_per_second, r.images_per_second * r.noise)


#: What the verdict asks for when the runs vary too much to tell (a user's script).
MEASURE_MORE = "measure longer (--steps) or more often (--repeats)"


def verdict(real: TrialResult, ceiling: TrialResult, noise: float,
            measure_more: str = MEASURE_MORE) -> str:
    """The finding in one sentence: whether the input pipeline holds training back, with the
    data wait, the speed against synthetic data and its interval.

    A bottleneck is called when real data is slower beyond the interval and by more than
    :data:`THRESHOLD`; none when real data is at worst 15 % slower; else the runs vary too
    much to tell, and the verdict says so and how to measure more (``measure_more``).
    """
    speed = speed_ratio(real, ceiling, noise)
    wait = (f"data wait is {_figure(real, 'data', '.0f')} ms of a "
            f"{_figure(real, 'step', '.0f')} ms step")
    spread = f"{max(speed.low, 0.0):.0%} to {speed.high:.0%}"  # no speed is below 0
    runs = f"real data runs at {speed.mean:.0%} of synthetic data's speed"
    if speed.high < 1 and 1 - speed.mean > THRESHOLD:
        return f"the input pipeline is your bottleneck: {runs} ({spread}); {wait}; see the advice"
    if speed.low >= 1 - 3 * THRESHOLD:
        return (f"the input pipeline is not your bottleneck: {wait}; {runs} ({spread}"
                + (", within the noise)" if speed.high >= 1 else ")"))
    return (f"cannot tell whether the input pipeline is your bottleneck: {runs}, but anywhere "
            f"from {spread} (the runs vary too much); {wait}; {measure_more}")


def _figure(r: TrialResult, phase: str, spec: str = ".1f") -> str:
    """A phase's mean ms, with its interval's half-width when known."""
    half = r.breakdown_half_ms.get(phase)
    mean = f"{r.breakdown_ms[phase]:{spec}}"
    return mean if half is None else f"{mean} ± {half:{spec}}"


def within_noise(result: TrialResult, baseline: TrialResult, noise: float) -> bool:
    """Whether ``result``'s throughput differs from ``baseline``'s by no more than ``noise``."""
    return abs(result.images_per_second / baseline.images_per_second - 1) <= noise


def as_json(results: list[TrialResult], advice: list[Advice], context: dict) -> dict:
    """Everything measured and advised, for ``-o json``."""
    tried = {r.name for r in results}
    return {**context, "trials": [r.to_json() for r in results],
            "advice": [{"message": a.message,
                        "tried": a.trial.name if a.trial and a.trial.name in tried else None}
                       for a in advice]}


def as_text(results: list[TrialResult], advice: list[Advice], context: dict) -> str:
    """A table of the trials (throughput, ratio to the fastest synthetic run, gap closed,
    breakdown), the slowest rank of each and the advice."""
    synthetic = next((r for r in results if r.name == context["ceiling"]), None)
    baseline = next((r for r in results if r.name == context.get("baseline")), None)
    noise = context.get("noise", 0.0)
    lines = [f"ringtrain doctor: {context['title']}", ""]
    if context.get("verdict"):
        lines += [f"verdict: {context['verdict']}", ""]
    unit = context.get("rate_unit", "img/s")
    header = f"{'trial':<18}{'workers':>8}{unit:>10}{'±':>6}{'x synth':>12}{'gap closed':>11}  "
    lines.append(header + "  ".join(f"{p[:7]:>7}" for p in PHASES) + "  (ms per step)")
    for r in results:
        ratio_text = "1.00"
        if synthetic is not None and r is not synthetic:
            speed = speed_ratio(r, synthetic, noise)
            ratio_text = (speed.format(".2f").replace(" ", "") if r.rates and synthetic.rates
                          else f"{speed.mean:.2f}")
        closed = "" if r.gap_closed is None else f"{r.gap_closed:.0%}"
        if closed and baseline is not None and r is not baseline and within_noise(
                r, baseline, max(noise, r.noise, baseline.noise)):
            closed = "noise"  # no better than the baseline, as far as can be told
        workers = "-" if r.workers is None else r.workers
        lines.append(f"{r.name:<18}{workers:>8}{r.images_per_second:>10.1f}{r.noise:>6.0%}"
                     f"{ratio_text:>12}{closed:>11}  "
                     + "  ".join(f"{r.breakdown_ms[p]:>7.1f}" for p in PHASES))
        if r.breakdown_half_ms:  # each mean's interval, under it
            rate_half = f"±{r.images_per_second * r.noise:.1f}"
            lines.append(f"{'':<26}{rate_half:>10}{'':>29}  "
                         + "  ".join(f"{'±' + format(r.breakdown_half_ms[p], '.1f'):>7}"
                                     for p in PHASES))
    lines.append("")
    for r in results:
        steps = ", ".join(f"{ms:.1f}" + (f" ± {r.step_half_ms_per_rank[i]:.1f}"
                                         if r.step_half_ms_per_rank else "")
                          for i, ms in enumerate(r.step_ms_per_rank))
        lines.append(f"{r.name}: slowest rank {r.slowest_rank} (step ms by rank: {steps})")
    if context.get("noise_from"):
        lines += ["", (f"±: 95 % intervals (Student t) from {context['noise_from']}; a "
                       "difference inside them is noise and is not called a finding")]
    else:
        lines += ["", (f"±: the 95 % interval of each trial's mean step; differences under "
                       f"{max(noise, THRESHOLD):.0%} are noise (what two runs of one trial "
                       "differ by)")]
    tried = {r.name for r in results}
    lines += ["", "advice:"] + [f"  - {a.message}" + _tried(a, tried) for a in advice]
    if context.get("check"):
        lines += ["", *check_text(context["check"], results)]
    return "\n".join(lines)


def _tried(advice: Advice, tried: set[str]) -> str:
    if advice.trial is None:
        return ""
    return (f" [tried: {advice.trial.name}]" if advice.trial.name in tried
            else f" [not tried: {advice.trial.name}]")


def check_text(check: dict, results: list[TrialResult]) -> list[str]:
    """What the check measured (its images, each trial's steps, the fixes the budget left
    untried) and, for the quick check, the command of the full one."""
    steps = ", ".join(f"{r.name} {r.measured_steps}" for r in results)
    if check["mode"] == "full":
        return [f"full check: all {check['images']} images; measured steps per trial: {steps}"]
    skipped = (f"; not tried within the budget: {', '.join(check['not_tried'])}"
               if check["not_tried"] else "")
    return [f"quick check (bounded to {check['budget_s']:.0f} s): {check['images']} of "
            f"{check['of_images']} images (a random sample); measured steps per trial (at most "
            f"{check['max_steps']}): {steps}{skipped}",
            f"for the full check (every image, more steps, no time bound; minutes on a CPU): "
            f"{check['full_command']}"]


def render(results: list[TrialResult], advice: list[Advice], context: dict, work_dir: Path,
           output: str, unit: str = "img/s") -> str:
    """The report as ``output`` (``text`` or ``json``) asks, naming its chart, which this writes
    to ``work_dir/breakdown.png``."""
    chart = work_dir / "breakdown.png"
    write_chart(results, chart, unit)
    if output == "json":
        return json.dumps({**as_json(results, advice, context), "chart": str(chart)})
    return as_text(results, advice, context) + f"\n\nchart: {chart}"


def write_chart(results: list[TrialResult], path: Path, unit: str = "img/s") -> None:
    """A stacked bar per trial: its mean step split into phases, with its throughput (in
    ``unit``); saved as a PNG at ``path``."""
    import matplotlib.pyplot as plt

    fig = chart_figure(results, unit)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def chart_figure(results: list[TrialResult], unit: str = "img/s"):
    """The chart of :func:`write_chart` as a matplotlib figure (the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    height = 1.6 + 0.6 * len(results)
    fig, ax = plt.subplots(figsize=(8, height))
    names = [r.name for r in results][::-1]
    left = [0.0] * len(results)
    for phase in PHASES:
        widths = [r.breakdown_ms[phase] for r in results][::-1]
        ax.barh(names, widths, left=left, color=_COLOURS[phase], label=phase)
        left = [a + b for a, b in zip(left, widths)]
    for y, r in enumerate(results[::-1]):
        half = r.breakdown_half_ms.get("step")
        if half is not None:  # the step's interval, as an error bar at the bar's end
            ax.errorbar(left[y], y, xerr=half, color="black", capsize=3, linewidth=1)
        rate = (f"{r.images_per_second:.0f} ± {r.images_per_second * r.noise:.0f}" if r.rates
                else f"{r.images_per_second:.0f}")
        ax.text(left[y] + (half or 0.0), y, f" {rate} {unit}", va="center", fontsize=8)
    ax.set_xlabel("ms per step (mean over ranks)")
    ax.set_xlim(0, max(left) * 1.35)
    ax.set_title("ringtrain doctor: step breakdown per configuration")
    # Below the axes, in one row: drawn over the bars, it hid a bar's label.
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(PHASES), fontsize=7,
               frameon=False)
    fig.tight_layout(rect=(0, 0.4 / height, 1, 1))
    return fig
