"""A job's ranks share the machine whatever the nodes they are split into: two nodes of a local
cluster on one machine must not each give their ranks every core, and their ranks reduce through
shared memory as the ranks of one node do."""

from __future__ import annotations

import sys
from pathlib import Path

from ringtrain.jobs.home import Home
from ringtrain.runner.threads import threads_per_rank, usable_cores

from .conftest import CLI
from .test_e2e import spec_file

PRINT_THREADS = (f"{sys.executable} -c "
                 "\"import os; print('threads', os.environ['OMP_NUM_THREADS'])\"")


def _threads_of_ranks(home: Home, job_id: str, ranks: int) -> list[str]:
    logs = home.share_root / "jobs" / job_id / "stdouterr"
    return [(logs / f"rank.{r}" / "stdout").read_text().split()[-1] for r in range(ranks)]


def test_two_nodes_on_one_machine_share_its_cores_unless_the_job_says(
        home: Home, cli: CLI, tmp_path: Path) -> None:
    rc, _, err = cli("cluster", "create", "local", "--nodes", "2", "--slots", "2")
    assert rc == 0, err
    spec = spec_file(tmp_path, "threads", node_count=2, process_count_per_node=1,
                     command=PRINT_THREADS)
    rc, out, err = cli("job", "submit", spec, "--cluster", "local", "--follow")
    assert rc == 0, err
    expected = str(threads_per_rank(usable_cores(), 2))  # 2 ranks on this machine
    assert _threads_of_ranks(home, out.splitlines()[0], 2) == [expected, expected]

    spec = spec_file(tmp_path, "chosen", node_count=2, process_count_per_node=1,
                     command=PRINT_THREADS, environment={"OMP_NUM_THREADS": "3"})
    rc, out, err = cli("job", "submit", spec, "--cluster", "local", "--follow")
    assert rc == 0, err
    assert _threads_of_ranks(home, out.splitlines()[0], 2) == ["3", "3"]


PRINT_BACKEND = (f"{sys.executable} -c \"import torch, ringtrain.torch as hvd\n"
                 "from ringtrain.torch import runtime\n"
                 "hvd.init()\n"
                 "total = hvd.allreduce(torch.ones(3) * (hvd.rank() + 1), op=hvd.Sum)\n"
                 "print('backend', type(runtime.current().backend).__name__, total.tolist())\"")


def test_two_nodes_on_one_machine_reduce_through_shared_memory(home: Home, cli: CLI,
                                                               tmp_path: Path) -> None:
    # Each node is a host name of its own (a launch over two host names of one machine keeps
    # them apart: Gloo over loopback); the job service tells the ranks they are one machine, so
    # they share memory as `ringtrain run -np 2` does.
    rc, _, err = cli("cluster", "create", "local", "--nodes", "2", "--slots", "1")
    assert rc == 0, err
    spec = spec_file(tmp_path, "shm", node_count=2, command=PRINT_BACKEND)
    rc, out, err = cli("job", "submit", spec, "--cluster", "local", "--follow")
    assert rc == 0, err
    logs = home.share_root / "jobs" / out.splitlines()[0] / "stdouterr"
    for r in range(2):
        assert (logs / f"rank.{r}" / "stdout").read_text().split() == [
            "backend", "HierarchicalBackend", "[3.0,", "3.0,", "3.0]"]
