"""The worker side of the env contract: each launcher's variables, parsed by read_worker_env."""

from __future__ import annotations

import pytest

from ringtrain.contract.env import (
    engine_environ,
    first_slurm_host,
    read_engine_config,
    read_worker_env,
)
from ringtrain.engine.config import EngineConfig
from ringtrain.errors import ConfigError

ADDR = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"}


def _place(env) -> tuple:
    return (env.launcher, env.rank, env.size, env.local_rank, env.local_size, env.cross_rank,
            env.cross_size)


def test_no_launcher_is_a_world_of_one():
    env = read_worker_env({"HOROVOD_HOSTNAME": "box"})
    assert _place(env) == ("none", 0, 1, 0, 1, 0, 1)
    assert (env.hostname, env.master_addr, env.launcher_store) == ("box", None, False)


def test_ringtrain_run_contract_wins_over_torchruns_names_it_also_sets():
    env = read_worker_env({
        "HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1",
        "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2",
        "RANK": "0", "WORLD_SIZE": "1", "RINGTRAIN_LAUNCHER_STORE": "1",
        "RINGTRAIN_RUN_ID": "r9", **ADDR})
    assert _place(env) == ("ringtrain", 3, 4, 1, 2, 1, 2)
    assert (env.launcher_store, env.run_id, env.master_port) == (True, "r9", 29400)


def test_torchrun_with_its_agents_store():
    env = read_worker_env({
        "RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "job7", **ADDR})
    assert _place(env) == ("torchrun", 1, 4, 1, 2, None, None)
    assert (env.master_addr, env.master_port) == ("10.0.0.1", 29400)
    assert env.launcher_store and env.run_id == "job7"


def test_plain_env_init_variables_make_rank_0_serve_the_store():
    env = read_worker_env({"RANK": "0", "WORLD_SIZE": "2", **ADDR})
    assert _place(env) == ("torchrun", 0, 2, None, None, None, None)
    assert not env.launcher_store and env.run_id == "default"


def test_open_mpi():
    env = read_worker_env({
        "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1", **ADDR})
    assert _place(env) == ("mpirun", 2, 3, 0, 1, None, None)
    assert not env.launcher_store


def test_pmi_with_and_without_local_ranks():
    hydra = read_worker_env({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1",
                             "MPI_LOCALNRANKS": "2", **ADDR})
    assert _place(hydra) == ("mpirun", 1, 2, 1, 2, None, None)
    bare = read_worker_env({"PMI_RANK": "1", "PMI_SIZE": "2", **ADDR})
    assert _place(bare) == ("mpirun", 1, 2, None, None, None, None)


def test_slurm_takes_master_addr_from_the_step_node_list():
    env = read_worker_env({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
                           "SLURM_STEP_NODELIST": "gpu[03-06,09]", "MASTER_PORT": "29600",
                           "SLURM_JOB_NODELIST": "other"})
    assert _place(env) == ("slurm", 5, 8, 1, None, None, None)
    assert (env.master_addr, env.master_port) == ("gpu03", 29600)


def test_slurm_falls_back_to_the_job_node_list_and_defers_to_master_addr():
    env = read_worker_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n1"})
    assert (env.master_addr, env.master_port) == ("n1", 29500)
    env = read_worker_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2",
                           "SLURM_STEP_NODELIST": "n1", "MASTER_ADDR": "login"})
    assert env.master_addr == "login"


@pytest.mark.parametrize("nodelist, first", [
    ("localhost", "localhost"),
    ("node[07-09,12],gpu3", "node07"),
    ("gpu3,node[1-2]", "gpu3"),
    ("rack1-node[003-010]", "rack1-node003"),
    ("  a.example.org ", "a.example.org"),
    ("", None),
])
def test_first_slurm_host(nodelist, first):
    assert first_slurm_host(nodelist) == first


@pytest.mark.parametrize("environ", [
    {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},
    {"PMI_RANK": "0", "PMI_SIZE": "4"},
    {"SLURM_PROCID": "0", "SLURM_NTASKS": "2"},
    {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": ""},
    {"RANK": "1", "WORLD_SIZE": "2"},
], ids=["ompi", "pmi", "slurm", "slurm-empty-nodelist", "env-init"])
def test_multi_rank_launch_without_master_addr_says_what_to_export(environ):
    with pytest.raises(ConfigError, match="MASTER_ADDR is not set: export MASTER_ADDR"):
        read_worker_env(environ)


def test_single_rank_mpirun_needs_no_master_addr():
    env = read_worker_env({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"})
    assert _place(env)[:3] == ("mpirun", 0, 1) and env.master_addr is None


@pytest.mark.parametrize("name, value", [
    ("OMPI_COMM_WORLD_RANK", "zero"),
    ("OMPI_COMM_WORLD_SIZE", "2.0"),
    ("OMPI_COMM_WORLD_LOCAL_RANK", "first"),
    ("MASTER_PORT", "http"),
    ("TORCHELASTIC_USE_AGENT_STORE", "maybe"),
    ("HOROVOD_CYCLE_TIME", "fast"),
    ("HOROVOD_FUSION_THRESHOLD", "64MB"),
    ("HOROVOD_START_TIMEOUT", "soon"),
])
def test_malformed_variable_is_named(name, value):
    environ = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", **ADDR, name: value}
    with pytest.raises(ConfigError, match=f"{name}={value!r} is not"):
        read_worker_env(environ)


@pytest.mark.parametrize("environ, missing", [
    ({"OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_SIZE"),
    ({"PMI_RANK": "0", "PMI_SIZE": " "}, "PMI_SIZE"),
    ({"HOROVOD_RANK": "0"}, "HOROVOD_SIZE"),
])
def test_missing_world_size_is_named(environ, missing):
    with pytest.raises(ConfigError, match=f"{missing} is required but not set"):
        read_worker_env(environ)


@pytest.mark.parametrize("rank, size", [("2", "2"), ("-1", "2"), ("0", "0")])
def test_rank_outside_the_world_is_refused(rank, size):
    with pytest.raises(ConfigError, match=f"rank {rank} of world size {size}"):
        read_worker_env({"SLURM_PROCID": rank, "SLURM_NTASKS": size, **ADDR})


def test_engine_config_round_trips_through_horovods_variables():
    config = EngineConfig(fusion_threshold_bytes=1 << 20, cycle_time_ms=2.5, cache_capacity=0,
                          timeline_filename="t.json", timeline_mark_cycles=True,
                          stall_check_enabled=False, stall_warning_s=5, stall_shutdown_s=30,
                          log_level="debug")
    assert read_engine_config(engine_environ(config)) == config
    env = read_worker_env({"HOROVOD_CYCLE_TIME": "3", "HOROVOD_STALL_CHECK_DISABLE": "yes"})
    assert env.knobs.cycle_time_ms == 3.0 and not env.knobs.stall_check_enabled


def test_shared_memory_scope_is_read_round_tripped_and_checked():
    assert read_engine_config({}).shared_memory_scope == "host"
    knobs = read_engine_config({"RINGTRAIN_SHM_SCOPE": "machine"})
    assert knobs.shared_memory_scope == "machine"
    assert read_engine_config(engine_environ(knobs)) == knobs
    with pytest.raises(ConfigError, match="RINGTRAIN_SHM_SCOPE='node' is not one of host, "
                                          "machine"):
        read_engine_config({"RINGTRAIN_SHM_SCOPE": "node"})
