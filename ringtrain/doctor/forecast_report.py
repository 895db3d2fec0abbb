"""The scaling forecast's report: a table for people, JSON for programs, charts (PNG, terminal).

Each size shows, per strategy, the forecast throughput, scaling efficiency and limiting
resource; sizes that were also run here show the measured throughput and the forecast's error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ringtrain.doctor.forecast_model import Network, Point

if TYPE_CHECKING:
    from ringtrain.torch.gradient_plan import GradientPlan

ASSUMPTIONS = (
    ("every worker trains the same batch as measured here (weak scaling): compute per step does "
    "not change with the number of workers"),
    "workers of one host share its cores: CPU compute is measured on each worker's share",
    ("gradients are reduced one bucket at a time, each as soon as backward has made it; a GPU "
    "hides reductions behind backward, CPU training that uses every core hides none"),
    "steps are synchronous and every worker is as fast as the one measured (no stragglers)",
    "each worker's input pipeline is its own (shared storage bandwidth is not modelled)",
    "a parameter server (ps) has its own NIC; k = hosts unless given (ps:K)",
)


class BaseRun(Protocol):
    """What the report reads of the baseline run: a ``forecast.Measured`` (not imported here:
    that module imports this one)."""

    @property
    def cores(self) -> int: ...

    @property
    def samples(self) -> int: ...

    @property
    def plan(self) -> GradientPlan | None: ...

    @property
    def rate(self) -> float: ...


@dataclass
class Context:
    """What the report says besides the points: the command, this host, the network, the
    one-process measurements by core count, the allreduce samples and the baseline run."""

    command: list[str]
    cores: int
    per_host: int
    device: str
    network: Network
    measured: dict  # cores -> forecast.Measured
    base: BaseRun
    link_samples: list = field(default_factory=list)
    load_avg: tuple[float, float, float] | None = None  # at the start of the measurements

    @property
    def unit(self) -> str:
        return "samples/s" if self.base.samples else "steps/s"


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


def _error(forecast: float, measured: float) -> float:
    return (forecast - measured) / measured


def _ring_at(points: list[Point], n: int) -> Point:
    return next(p for p in points if p.workers == n and p.strategy in ("ring", "hierarchical"))


def measurement_lines(context: Context) -> list[str]:
    """What was measured here, one line each."""
    lines = []
    for cores, m in sorted(context.measured.items(), reverse=True):
        where = ("in the training process" if not m.loader_workers
                 else f"waited for, {m.loader_workers} loader worker(s)")
        lines.append(f"  1 process on {cores} core(s): step {m.step_ms:.1f} ms = compute "
                     f"{m.compute_ms:.1f} ms + data {m.data_ms:.1f} ms ({where})"
                     + (f", {m.samples} samples per step" if m.samples else ""))
    plan = context.base.plan
    if plan is None or not plan.buckets:
        lines.append("  gradients: none recorded (no DistributedOptimizer buckets)")
    else:
        sizes = [b.nbytes for b in plan.buckets]
        lines.append(f"  gradients: {_mb(sum(sizes))} per step in {len(sizes)} bucket(s) "
                     f"(largest {_mb(max(sizes))}), ready "
                     + ", ".join(f"{b.ready_before_end_ms:.1f}" for b in plan.buckets[:6])
                     + (" ..." if len(sizes) > 6 else "") + " ms before backward ends; "
                     + ("reductions hide behind backward (GPU)" if context.device == "cuda"
                        else "CPU training: reductions compete with compute, none hidden"))
    if context.link_samples:
        curve = ", ".join(f"{n // 1024} KiB {t * 1e3:.2f} ms" for n, t in context.link_samples)
        lines.append(f"  allreduce, 2 processes here: {curve}")
    return lines


def as_text(points: list[Point], checks: dict, context: Context) -> str:
    """The report: measurements, network, table, self-check, terminal chart, assumptions."""
    strategies = list(dict.fromkeys(p.strategy for p in points))
    lines = [f"ringtrain doctor --forecast: {' '.join(context.command)}", "",
             "measured here" + (f" (load average {context.load_avg[0]:.1f} at the start, "
                                f"{context.cores} core(s)):" if context.load_avg else ":"),
             *measurement_lines(context), "",
             f"network: {context.network.assumptions}",
             f"hosts of {context.per_host} worker(s) ({context.device} training)", ""]
    head = f"{'workers':>7}{'hosts':>6}  " + "".join(f"{s:<28}" for s in strategies)
    lines.append(head + (f"{'measured here':>15}{'error':>8}" if checks else ""))
    unit = context.unit
    lines.append(" " * 15 + f"{unit:>11} {'eff':>5} {'limit':<10}" * len(strategies))
    base = context.base
    lines.append(f"{1:>7}{1:>6}  {base.rate:>11.1f} (measured, {base.cores} core(s))")
    for n in dict.fromkeys(p.workers for p in points):
        row = [p for p in points if p.workers == n]
        hosts = -(-n // context.per_host)
        text = f"{n:>7}{hosts:>6}  " + "".join(
            f"{p.rate:>11.1f} {p.efficiency:>5.0%} {p.limit:<10}" for p in row)
        if n in checks:
            m = checks[n]
            text += f"{m.rate:>15.1f}{_error(_ring_at(points, n).rate, m.rate):>+8.0%}"
        lines.append(text)
    lines += ["", ("efficiency: throughput / (workers x one worker alone on the same share of "
                  "its host); limit: what the step waits on beyond compute")]
    if checks:
        lines.append("error: (ring forecast - measured) / measured; forecasts from 1-process "
                     "runs only, medians over steps")
    if checks and context.load_avg and context.load_avg[0] > context.cores:
        lines.append(f"warning: this host was busy (load average {context.load_avg[0]:.1f} on "
                     f"{context.cores} core(s)): other work shares the cores, steps vary from "
                     "run to run, and the error says as much about that as about the forecast")
    lines += ["", *terminal_chart(points), "", "assumes:"]
    lines += [f"  - {a}" for a in ASSUMPTIONS]
    return "\n".join(lines)


def terminal_chart(points: list[Point], width: int = 40) -> list[str]:
    """Scaling efficiency as bars, one per size and strategy."""
    lines = ["scaling efficiency"]
    label = max(len(p.strategy) for p in points)
    for p in points:
        bar = "#" * round(min(1.0, p.efficiency) * width)
        lines.append(f"{p.workers:>6} {p.strategy:<{label}} |{bar:<{width}}| "
                     f"{p.efficiency:>4.0%} {p.limit}")
    return lines


def as_json(points: list[Point], checks: dict, context: Context) -> dict:
    """Everything, for ``-o json``."""
    return {
        "command": context.command, "device": context.device, "per_host": context.per_host,
        "cores": context.cores, "load_avg": context.load_avg,
        "network": {"name": context.network.name, "assumptions": context.network.assumptions},
        "unit": context.unit,
        "measured": {str(c): {k: v for k, v in m.__dict__.items() if k not in ("plan", "notes")}
                     for c, m in context.measured.items()},
        "buckets": ([b.__dict__ for b in context.base.plan.buckets]
                    if context.base.plan else []),
        "allreduce_samples": context.link_samples,
        "forecast": [p.to_json() for p in points],
        "checks": [{"workers": n, "measured": m.rate,
                    "forecast": _ring_at(points, n).rate,
                    "error": _error(_ring_at(points, n).rate, m.rate)}
                   for n, m in checks.items()],
        "assumptions": list(ASSUMPTIONS),
    }


def write_chart(points: list[Point], checks: dict, context: Context, path: Path) -> None:
    """Throughput and scaling efficiency against workers, a line per strategy, the ideal
    (linear from one worker) dashed, sizes run here as dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate_ax, eff_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for strategy in dict.fromkeys(p.strategy for p in points):
        row = [p for p in points if p.strategy == strategy]
        rate_ax.plot([p.workers for p in row], [p.rate for p in row], marker=".",
                     label=strategy)
        eff_ax.plot([p.workers for p in row], [100 * p.efficiency for p in row], marker=".",
                    label=strategy)
    sizes = sorted({p.workers for p in points})
    ideal = [n * p.rate / p.workers / p.efficiency for n in sizes
             for p in [_ring_at(points, n)]]
    rate_ax.plot(sizes, ideal, "k--", linewidth=0.8, label="ideal")
    if checks:
        rate_ax.plot(list(checks), [m.rate for m in checks.values()], "ko",
                     label="measured here")
    for ax in (rate_ax, eff_ax):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"workers ({context.per_host} per host)")
        ax.grid(alpha=0.3)
    rate_ax.set_yscale("log")
    rate_ax.set_ylabel(context.unit)
    eff_ax.set_ylabel("scaling efficiency (%)")
    eff_ax.set_ylim(0, 105)
    rate_ax.legend(fontsize=8)
    fig.suptitle(f"ringtrain doctor --forecast ({context.network.name} between hosts)",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
