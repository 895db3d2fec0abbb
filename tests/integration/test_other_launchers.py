"""``hvd.init()`` under launchers other than ``ringtrain run``: two real processes each.

The same script (``scripts/report_world.py``) runs under torchrun, with mpirun's (Open MPI and
PMI) and Slurm's variables as those launchers set them, and alone with no launcher at all.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "report_world.py")
_TIMEOUT_S = 120
# Whatever launched pytest must not leak into the launches below.
_LAUNCHER_PREFIXES = ("HOROVOD_", "RINGTRAIN_", "OMPI_", "PMI_", "MPI_", "SLURM_", "TORCHELASTIC_")
_LAUNCHER_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                   "MASTER_ADDR", "MASTER_PORT"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_LAUNCHER_PREFIXES) and k not in _LAUNCHER_NAMES}
    return env | {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}


def _reports(stdouts: list[str]) -> list[dict]:
    reports = [json.loads(line) for out in stdouts for line in out.splitlines()
               if line.startswith("{")]
    return sorted(reports, key=lambda r: r["rank"])


def _run_ranks(per_rank_env: list[dict[str, str]]) -> list[dict]:
    """Start one process per env (as the launcher would have), wait, return the reports."""
    procs = [subprocess.Popen([sys.executable, SCRIPT], env=_base_env() | env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for env in per_rank_env]
    outs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=_TIMEOUT_S)
            assert proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{err}"
            outs.append(out)
    finally:
        for proc in procs:
            proc.kill()
    return _reports(outs)


def _assert_two_ranks_on_one_host(reports: list[dict]) -> None:
    assert [(r["rank"], r["size"], r["local_rank"], r["local_size"], r["cross_rank"],
             r["cross_size"]) for r in reports] == [(0, 2, 0, 2, 0, 1), (1, 2, 1, 2, 0, 1)]
    for r in reports:
        assert (r["sum"], r["mean"], r["gathered"], r["root"]) == (3.0, 1.5, [1.0, 2.0], 1.0)


def test_torchrun_agent_hosts_the_store():
    # torchrun's agent serves the store at MASTER_ADDR:MASTER_PORT and tells the workers so
    # (TORCHELASTIC_USE_AGENT_STORE): rank 0 must connect to it, not try to serve it again.
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
         "--monitor-interval", "0.1", SCRIPT],
        env=_base_env(), capture_output=True, text=True, timeout=_TIMEOUT_S)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    _assert_two_ranks_on_one_host(_reports([result.stdout]))


def test_open_mpi_variables_with_master_addr():
    port = str(_free_port())
    _assert_two_ranks_on_one_host(_run_ranks([
        {"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": "2",
         "OMPI_COMM_WORLD_LOCAL_RANK": str(r), "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        for r in range(2)]))


def test_pmi_variables_local_ranks_derived_from_hostnames():
    port = str(_free_port())
    _assert_two_ranks_on_one_host(_run_ranks([
        {"PMI_RANK": str(r), "PMI_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        for r in range(2)]))


def test_slurm_variables_master_addr_from_the_node_list():
    port = str(_free_port())
    _assert_two_ranks_on_one_host(_run_ranks([
        {"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r),
         "SLURM_STEP_NODELIST": "localhost", "MASTER_PORT": port}
        for r in range(2)]))


def test_single_process_without_a_launcher_is_a_world_of_one():
    (report,) = _run_ranks([{}])
    assert report == {"rank": 0, "size": 1, "local_rank": 0, "local_size": 1, "cross_rank": 0,
                      "cross_size": 1, "sum": 1.0, "mean": 1.0, "gathered": [1.0], "root": 1.0}
