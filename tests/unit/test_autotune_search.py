"""Autotuning's search (the real bayesian-optimization library) on a known score surface, its
log lines, and the best settings file read back by `ringtrain run --config-file`."""

from __future__ import annotations

import itertools
import math

import pytest

from ringtrain.contract.env import engine_environ, read_engine_config
from ringtrain.engine.config import AutotuneConfig, EngineConfig
from ringtrain.runner.config import load_config
from ringtrain.torch.autotune_search import (
    LOG_COLUMNS,
    Search,
    Setting,
    best_config_path,
    best_config_yaml,
    log_header,
    log_line,
)

pytest.importorskip("bayes_opt")


def _score(s: Setting) -> float:
    """Steps/s of a made-up job: best near 16 MiB buckets, 1 ms cycles and 2 threads."""
    return (100.0 * math.exp(-0.5 * ((math.log2(s.bucket_mb) - 4) / 1.5) ** 2)
            * math.exp(-0.5 * (math.log2(s.cycle_time_ms) / 2.0) ** 2)
            * (1.0 if s.threads == 2 else 0.8))


def test_search_from_a_bad_start_gets_within_5_percent_of_the_grid_in_20_samples():
    grid = [Setting(b, c, t) for b, c, t in itertools.product(
        (1, 2, 4, 8, 16, 32, 64), (0.5, 1, 2, 4, 8, 16), (1, 2, 3, 4))]
    grid_best = max(map(_score, grid))
    search = Search(max_threads=4, noise=0.1, seed=0)
    setting = Setting(1.0, 16.0, 1)  # 1 MiB buckets, long cycles, one thread
    for _ in range(20):
        search.register(setting, _score(setting))
        setting = search.suggest()
        assert 1 <= setting.bucket_mb <= 64 and 0.5 <= setting.cycle_time_ms <= 16
        assert setting.threads in (1, 2, 3, 4)
    best, score = search.best()
    assert score >= 0.95 * grid_best, (best, score, grid_best)


def test_one_thread_per_rank_is_not_searched():
    search = Search(max_threads=1, noise=0.8)
    search.register(Setting(4.0, 1.0, 1), 10.0)
    assert search.suggest().threads == 1
    with pytest.raises(ValueError):
        Search(max_threads=1, noise=0.8).best()


def test_log_lines_follow_horovods_columns_then_ringtrains():
    assert log_header().split(",")[:5] == ["hierarchical_allreduce", "hierarchical_allgather",
                                           "cache_enabled", "cycle_time_ms",
                                           "tensor_fusion_threshold"]
    line = log_line(Setting(8.0, 2.5, 2), 12.3456789)
    assert dict(zip(LOG_COLUMNS, line.split(","))) == {
        "hierarchical_allreduce": "0", "hierarchical_allgather": "0", "cache_enabled": "1",
        "cycle_time_ms": "2.5", "tensor_fusion_threshold": "8", "threads_per_rank": "2",
        "score": "12.3457"}


def test_best_settings_file_is_a_config_file_ringtrain_run_reads(tmp_path):
    path = tmp_path / best_config_path("tune.csv")
    assert path.name == "tune.csv.best.yaml"
    assert best_config_path(None).name == "autotune-best.yaml"
    path.write_text(best_config_yaml(Setting(6.5, 3.0, 2), 40.0, 20))
    knobs = load_config(["-np", "1", "--config-file", str(path), "x"], {}).knobs
    assert (knobs.bucket_bytes, knobs.cycle_time_ms, knobs.threads_per_rank) == (
        int(6.5 * 1024 * 1024), 3.0, 2)


def test_autotune_settings_travel_to_the_workers():
    knobs = EngineConfig(bucket_bytes=3 * 1024 * 1024, threads_per_rank=2,
                         autotune=AutotuneConfig("t.csv", 1, 4, 9, 0.25))
    assert read_engine_config(engine_environ(knobs)) == knobs
    assert read_engine_config(engine_environ(EngineConfig())) == EngineConfig()


def test_a_setting_measured_again_is_kept_as_a_sample_and_prints_nothing(capsys) -> None:
    search = Search(max_threads=2, noise=0.01)
    setting = Setting(64.0, 32.0, 2)  # the upper corner: a repeat must stay inside the bounds
    for score in (10.0, 11.0, 12.0):
        search.register(setting, score)
    assert len(search._bo.space) == 3 and len(search.samples) == 3
    assert capsys.readouterr().out == ""  # the library's red "is not unique" line
    assert isinstance(search.suggest(), Setting)
