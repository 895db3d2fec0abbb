"""A job's ranks share the machine's cores whatever the nodes they are split into: two nodes of a
local cluster on one machine must not each give their ranks every core."""

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
