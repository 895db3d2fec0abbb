"""`LaunchConfig` from flags, YAML and the environment, and the errors bad input gets."""

from __future__ import annotations

import logging

import pytest

from ringtrain.contract.env import engine_environ, read_engine_config
from ringtrain.engine.config import AutotuneConfig, EngineConfig
from ringtrain.errors import ConfigError
from ringtrain.runner.config import ElasticSpec, LaunchConfig, load_config
from ringtrain.runner.hosts import HostInfo

MIB = 1024 * 1024


def load(*argv: str, environ: dict[str, str] | None = None) -> LaunchConfig:
    return load_config(list(argv), environ or {})


def test_minimal_run_defaults_to_localhost_with_np_slots():
    config = load("-np", "2", "python", "train.py", "--lr", "0.1")
    assert config.command == ("python", "train.py", "--lr", "0.1")
    assert config.num_proc == 2
    assert config.hosts == (HostInfo("localhost", 2),)
    assert config.start_timeout_s == 30.0
    assert config.knobs == EngineConfig()
    assert config.knobs.fusion_threshold_bytes == 128 * MIB
    assert config.knobs.cycle_time_ms == 1.0


def test_double_dash_separates_the_command():
    config = load("--num-proc", "1", "--", "python", "-u", "x.py", "-np", "9")
    assert config.command == ("python", "-u", "x.py", "-np", "9")
    assert config.num_proc == 1


def test_np_defaults_to_total_slots_of_hosts():
    config = load("-H", "a:2,b:3", "python", "x.py")
    assert config.num_proc == 5
    assert config.hosts == (HostInfo("a", 2), HostInfo("b", 3))


def test_elastic_options_as_horovodrun_reads_them(tmp_path):
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:2\n")
    config = load("-np", "3", "--min-np", "2", "--max-np", "4", "--reset-limit", "1",
                  "--host-discovery-script", str(script), "--slots-per-host", "2", "python",
                  "x.py")
    assert config.num_proc == 3 and config.hosts == ()  # the script names the hosts
    assert config.elastic == ElasticSpec(min_np=2, max_np=4, discovery_script=str(script),
                                         reset_limit=1, timeout_s=600.0, slots_per_host=2)
    # --min-np alone makes a launch elastic on -H's fixed hosts; -np defaults to it, and
    # --min-np to -np; the timeout comes from Horovod's variable when not given.
    fixed = load("--min-np", "2", "-H", "a:2,b:2", "x", environ={"HOROVOD_ELASTIC_TIMEOUT": "5"})
    assert (fixed.num_proc, fixed.elastic) == (2, ElasticSpec(min_np=2, timeout_s=5.0))
    assert load("-np", "3", "--host-discovery-script", str(script), "x").elastic.min_np == 3
    assert load("-np", "2", "x").elastic is None


def test_every_flag_lands_in_the_config(tmp_path):
    key = tmp_path / "id"
    key.write_text("key")
    config = load(
        "-np", "3", "-H", "a:2,b:1", "-p", "2222", "-i", str(key), "--start-timeout", "7.5",
        "--network-interfaces", "eth0,eth1", "--output-filename", str(tmp_path / "logs"),
        "--prefix-output-with-timestamp", "--verbose", "--log-level", "debug",
        "--fusion-threshold-mb", "32", "--cycle-time-ms", "5", "--cache-capacity", "64",
        "--timeline-filename", "tl.json", "--timeline-mark-cycles", "--no-stall-check",
        "--stall-check-warning-time-seconds", "20", "--stall-check-shutdown-time-seconds", "90",
        "--gloo", "--horovod-compat", "python", "x.py")
    assert (config.ssh_port, config.ssh_identity_file, config.start_timeout_s) == (
        2222, str(key), 7.5)
    assert config.network_interfaces == ("eth0", "eth1")
    assert config.output_filename == str(tmp_path / "logs")
    assert config.prefix_output_with_timestamp and config.verbose and config.horovod_compat
    assert config.knobs == EngineConfig(
        fusion_threshold_bytes=32 * MIB, cycle_time_ms=5.0, cache_capacity=64,
        timeline_filename="tl.json", timeline_mark_cycles=True,
        stall_check_enabled=False, stall_warning_s=20.0, stall_shutdown_s=90.0,
        log_level="DEBUG")


