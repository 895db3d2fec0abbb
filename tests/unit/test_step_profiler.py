"""StepProfiler on one process, on a clock the test moves: phases add up to the step, metrics
lines (its cost per step is benchmarks/step_profiler_cost.py's)."""

from __future__ import annotations

import json

import pytest
import torch

from ringtrain.torch.step_profiler import PHASES, StepProfiler, default_metrics_dir
from tests.clock import FakeClock


def _train(profiler: StepProfiler, clock: FakeClock, steps: int, pause: float) -> None:
    """``steps`` steps in which each phase takes ``pause`` seconds of ``clock`` (the forward
    and backward pass twice that, the unmarked rest half of it)."""
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def batches():
        for _ in range(steps):
            clock.advance(pause)
            yield torch.randn(8, 4)

    for x in profiler.iterate(batches()):
        with profiler.phase("h2d"):
            clock.advance(pause)
        with profiler.phase("forward_backward"):
            model(x).sum().backward()
            clock.advance(2 * pause)
        profiler.optimizer_step(optimizer)
        optimizer.zero_grad()
        clock.advance(pause / 2)  # unmarked: "other"


def test_phases_add_up_to_the_measured_step(tmp_path):
    clock = FakeClock()
    profiler = StepProfiler(metrics_dir=tmp_path, rank=3, clock=clock)
    _train(profiler, clock, 10, 0.004)
    profiler.close()
    s = profiler.summary()
    assert s["steps"] == 10
    expected = {"data_ms": 4.0, "h2d_ms": 4.0, "forward_backward_ms": 8.0, "other_ms": 2.0,
                "communication_ms": 0.0, "optimizer_ms": 0.0}  # a plain optimizer: no wait
    assert {k: s[k] for k in expected} == pytest.approx(expected, abs=1e-6)
    assert s["step_ms"] == pytest.approx(18.0, abs=1e-6)
    lines = (tmp_path / "steps.rank3.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == list(range(10))
    assert all(r["rank"] == 3 and {f"{p}_ms" for p in PHASES} <= r.keys() for r in records)


def test_skip_leaves_warmup_out_of_the_summary():
    profiler = StepProfiler(metrics_dir=False, rank=0, skip=3)
    for _ in profiler.iterate(range(5)):
        pass
    profiler.close()
    assert profiler.summary()["steps"] == 2


def test_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="phase must be one of"), StepProfiler(
            metrics_dir=False, rank=0).phase("other"):
        pass


def test_metrics_dir_comes_from_the_job_environment(tmp_path):
    assert default_metrics_dir({}) is None
    assert default_metrics_dir({"RINGTRAIN_JOB_DIR": "/s/jobs/7"}).as_posix() == "/s/jobs/7/metrics"
    assert default_metrics_dir({"RINGTRAIN_METRICS_DIR": str(tmp_path),
                                "RINGTRAIN_JOB_DIR": "/x"}) == tmp_path


def test_spans_between_marks_and_notes_land_in_the_record(tmp_path):
    clock = FakeClock()
    profiler = StepProfiler(metrics_dir=tmp_path, rank=0, clock=clock)
    profiler.begin_step()
    start = profiler.mark()
    clock.advance(0.005)
    profiler.add_span("forward_backward", start, profiler.mark())
    clock.advance(0.001)
    profiler.note(samples=8)
    profiler.begin_step()  # ends step 0; step 1 is only begun
    profiler.close(finish_current=False)
    records = [json.loads(x) for x in (tmp_path / "steps.rank0.jsonl").read_text().splitlines()]
    assert len(records) == 1 and records[0]["samples"] == 8
    assert records[0]["forward_backward_ms"] == pytest.approx(5.0, abs=1e-6)
    assert records[0]["step_ms"] == pytest.approx(6.0, abs=1e-6)
    with pytest.raises(ValueError, match="phase must be one of"):
        profiler.add_span("other", start, start)


def test_auto_profile_request_is_read_from_the_environment():
    from ringtrain.torch.auto_profile import ProfileRequest

    assert ProfileRequest.from_environ({}) is None
    assert ProfileRequest.from_environ({"RINGTRAIN_STEP_PROFILE": "0"}) is None
    assert ProfileRequest.from_environ({"RINGTRAIN_STEP_PROFILE": "1"}) == ProfileRequest()
    assert ProfileRequest.from_environ({
        "RINGTRAIN_STEP_PROFILE": "1", "RINGTRAIN_SYNTHETIC_DATA": "1",
        "RINGTRAIN_STEP_PROFILE_STEPS": "12"}) == ProfileRequest(synthetic=True, steps=12)
    with pytest.raises(ValueError, match="positive whole number"):
        ProfileRequest.from_environ({"RINGTRAIN_STEP_PROFILE": "1",
                                     "RINGTRAIN_STEP_PROFILE_STEPS": "-3"})
