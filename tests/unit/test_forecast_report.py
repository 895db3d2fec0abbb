"""``ringtrain doctor --forecast`` without training: its options, reading runs written by the
real step profiler, the workload they give the model, and the report (text, JSON, PNG)."""

from __future__ import annotations

import math

import pytest

from ringtrain.doctor import forecast_report
from ringtrain.doctor.cli import parse_args
from ringtrain.doctor.forecast import (
    ForecastSpec,
    Measured,
    build_network,
    cores_per_worker,
    forecast_table,
    read_run,
)
from ringtrain.doctor.forecast_model import Link, Strategy
from ringtrain.torch.grad_bucket import Bucket
from ringtrain.torch.gradient_plan import GradientPlan
from ringtrain.torch.step_profiler import StepProfiler
from tests.clock import FakeClock


def test_forecast_options_parse_into_a_spec():
    args, command = parse_args(["--forecast", "8,2,4", "--network", "ib-hdr", "--per-host",
                                "4", "--strategies", "ring,ps:2", "--", "python", "t.py"])
    assert command == ["python", "t.py"]
    assert args.forecast_spec == ForecastSpec((2, 4, 8), 4, "ib-hdr",
                                              (Strategy("ring"), Strategy("ps", 2)), True)
    args, _ = parse_args(["--", "python", "t.py"])
    assert args.forecast_spec is None


@pytest.mark.parametrize("argv, message", [
    (["--forecast", "2,x", "--", "python"], "sizes like"),
    (["--forecast", "2", "-np", "2", "--", "python"], "leave out -np"),
    (["--forecast", "2", "--strategies", "tree", "--", "python"], "strategy"),
    (["--forecast", "2", "--per-host", "0", "--", "python"], "--per-host"),
])
def test_bad_forecast_options_say_what_to_do(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err


def _write_steps(folder, steps, *, data_ms, compute_ms, workers, rank=0):
    """Step records through the real profiler, on a clock that each phase moves by its time."""
    clock = FakeClock()
    profiler = StepProfiler(metrics_dir=folder, rank=rank, clock=clock)
    for _ in range(steps):
        profiler.begin_step()
        with profiler.phase("data"):
            clock.advance(data_ms / 1e3)
        with profiler.phase("forward_backward"):
            clock.advance(compute_ms / 1e3)
        profiler.note(samples=16, loader_workers=workers)
    profiler.close()


def test_read_run_takes_medians_after_the_warmup(tmp_path):
    _write_steps(tmp_path, 6, data_ms=20, compute_ms=10, workers=0)
    m = read_run(tmp_path, warmup=1, workers=1, cores=2)
    assert m.samples == 16 and m.loader_workers == 0 and m.plan is None
    assert (m.data_ms, m.compute_ms, m.step_ms) == pytest.approx((20.0, 10.0, 30.0), abs=1e-3)
    w = m.workload()
    assert w.inline_data_ms == m.data_ms and w.pipeline_ms is None and w.overlap == 0.0


def test_a_background_pipeline_that_keeps_the_step_waiting_paces_it():
    slow = Measured(1, 2, step_ms=100.0, compute_ms=40.0, data_ms=60.0, loader_workers=2,
                    samples=32, plan=GradientPlan("cuda", [Bucket("b", 1000, 3.0)], 5))
    w = slow.workload()
    assert w.pipeline_ms == 100.0 and w.inline_data_ms == 0.0 and w.overlap == 1.0
    fast = Measured(1, 2, step_ms=41.0, compute_ms=40.0, data_ms=1.0, loader_workers=2,
                    samples=32)
    assert fast.workload().pipeline_ms is None


def test_cores_per_worker_divides_a_host_among_its_workers():
    assert [cores_per_worker(n, 16, 16) for n in (1, 4, 8, 16, 32)] == [16, 4, 2, 1, 1]
    assert cores_per_worker(4, 2, 2) == 1


def test_network_within_a_host_is_the_measured_link_for_cpu_training():
    link = Link(100e-6, 1e9)
    assert build_network("25gbit", link, cpu=True).intra == link
    assert build_network("25gbit", link, cpu=False).intra != link
    assert build_network("measured", link, cpu=True).inter == link
    with pytest.raises(ValueError, match="measured"):
        build_network("measured", None, cpu=True)


def _report_inputs():
    plan = GradientPlan("cpu", [Bucket("b", 4_000_000, 0.5)], 5)
    base = Measured(1, 2, 100.0, 95.0, 5.0, 0, 64, plan)
    share = Measured(1, 1, 150.0, 144.0, 6.0, 0, 64, plan)
    spec = ForecastSpec((2, 4))
    network = build_network("25gbit", Link(200e-6, 1e9), cpu=True)
    workloads = {2: base.workload(), 1: share.workload()}
    points = forecast_table(spec, workloads, 2, network, 2, cpu=True)
    checks = {2: Measured(2, 1, 170.0, 150.0, 6.0, 0, 64)}
    context = forecast_report.Context(["python", "t.py"], 2, 2, "cpu", network,
                                      {2: base, 1: share}, base, [(4096, 1e-3)])
    return points, checks, context


def test_report_table_json_and_chart(tmp_path):
    points, checks, context = _report_inputs()
    assert [(p.workers, p.strategy) for p in points] == [
        (2, "ring"), (2, "hierarchical"), (2, "ps (k=hosts)"),
        (4, "ring"), (4, "hierarchical"), (4, "ps (k=hosts)")]
    # Every size forecast on its core share: 1 core per worker at 2 and 4 (2 per host).
    assert all(p.compute_ms == 144.0 for p in points)
    text = forecast_report.as_text(points, checks, context)
    assert "warning: this host was busy" not in text
    context.load_avg = (7.5, 7.0, 6.0)
    busy = forecast_report.as_text(points, checks, context)
    assert "warning: this host was busy (load average 7.5 on 2 core(s))" in busy
    assert "1 process on 1 core(s): step 150.0 ms" in text
    assert "4.00 MB per step in 1 bucket(s)" in text and "assumes:" in text
    ring2 = points[0]
    error = (ring2.rate - checks[2].rate) / checks[2].rate
    assert f"{error:+.0%}" in text
    data = forecast_report.as_json(points, checks, context)
    assert data["checks"][0]["error"] == pytest.approx(error)
    assert math.isclose(data["checks"][0]["measured"], 2 * 64 * 1e3 / 170.0)
    assert len(data["forecast"]) == 6 and data["buckets"][0]["nbytes"] == 4_000_000
    path = tmp_path / "forecast.png"
    forecast_report.write_chart(points, checks, context, path)
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_terminal_chart_bars_follow_efficiency():
    points, _, _ = _report_inputs()
    lines = forecast_report.terminal_chart(points, width=20)
    assert len(lines) == 1 + len(points)
    for line, p in zip(lines[1:], points):
        assert line.count("#") == round(min(1.0, p.efficiency) * 20)
