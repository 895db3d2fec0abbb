"""``ringtrain doctor --forecast 2,4,8 -- python train.py``: measure here, forecast there, check.

Short runs of the unchanged script with the step profiler on, one process at a time (for CPU
training, again pinned with ``taskset`` to each core share a worker would get: a step on 1 core
is not half a step on 2), and the allreduce probe of 2 ranks feed
:mod:`ringtrain.doctor.forecast_model`; every size that fits on this host is then run for real
and reported beside its forecast. What is measured and how: docs/forecast.md.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ringtrain.doctor import network_profiles, script_results
from ringtrain.doctor.forecast_model import (
    Layout,
    Network,
    Point,
    Strategy,
    Workload,
    forecast_point,
)
from ringtrain.doctor.script import run_script
from ringtrain.doctor.script_results import ScriptRunError
from ringtrain.runner.threads import usable_cores
from ringtrain.torch.gradient_plan import GradientPlan, read_plan

#: A background pipeline whose wait is above this share of the step is what paces it.
PIPELINE_BOUND = 0.05
DEFAULT_STRATEGIES = (Strategy("ring"), Strategy("hierarchical"), Strategy("ps", 0))


@dataclass(frozen=True)
class ForecastSpec:
    """What ``--forecast`` asks for: sizes, workers per host, the network profile (a name of
    :data:`~ringtrain.doctor.network_profiles.NAMES` or ``measured``), the strategies."""

    sizes: tuple[int, ...]
    per_host: int | None = None
    network: str = "25gbit"
    strategies: tuple[Strategy, ...] = DEFAULT_STRATEGIES
    check: bool = True

    @staticmethod
    def parse_sizes(text: str) -> tuple[int, ...]:
        """``2,4,8`` as sizes.

        Raises:
            ValueError: not a comma-separated list of positive whole numbers.
        """
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"--forecast takes sizes like 2,4,8,16,32, got {text!r}")
        return tuple(sorted({int(p) for p in parts}))


@dataclass
class Measured:
    """One run of the script: its median step parts, the plan of its gradients, the cores it
    ran on and the samples per step of one worker (0: unknown)."""

    workers: int
    cores: int
    step_ms: float
    compute_ms: float
    data_ms: float
    loader_workers: int | None
    samples: int
    plan: GradientPlan | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """Samples (or steps) per second of all its workers together."""
        return self.workers * (self.samples or 1) * 1e3 / self.step_ms

    def workload(self) -> Workload:
        """The one-worker workload this run measured (it must be a one-process run)."""
        background = bool(self.loader_workers)
        pipeline = (self.step_ms if background and self.data_ms > PIPELINE_BOUND * self.step_ms
                    else None)
        buckets = tuple(self.plan.buckets) if self.plan else ()
        overlap = 1.0 if self.plan and self.plan.device == "cuda" else 0.0
        return Workload(self.compute_ms, buckets, self.samples,
                        0.0 if background else self.data_ms, pipeline, overlap)


def read_run(out: Path, warmup: int, workers: int, cores: int) -> Measured:
    """The medians over steps (after ``warmup``) and ranks of the records in ``out``.

    Raises:
        ScriptRunError: no step recorded after the warm-up.
    """
    run = script_results.read_run(out, warmup)
    records = [r for rank in run.ranks for r in rank]
    samples = [r["samples"] for r in records if r.get("samples")]
    return Measured(
        workers, cores,
        statistics.median(r["step_ms"] for r in records),
        statistics.median(r["step_ms"] - r["data_ms"] - r["communication_ms"] for r in records),
        statistics.median(r["data_ms"] for r in records),
        run.workers,
        int(statistics.median(samples)) if len(samples) == len(records) else 0,
        read_plan(out))


def _cpus(cores: int) -> str:
    """The first ``cores`` CPUs this process may use, for ``taskset -c``."""
    allowed = sorted(os.sched_getaffinity(0))
    return ",".join(str(c) for c in allowed[:cores])


class Forecaster:
    """Runs the measurements of one forecast of ``command`` into ``work_dir/forecast/<run>/``,
    each run ``warmup`` then ``steps`` steps within ``timeout_s``; progress lines go to ``log``
    (a person waits minutes for this)."""

    def __init__(self, command: list[str], work_dir: Path, warmup: int, steps: int,
                 timeout_s: float, log=print) -> None:
        self.command = command
        self.dir = work_dir / "forecast"
        self.warmup, self.steps, self.timeout_s = warmup, steps, timeout_s
        self.log = log

    def one_process(self, cores: int | None) -> Measured:
        """One process of the script, pinned to ``cores`` cores (``None``: not pinned).

        Raises:
            ScriptRunError: the run failed, or ``taskset`` is missing for a pinned run.
        """
        command = self.command
        full = usable_cores()
        if cores is not None and cores < full:
            if shutil.which("taskset") is None:
                raise ScriptRunError("forecasting CPU training on hosts shared by several "
                                     "workers pins a run to fewer cores with `taskset` "
                                     "(util-linux): install it, or pass --per-host 1")
            command = ["taskset", "-c", _cpus(cores), *command]
        used = cores or full
        self.log(f"measuring 1 process on {used} core(s) ...")
        out = self.dir / f"1proc-{used}cores"
        run_script(command, None, out, synthetic=False, steps=self.warmup + self.steps,
                   timeout_s=self.timeout_s)
        return read_run(out, self.warmup, 1, used)

    def world(self, n: int) -> Measured:
        """``ringtrain run -np n`` of the script on this host (the self-check).

        Raises:
            ScriptRunError: the run failed.
        """
        self.log(f"running {n} processes on this host to check the forecast ...")
        out = self.dir / f"{n}proc"
        run_script(self.command, n, out, synthetic=False, steps=self.warmup + self.steps,
                   timeout_s=self.timeout_s)
        return read_run(out, self.warmup, n, max(1, usable_cores() // n))

    def checks(self, sizes: tuple[int, ...], here: int) -> dict[int, Measured]:
        """:meth:`world` of every size from 2 to ``here`` (the workers that fit on this host),
        until a run fails: the forecast is then reported without the rest."""
        checks: dict[int, Measured] = {}
        try:
            for n in sizes:
                if 2 <= n <= here:
                    checks[n] = self.world(n)
        except ScriptRunError as e:
            self.log(f"{e} (the forecast is reported without that check)")
        return checks

    def link(self, max_bytes: int) -> tuple[network_profiles.Link, list]:
        """The allreduce cost curve of 2 ranks on this host, fitted.

        Raises:
            ScriptRunError: the probe failed or ran past the timeout.
            ValueError: the times could not be fitted.
        """
        self.log("measuring allreduce between 2 processes on this host ...")
        out = self.dir / "allreduce.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        probe = [sys.executable, "-m", "ringtrain.cli", "run", "-np", "2", sys.executable, "-m",
                 "ringtrain.doctor.allreduce_probe", str(out), str(max(max_bytes, 1 << 20))]
        try:
            status = subprocess.run(probe, timeout=self.timeout_s, check=False).returncode
        except subprocess.TimeoutExpired:
            raise ScriptRunError("the allreduce probe ran past --timeout") from None
        if status != 0 or not out.exists():
            raise ScriptRunError(f"the allreduce probe exited with status {status}")
        samples = [tuple(s) for s in json.loads(out.read_text())["samples"]]
        return network_profiles.fit_link(samples, workers=2), samples


def cores_per_worker(n: int, per_host: int, cores: int) -> int:
    """The cores one of ``n`` workers gets on a host like this one holding ``per_host``."""
    return max(1, cores // min(n, per_host))


def build_network(name: str, measured_link, cpu: bool) -> Network:
    """The network of the forecast: profile ``name`` across hosts and, for CPU training, the
    link measured here within a host; ``measured``: the measured link everywhere.

    Raises:
        ValueError: ``measured`` without a measurement, or an unknown name.
    """
    how = "2 processes on this host, ringtrain allreduce"
    if name == "measured":
        if measured_link is None:
            raise ValueError("--network measured needs 2 processes on this host to measure "
                             "allreduce; name a profile: " + ", ".join(network_profiles.NAMES))
        return network_profiles.measured(measured_link, how)
    if cpu and measured_link is not None:
        note = (f"within a host: measured here ({how}), {measured_link.latency_s * 1e6:.0f} us "
                f"per step, {measured_link.bandwidth_Bps / 1e9:.2f} GB/s")
        return network_profiles.named(name, measured_link, note)
    return network_profiles.named(name)


def forecast_table(spec: ForecastSpec, workloads: dict[int, Workload], per_host: int,
                   network: Network, cores: int, cpu: bool) -> list[Point]:
    """Every size and strategy, each size with the workload of its core share (CPU)."""
    points = []
    for n in spec.sizes:
        share = cores_per_worker(n, per_host, cores) if cpu else cores
        for strategy in spec.strategies:
            points.append(forecast_point(workloads[share], Layout(n, per_host), network,
                                         strategy))
    return points


def doctor_forecast(args, command: list[str], spec: ForecastSpec) -> int:
    """Measure, forecast, check and report (``ringtrain doctor --forecast``); returns 0, 1 when
    a run failed, 2 for a request that cannot be met (``--network measured`` on one core)."""
    import torch

    from ringtrain.doctor import forecast_report

    def log(message: str) -> None:
        print(f"ringtrain doctor: {message}", file=sys.stderr, flush=True)

    cores = usable_cores()
    load_avg = os.getloadavg()  # measurements on a busy host are slower: the report says so
    forecaster = Forecaster(command, args.work_dir, args.warmup, args.steps, args.timeout, log)
    try:
        base = forecaster.one_process(None)
        cpu = not (base.plan is not None and base.plan.device == "cuda")
        gpus = torch.cuda.device_count()
        per_host = spec.per_host or (cores if cpu else max(1, gpus))
        here = min(per_host, cores if cpu else gpus)  # workers that fit on this host
        measured = {cores: base}
        if cpu:
            for share in sorted({cores_per_worker(n, per_host, cores) for n in spec.sizes}
                                - {cores}):
                measured[share] = forecaster.one_process(share)
        link: network_profiles.Link | None = None
        samples: list = []
        if (cpu or spec.network == "measured") and min(cores if cpu else gpus, 2) == 2:
            largest = max((b.nbytes for b in base.plan.buckets), default=1 << 20) if (
                base.plan) else 1 << 20
            link, samples = forecaster.link(largest)
        network = build_network(spec.network, link, cpu)
    except ScriptRunError as e:
        log(str(e))
        return 1
    except ValueError as e:
        log(str(e))
        return 2
    workloads = {share: m.workload() for share, m in measured.items()}
    points = forecast_table(spec, workloads, per_host, network, cores, cpu)
    checks = forecaster.checks(spec.sizes, here) if spec.check else {}
    context = forecast_report.Context(
        command=command, cores=cores, per_host=per_host, device="cpu" if cpu else "cuda",
        network=network, measured=measured, link_samples=samples, base=base,
        load_avg=load_avg)
    chart = args.work_dir / "forecast.png"
    forecast_report.write_chart(points, checks, context, chart)
    if args.output == "json":
        print(json.dumps({**forecast_report.as_json(points, checks, context),
                          "chart": str(chart)}))
    else:
        print(forecast_report.as_text(points, checks, context) + f"\n\nchart: {chart}")
    return 0
