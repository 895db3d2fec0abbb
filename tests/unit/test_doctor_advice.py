"""The doctor's advice rules, on measurements given here (no training)."""

from __future__ import annotations

from ringtrain.doctor.advice import (
    Measurements,
    ScriptMeasurements,
    advise,
    advise_script,
    workers_needed,
)


def _m(data: float, step: float = 100.0, cuda: bool = False, comm: float = 0.0,
       slower: float = 0.0) -> Measurements:
    """The baseline: ``data`` ms of waiting and forward+backward ``slower`` ms slower than with
    synthetic data (whose step is ``step - data - slower``)."""
    compute = step - data - slower
    return Measurements(batch_size=32, cores_per_rank=8, budget=7, baseline_workers=2, cuda=cuda,
                        synthetic={"step": compute, "forward_backward": compute},
                        real={"step": step, "data": data, "communication": comm, "h2d": 0.0,
                              "forward_backward": compute + slower},
                        decode_ms={"torchvision": 5.0, "folder": 2.0, "packed": 0.5},
                        pack_size=256)


def test_workers_needed_covers_one_batch_per_step():
    assert workers_needed(5.0, 32, 40.0) == 4
    assert workers_needed(0.1, 32, 1000.0) == 1


def test_a_large_data_wait_gets_numbers_and_trials():
    advice = advise(_m(data=60.0))
    assert "data wait is 60%" in advice[0].message and "needs 4 worker(s) instead of 2" in \
        advice[0].message
    trials = [a.trial for a in advice if a.trial]
    assert [t.data for t in trials] == ["packed", "folder"]
    assert trials[0].workers == 1 and "--size 256" in advice[1].message
    assert trials[1].workers == 2


def test_gpu_decode_is_proposed_only_with_cuda():
    assert "gpu" not in [a.trial.data for a in advise(_m(data=60.0)) if a.trial]
    assert "gpu" in [a.trial.data for a in advise(_m(data=60.0, cuda=True)) if a.trial]


def test_a_fed_pipeline_gets_no_trials_and_exposed_allreduce_is_reported():
    advice = advise(_m(data=1.0))
    assert len(advice) == 1 and "keeps up" in advice[0].message and advice[0].trial is None
    assert "99% of synthetic" in advice[0].message
    assert any("allreduce" in a.message for a in advise(_m(data=1.0, comm=30.0)))


def test_workers_that_slow_the_compute_count_as_a_gap():
    advice = advise(_m(data=2.0, slower=20.0))
    assert "forward+backward takes 98.0 ms instead of 78.0 ms" in advice[0].message
    assert [a.trial.data for a in advice if a.trial] == ["packed", "folder"]


def _script(data: float, workers: int | None = 1, synthetic_step: float | None = 20.0,
            comm: float = 0.0) -> ScriptMeasurements:
    step = 40.0
    real = {"step": step, "data": data, "forward_backward": 15.0, "communication": comm}
    synthetic = None if synthetic_step is None else {"step": synthetic_step,
                                                     "forward_backward": 15.0}
    return ScriptMeasurements(real, synthetic, workers, cores_per_rank=8, budget=7)


def test_a_script_waiting_for_its_loader_is_told_how_many_workers():
    # 2 workers keep a 40 ms step waiting: a batch takes ~80 ms, a 20 ms step needs 4.
    advice = advise_script(_script(data=20.0, workers=2))
    assert len(advice) == 1 and advice[0].trial is None
    assert "data wait is 50%" in advice[0].message
    assert "about 80 ms to load" in advice[0].message and "needs 4 loader worker(s)" in \
        advice[0].message and "instead of 2" in advice[0].message
    # Loading in the training process: the wait itself is the batch's cost (20 ms -> 1 worker).
    assert "needs 1 loader worker(s) (DataLoader(num_workers=...)) instead of 0" in \
        advise_script(_script(data=20.0, workers=0))[0].message


def test_a_script_beyond_its_cores_is_told_to_decode_less():
    advice = advise_script(_script(data=20.0, workers=6, synthetic_step=10.0))
    assert "needs 24 loader worker(s)" in advice[0].message
    assert "more than the 7" in advice[0].message and "ringtrain data pack" in advice[0].message


def test_a_script_whose_batches_were_not_seen_says_how_to_show_them():
    advice = advise_script(_script(data=0.0, workers=None, synthetic_step=None, comm=10.0))
    assert "profiled_batches" in advice[0].message
    assert "exposed allreduce wait is 25%" in advice[1].message


def test_a_fed_script_is_told_it_keeps_up():
    advice = advise_script(_script(data=0.5, synthetic_step=39.0))
    assert len(advice) == 1 and "keeps up" in advice[0].message
