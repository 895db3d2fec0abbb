"""The doctor's report: text for people, JSON for programs, a PNG chart of the breakdowns."""

from __future__ import annotations

from pathlib import Path

from ringtrain.doctor.advice import THRESHOLD, Advice
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


def verdict(real: TrialResult, ceiling: TrialResult, noise: float) -> str:
    """The finding in one sentence: whether the input pipeline holds training back, with the
    data wait, the speed against synthetic data and the noise of the measurements."""
    step, data = real.breakdown_ms["step"], real.breakdown_ms["data"]
    ratio = real.images_per_second / ceiling.images_per_second
    wait = f"data wait is {data:.0f} ms of a {step:.0f} ms step"
    speed = f"real data runs at {ratio:.0%} of synthetic data's speed (noise ±{noise:.0%})"
    if 1 - ratio <= max(THRESHOLD, noise):
        return f"the input pipeline is not your bottleneck: {wait}; {speed}"
    return f"the input pipeline is your bottleneck: {speed}; {wait}; see the advice"


def within_noise(result: TrialResult, baseline: TrialResult, noise: float) -> bool:
    """Whether ``result``'s throughput differs from ``baseline``'s by no more than ``noise``."""
    return abs(result.images_per_second / baseline.images_per_second - 1) <= noise


def as_json(results: list[TrialResult], advice: list[Advice], context: dict) -> dict:
    """Everything measured and advised, for ``-o json``."""
    return {**context, "trials": [r.to_json() for r in results],
            "advice": [{"message": a.message, "tried": a.trial.name if a.trial else None}
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
    header = f"{'trial':<18}{'workers':>8}{unit:>10}{'±':>6}{'x synth':>9}{'gap closed':>11}  "
    lines.append(header + "  ".join(f"{p[:7]:>7}" for p in PHASES) + "  (ms per step)")
    for r in results:
        ratio = r.images_per_second / synthetic.images_per_second if synthetic else 1.0
        closed = "" if r.gap_closed is None else f"{r.gap_closed:.0%}"
        if closed and baseline is not None and r is not baseline and within_noise(
                r, baseline, max(noise, r.noise, baseline.noise)):
            closed = "noise"  # no better than the baseline, as far as can be told
        workers = "-" if r.workers is None else r.workers
        lines.append(f"{r.name:<18}{workers:>8}{r.images_per_second:>10.1f}{r.noise:>6.0%}"
                     f"{ratio:>9.2f}{closed:>11}  "
                     + "  ".join(f"{r.breakdown_ms[p]:>7.1f}" for p in PHASES))
    lines.append("")
    for r in results:
        steps = ", ".join(f"{ms:.1f}" for ms in r.step_ms_per_rank)
        lines.append(f"{r.name}: slowest rank {r.slowest_rank} (step ms by rank: {steps})")
    lines += ["", (f"±: the 95 % interval of each trial's mean step; differences under "
                   f"{max(noise, THRESHOLD):.0%} are noise (what two runs of one trial differ by)")]
    lines += ["", "advice:"] + [f"  - {a.message}" + (f" [tried: {a.trial.name}]" if a.trial
                                                       else "") for a in advice]
    return "\n".join(lines)


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
        ax.text(left[y], y, f" {r.images_per_second:.0f} {unit}", va="center", fontsize=8)
    ax.set_xlabel("ms per step (mean over ranks)")
    ax.set_xlim(0, max(left) * 1.25)
    ax.set_title("ringtrain doctor: step breakdown per configuration")
    # Below the axes, in one row: drawn over the bars, it hid a bar's label.
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(PHASES), fontsize=7,
               frameon=False)
    fig.tight_layout(rect=(0, 0.4 / height, 1, 1))
    return fig