def test_disable_cache_sets_capacity_zero():
    assert load("-np", "1", "--disable-cache", "x").knobs.cache_capacity == 0


def test_exported_horovod_knobs_apply_unless_a_flag_overrides():
    environ = {"HOROVOD_CYCLE_TIME": "3", "HOROVOD_FUSION_THRESHOLD": "1024"}
    config = load("-np", "1", "--cycle-time-ms", "7", "x", environ=environ)
    assert config.knobs.cycle_time_ms == 7.0
    assert config.knobs.fusion_threshold_bytes == 1024


def test_hostfile(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two nodes\nnode1 slots=2\nnode2 slots=2\n")
    config = load("-np", "3", "--hostfile", str(hostfile), "python", "x.py")
    assert config.hosts == (HostInfo("node1", 2), HostInfo("node2", 2))


def test_flat_yaml_config_and_cli_wins(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "num-proc: 2\nhosts: [a:1, b:1]\nfusion_threshold_mb: 16\ncycle-time-ms: 4\n"
        "verbose: 2\nno-stall-check: true\ncommand: python train.py --epochs 1\n")
    config = load("--config-file", str(cfg), "--cycle-time-ms", "9")
    assert config.num_proc == 2
    assert config.hosts == (HostInfo("a", 1), HostInfo("b", 1))
    assert config.knobs.fusion_threshold_bytes == 16 * MIB
    assert config.knobs.cycle_time_ms == 9.0  # the command line wins
    assert config.verbose and not config.knobs.stall_check_enabled
    assert config.command == ("python", "train.py", "--epochs", "1")
    # A command on the command line replaces the file's.
    assert load("--config-file", str(cfg), "python", "other.py").command == ("python", "other.py")


def test_horovod_sectioned_yaml(tmp_path, caplog):
    cfg = tmp_path / "horovod.yaml"
    cfg.write_text(
        "verbose: 0\n"
        "params:\n  fusion_threshold_mb: 8\n  cycle_time_ms: 2\n  cache_capacity: 10\n"
        "  hierarchical_allreduce: false\n"
        "autotune:\n  enabled: false\n"
        "timeline:\n  filename: /tmp/t.json\n  mark_cycles: true\n"
        "stall_check:\n  enabled: false\n  warning_time_seconds: 5\n"
        "logging:\n  level: warning\n")
    with caplog.at_level(logging.WARNING):
        config = load("-np", "1", "--config-file", str(cfg), "x")
    assert config.knobs == EngineConfig(
        fusion_threshold_bytes=8 * MIB, cycle_time_ms=2.0, cache_capacity=10,
        timeline_filename="/tmp/t.json", timeline_mark_cycles=True, stall_check_enabled=False,
        stall_warning_s=5.0, log_level="WARNING", hierarchical_allreduce=False)
    assert "ignored" not in caplog.text


def test_autotune_flags_build_the_autotune_config():
    config = load("-np", "1", "--autotune", "--autotune-log-file", "a.csv",
                  "--autotune-warmup-samples", "2", "--autotune-steps-per-sample", "5",
                  "--autotune-bayes-opt-max-samples", "12",
                  "--autotune-gaussian-process-noise", "0.5", "x")
    assert config.knobs.autotune == AutotuneConfig("a.csv", 2, 5, 12, 0.5)
    assert load("-np", "1", "--autotune", "x").knobs.autotune == AutotuneConfig()
    assert load("-np", "1", "x").knobs.autotune is None


@pytest.mark.parametrize("argv, words", [
    (["--autotune-log-file", "a.csv"], "^--autotune-log-file given without --autotune"),
    (["--autotune", "--autotune-steps-per-sample", "0"],
     "--autotune-steps-per-sample must be at least 1"),
    (["--autotune", "--autotune-bayes-opt-max-samples", "0"],
     "--autotune-bayes-opt-max-samples must be at least 1"),
    (["--bucket-mb", "0"], "--bucket-mb must be positive"),
    (["--threads-per-rank", "0"], "--threads-per-rank must be at least 1"),
])
def test_bad_autotune_and_tuning_flags(argv, words):
    with pytest.raises(ConfigError, match=words):
        load("-np", "1", *argv, "x")


def test_bucket_and_threads_knobs_from_flags_and_a_written_best_file(tmp_path):
    config = load("-np", "1", "--bucket-mb", "4", "--threads-per-rank", "2", "x")
    assert (config.knobs.bucket_bytes, config.knobs.threads_per_rank) == (4 * MIB, 2)
    cfg = tmp_path / "best.yaml"
    cfg.write_text("params:\n  bucket_mb: 8\n  cycle_time_ms: 3.5\n  threads_per_rank: 1\n")
    knobs = load("-np", "1", "--config-file", str(cfg), "x").knobs
    assert (knobs.bucket_bytes, knobs.cycle_time_ms, knobs.threads_per_rank) == (8 * MIB, 3.5, 1)


def test_log_level_from_the_environment_takes_any_case():
    config = load("-np", "1", "x", environ={"HOROVOD_LOG_LEVEL": "debug"})
    assert config.knobs.log_level == "debug"
    with pytest.raises(ConfigError, match="--log-level must be one of TRACE, DEBUG, INFO"):
        load("-np", "1", "x", environ={"HOROVOD_LOG_LEVEL": "loud"})


@pytest.mark.parametrize("argv, words", [
    (["-np", "0", "x"], r"-np/--num-proc: 0 ranks requested; give at least 1"),
    (["-np", "-2", "x"], r"-np/--num-proc: -2 ranks"),
    (["-np", "5", "-H", "a:2,b:2", "x"],
     r"-np/--num-proc: 5 ranks requested but the hosts \(a:2,b:2\) have only 4 slots"),
    (["-np", "two", "x"], r"argument -np/--num-proc: invalid int value"),
    (["-np", "2"], r"no command given"),
    (["x.py"], r"-np/--num-proc is required"),
    (["-np", "1", "-H", "a:1,,b", "x"], r"-H/--hosts has an empty entry"),
    (["-np", "1", "-H", "a:zero", "x"], r"-H/--hosts entry 'a:zero': slots 'zero'"),
    (["-np", "1", "-H", "a:1", "--hostfile", "f", "x"], r"use one of them"),
    (["-np", "1", "--hostfile", "/nonexistent/hosts", "x"], r"--hostfile /nonexistent/hosts"),
    (["-np", "1", "--mpi", "x"], r"--mpi: ringtrain has no MPI"),
    (["-np", "1", "--bogus", "x"], r"unrecognized arguments: --bogus"),
    (["-np", "1", "-p", "70000", "x"], r"-p/--ssh-port: 70000"),
    (["-np", "1", "-i", "/nonexistent/key", "x"], r"-i/--ssh-identity-file: /nonexistent/key"),
    (["-np", "1", "--start-timeout", "0", "x"], r"--start-timeout: must be positive"),
    (["-np", "1", "--cycle-time-ms", "0", "x"], r"--cycle-time-ms must be positive"),
    (["-np", "1", "--fusion-threshold-mb", "-1", "x"], r"--fusion-threshold-mb must not"),
    (["-np", "1", "--log-level", "loud", "x"], r"--log-level must be one of"),
    (["-np", "1", "--network-interfaces", "eth0,", "x"], r"--network-interfaces: .* empty"),
    (["-np", "1", "--config-file", "/nonexistent.yaml", "x"], r"--config-file /nonexistent"),
    (["-np", "2", "--min-np", "3", "x"], r"-np/--num-proc: 2 lies outside"),
    (["-np", "5", "--min-np", "1", "--max-np", "4", "x"], r"-np/--num-proc: 5 lies outside"),
    (["--min-np", "2", "--max-np", "1", "x"], r"--max-np: 1 is below --min-np 2"),
    (["--min-np", "0", "x"], r"--min-np: must be at least 1"),
    (["-np", "1", "--host-discovery-script", "/nonexistent.sh", "x"],
     r"--host-discovery-script: /nonexistent.sh does not exist"),
    (["--host-discovery-script", "/etc/hostname", "x"], r"elastic launch needs -np"),
    (["-np", "2", "--host-discovery-script", "/etc/hostname", "-H", "a:2", "x"],
     r"--host-discovery-script and -H/--hosts"),
    (["--min-np", "1", "--reset-limit", "-1", "x"], r"--reset-limit: must not be negative"),
    (["--min-np", "1", "--elastic-timeout", "0", "x"], r"--elastic-timeout: must be positive"),
    (["-np", "2", "--reset-limit", "3", "--max-np", "4", "x"],
     r"--max-np/--max-num-proc, --reset-limit: only for elastic launches"),
    (["-np", "2", "--world-file", "w.json", "x"], r"--world-file: only for elastic launches"),
])
def test_bad_input_names_the_flag(argv, words):
    with pytest.raises(ConfigError, match=words):
        load(*argv)


def test_output_filename_must_not_be_a_file(tmp_path):
    (tmp_path / "out").write_text("")
    with pytest.raises(ConfigError, match="--output-filename: .* is a file"):
        load("-np", "1", "--output-filename", str(tmp_path / "out"), "x")


@pytest.mark.parametrize("yaml_text, words", [
    ("[1, 2]\n", "expected a mapping"),
    ("num-proc: [1]\n", "takes a single value"),
    ("num-proc: two\n", "value 'two' is not valid"),
    ("verbose: maybe\n", "takes true or false"),
    ("colour: red\n", "'colour': not an option"),
    ("params:\n  turbo: 1\n", "unknown key 'turbo'"),
    ("num-proc: [\n", "not valid YAML"),
    # Horovod's autotune settings need `enabled: true`, as their flags need --autotune.
    ("autotune-warmup-samples: 3\n", "^--autotune-warmup-samples given without --autotune"),
    ("autotune:\n  enabled: false\n  log_file: a.csv\n",
     "^--autotune-log-file given without --autotune"),
])
def test_bad_config_file(tmp_path, yaml_text, words):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml_text)
    with pytest.raises(ConfigError, match=words):
        load("-np", "1", "--config-file", str(cfg), "x")


