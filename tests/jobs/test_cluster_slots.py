"""`ringtrain cluster resize --slots`: a cluster's slots per node change for the jobs that start
later; a job waiting for more slots than asked for keeps the change from happening."""

from __future__ import annotations

import pytest

from ringtrain.jobs.errors import InvalidRequestError, SpecError
from ringtrain.jobs.executors.backend import LocalBackend
from ringtrain.jobs.home import Home
from ringtrain.jobs.models import ClusterSpec, parse_job_spec
from ringtrain.jobs.service import JobService

from .conftest import CLI


def test_slots_grow_so_a_two_process_job_fits_and_shrink_only_below_waiting_jobs(
        store, share, fake_executor, clock) -> None:
    service = JobService(store, share, [LocalBackend(fake_executor)], clock)
    service.create_cluster(ClusterSpec(name="c", nodes=2, slots=1))
    two = parse_job_spec({"node_count": 1, "process_count_per_node": 2, "command": "true"})
    with pytest.raises(SpecError, match="at most 1"):
        service.submit("c", two)
    info = service.resize_cluster("c", slots=2)
    assert (info.slots, info.target_nodes) == (2, 2)
    service.submit("c", two)
    with pytest.raises(InvalidRequestError, match="process_count_per_node 2"):
        service.resize_cluster("c", slots=1)
    assert service.get_cluster("c").slots == 2
    info = service.resize_cluster("c", nodes=3, slots=4)
    assert (info.slots, info.target_nodes) == (4, 3)
    with pytest.raises(InvalidRequestError, match="nodes, of slots"):
        service.resize_cluster("c")


def test_the_cli_resizes_slots_over_the_api(home: Home, cli: CLI) -> None:
    assert cli("cluster", "create", "local", "--nodes", "2", "--slots", "1")[0] == 0
    rc, out, err = cli("cluster", "resize", "local", "--slots", "2", "-o", "json")
    assert rc == 0, err
    assert '"slots": 2' in out.replace('":2', '": 2')
    rc, _, err = cli("cluster", "resize", "local")
    assert rc != 0 and "--slots" in err
