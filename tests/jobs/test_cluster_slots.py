"""Slots: jobs share a node up to its slots (a real server runs a 1-process job beside one
holding every node); `ringtrain cluster resize --slots` changes them for the jobs that start
later, and a job waiting for more slots than asked for keeps the change from happening."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ringtrain.jobs.errors import InvalidRequestError, SpecError
from ringtrain.jobs.home import Home
from ringtrain.jobs.models import ClusterSpec, parse_job_spec
from ringtrain.jobs.service.executors.local.backend import LocalBackend
from ringtrain.jobs.service.job_service import JobService

from .conftest import CLI, wait_for


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


def test_a_small_job_runs_beside_a_job_holding_every_node(home: Home, cli: CLI,
                                                          tmp_path: Path) -> None:
    # The README's cluster and main job: 2 nodes x 2 slots, a 2-node job of 1 process each.
    # A 1-process job uses a free slot beside it instead of waiting for it to end.
    release = tmp_path / "release"
    assert cli("cluster", "create", "c", "--nodes", "2", "--slots", "2")[0] == 0
    long_spec, short_spec = tmp_path / "long.yaml", tmp_path / "short.yaml"
    long_spec.write_text(yaml.safe_dump({
        "name": "long", "node_count": 2,
        "command": f"python -c \"import os, time\nwhile not os.path.exists('{release}'): "
                   "time.sleep(0.1)\""}))
    short_spec.write_text(yaml.safe_dump({"name": "short", "node_count": 1,
                                          "command": "echo beside"}))
    rc, out, err = cli("job", "submit", str(long_spec), "--cluster", "c")
    assert rc == 0, err
    long_id = out.strip()
    try:
        rc, out, err = cli("job", "submit", str(short_spec), "--cluster", "c", "--follow")
        assert rc == 0, err
        assert "beside" in out
        rc, out, _ = cli("job", "show", long_id, "-o", "json")
        assert json.loads(out)["state"] in ("preparing", "running")
    finally:
        release.write_text("")
    assert wait_for(lambda: json.loads(cli("job", "show", long_id, "-o", "json")[1])["state"]
                    == "succeeded", timeout_s=60)