def test_launch_config_validates_when_built_directly():
    with pytest.raises(ConfigError, match="no command given"):
        LaunchConfig(command=(), num_proc=1, hosts=(HostInfo("localhost", 1),))
    with pytest.raises(ConfigError, match="only 1 slots"):
        LaunchConfig(command=("x",), num_proc=2, hosts=(HostInfo("localhost", 1),))


def test_autotune_from_a_horovod_config_file(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("autotune:\n  enabled: true\n  log_file: t.csv\n  warmup_samples: 1\n")
    tune = load("-np", "1", "--config-file", str(cfg), "x").knobs.autotune
    assert tune == AutotuneConfig(log_file="t.csv", warmup_samples=1)


def test_shared_memory_switches_reach_the_workers_environment():
    assert load("-np", "2", "x").knobs.shared_memory is None  # wherever ranks share a host
    off = load("-np", "2", "--no-shm", "x").knobs
    assert off.shared_memory is False
    assert engine_environ(off)["RINGTRAIN_SHM"] == "0"
    assert load("-np", "2", "--shm", "x").knobs.shared_memory is True
    assert load("-np", "2", "x", environ={"RINGTRAIN_SHM": "0"}).knobs.shared_memory is False
    assert load("-np", "2", "--shm", "x", environ={"RINGTRAIN_SHM": "0"}).knobs.shared_memory
    hier = load("-np", "2", "--hierarchical-allreduce", "x").knobs
    assert engine_environ(hier)["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "1"
    assert read_engine_config(engine_environ(hier)) == hier
    assert "RINGTRAIN_SHM" not in engine_environ(EngineConfig())


def test_contradictory_shared_memory_switches_are_refused():
    with pytest.raises(ConfigError, match="--shm and --no-shm contradict each other"):
        load("-np", "2", "--shm", "--no-shm", "x")
    with pytest.raises(ConfigError, match="--hierarchical-allreduce reduces within each host "
                                          "through shared memory, which --no-shm"):
        load("-np", "2", "--no-shm", "--hierarchical-allreduce", "x")
    with pytest.raises(ConfigError, match="HOROVOD_HIERARCHICAL_ALLREDUCE=1 reduces within each "
                                          "host through shared memory, which RINGTRAIN_SHM=0"):
        read_engine_config({"RINGTRAIN_SHM": "0", "HOROVOD_HIERARCHICAL_ALLREDUCE": "1"})
    with pytest.raises(ConfigError, match=r"RINGTRAIN_SHM='maybe' is not a boolean"):
        read_engine_config({"RINGTRAIN_SHM": "maybe"})
