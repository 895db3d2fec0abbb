"""The ray backend on a real two-node Ray cluster on this machine: gang placement across both
nodes, a two-node training job, terminate, a service restart, a placement timeout, a node that
does not see the share, a node that works in a private copy (its inputs, and its outputs when
another node fails), GPUs per process on a raylet that declares GPUs, the README's job on both
backends, a lost node (failed and retried).

Ray binds the machine's network address unless told otherwise, and here servers may use loopback
only, so every Ray test runs inside a network namespace that has only ``lo``:
``test_ray_scenarios_in_a_loopback_namespace`` re-runs this module under ``unshare -n`` (as root)
with ``RINGTRAIN_TEST_NETNS=1``, where the scenario tests run; outside it they skip. The Ray cluster
(``ray.cluster_utils.Cluster``: a head and one worker node, two CPUs each, node address
127.0.0.1) is shared by the module; the service is the real one (SQLite store, share, routing
executor) ticked by the test, without HTTP.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from ringtrain.jobs.errors import InvalidRequestError, RecordError, SpecError
from ringtrain.jobs.models import (
    ClusterSpec,
    JobInfo,
    JobState,
    load_job_spec,
    parse_job_spec,
)
from ringtrain.jobs.service.executors.local.backend import LocalBackend
from ringtrain.jobs.service.executors.local.executor import LocalExecutor
from ringtrain.jobs.service.executors.phase import Phase
from ringtrain.jobs.service.executors.ray.attempt import RayHandle
from ringtrain.jobs.service.executors.ray.backend import RayBackend
from ringtrain.jobs.service.executors.ray.connection import RayConnection
from ringtrain.jobs.service.executors.ray.executor import RayExecutor
from ringtrain.jobs.service.executors.routing import Backends, TaggedHandle
from ringtrain.jobs.service.job_service import JobService
from ringtrain.jobs.service.share import Share
from ringtrain.jobs.service.store import SQLiteStore

from .conftest import end_unfinished_jobs, pids_running, returns_within, wait_for

IN_NAMESPACE = os.environ.get("RINGTRAIN_TEST_NETNS") == "1"
ROOT = Path(__file__).resolve().parents[2]
inside = pytest.mark.skipif(not IN_NAMESPACE, reason=(
    "runs inside a loopback-only network namespace, started by "
    "test_ray_scenarios_in_a_loopback_namespace"))

# Every rank joins the world, sums its rank + 1 over all ranks and says where it ran.
ALLREDUCE = ("python -c \"import torch, ringtrain.torch as hvd; hvd.init(); "
             "s = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum); "
             "print('sum', int(s.item()), 'rank', hvd.rank(), 'of', hvd.size(), flush=True); "
             "import time; time.sleep(2)\"")


def _namespace_problem() -> str | None:
    """Why this host cannot run a loopback-only network namespace, or ``None``."""
    if os.geteuid() != 0:
        return "needs root for `unshare -n`"
    if not shutil.which("unshare") or not shutil.which("ip"):
        return "needs `unshare` and `ip` (util-linux, iproute2)"
    probe = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"network namespaces are not available here: {probe.stderr.strip()}"
    return None


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("tier", ["not quality",
                                  pytest.param("quality", marks=pytest.mark.quality)])
def test_ray_scenarios_in_a_loopback_namespace(tier: str) -> None:
    """Every scenario below of the suite's tier (or of the quality tier), in one pytest run
    inside the namespace: one Ray cluster for all (starting a second cost half a minute of the
    suite)."""
    if IN_NAMESPACE:
        pytest.skip("this is the namespace already")
    pytest.importorskip("ray", reason="the ray extra is not installed")
    problem = _namespace_problem()
    if problem:
        pytest.skip(problem)
    env = {**os.environ, "RINGTRAIN_TEST_NETNS": "1", "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    pytest_argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   "-k", "not in_a_loopback_namespace", "-m", tier, str(Path(__file__))]
    proc = subprocess.run(["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
                           *pytest_argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=560)
    report = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"the Ray scenarios failed inside the namespace:\n{report}"
    assert " passed" in proc.stdout and " skipped" not in proc.stdout, report


def test_each_backend_checks_the_address_of_its_clusters(tmp_path: Path) -> None:
    share = Share(tmp_path)
    ray = RayBackend(RayExecutor(share, RayConnection(), lambda name: ""), RayConnection(),
                     tmp_path / "ray")
    local = LocalBackend(LocalExecutor(share, use_cgroups=False))
    with pytest.raises(SpecError, match="cluster") as refused:
        ray.attach(ClusterSpec(name="r", nodes=0, backend="ray"))
    assert refused.value.errors == [{"field": "address", "message": "a ray cluster needs an "
                                                                   "address: HOST:PORT, or local"}]
    with pytest.raises(SpecError) as refused:
        ray.attach(ClusterSpec(name="r", nodes=0, backend="ray", address="host"))
    assert "HOST:PORT" in refused.value.errors[0]["message"]
    with pytest.raises(SpecError) as refused:
        local.attach(ClusterSpec(name="l", nodes=1, address="10.0.0.5:6379"))
    assert refused.value.errors[0]["message"].startswith("a local cluster has no address")
    assert local.attach(ClusterSpec(name="l", nodes=1)).address is None
    # Whatever the backend, no address carries spaces, commands or credentials.
    with pytest.raises(ValidationError, match="address"):
        ClusterSpec(name="r", nodes=0, backend="ray", address="host:1; rm -rf /")
    with pytest.raises(ValidationError, match="address"):
        ClusterSpec(name="r", nodes=0, backend="ray", address="user:secret@host:1")


def test_an_address_where_nothing_answers_is_refused_at_once() -> None:
    with pytest.raises(InvalidRequestError, match="nothing answers at the Ray address 127.0.0.1:1"):
        returns_within(30, RayConnection().connect, "127.0.0.1:1")  # not Ray's minute of retries


def test_stored_handles_go_back_to_their_backend_by_their_tag(tmp_path: Path) -> None:
    share = Share(tmp_path)
    local = LocalBackend(LocalExecutor(share, use_cgroups=False))
    ray_executor = RayExecutor(share, RayConnection(), lambda name: "127.0.0.1:1")
    ray = RayBackend(ray_executor, RayConnection(), tmp_path / "ray")
    routing = Backends([local, ray], lambda name: "ray")
    handle = RayHandle("127.0.0.1:1", "job-1.0", 2, 0, 5.0)
    stored = TaggedHandle("ray", handle).to_json()
    assert stored == {**handle.to_json(), "backend": "ray"}
    assert routing.load_handle(stored) == TaggedHandle("ray", handle)
    runner = routing.load_handle({"pid": 7, "start_ticks": None, "attempt": 0,
                                  "backend": "local"})
    assert runner.backend == "local" and runner.handle.pid == 7
    # The tag decides, not the fields: a Ray handle's fields under a local tag are refused.
    with pytest.raises(RecordError, match="pid"):
        routing.load_handle({**handle.to_json(), "backend": "local"})
    with pytest.raises(RecordError, match="malformed"):
        routing.load_handle({"placement_group": "job-1.0", "backend": "ray"})
    with pytest.raises(RecordError, match="names no backend"):
        routing.load_handle(handle.to_json())
    with pytest.raises(RecordError, match="'slurm' backend, which this service does not run"):
        routing.load_handle({**handle.to_json(), "backend": "slurm"})
    local_only = Backends([local], lambda name: "local")
    with pytest.raises(RecordError, match="'ray' backend, which this service does not run"):
        local_only.load_handle(stored)


def test_a_drained_attempt_names_the_files_that_did_not_reach_the_share(tmp_path: Path) -> None:
    from ringtrain.jobs.service.executors.ray.attempt import AttemptStage, Failure, RayAttempt
    from ringtrain.jobs.service.executors.ray.node import NodeStatus
    from ringtrain.jobs.service.executors.ray.watch import DRAIN_S

    # The executor's side of a node without the share, without Ray: what a node's answers carry
    # is written into the share, and a drain that ends before a file arrived in full says so.
    now = [100.0]
    executor = RayExecutor(Share(tmp_path), RayConnection(), lambda name: "127.0.0.1:1",
                           clock=lambda: now[0])
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    job = JobInfo(id="j1", cluster="r", spec=parse_job_spec({"node_count": 2, "command": "x"}),
                  state="running", created_at=0.0, running_at=1.0, job_dir=str(job_dir))
    launch = RayHandle("127.0.0.1:1", "j1.0", 2, 0, 0.0)
    partial = NodeStatus(Phase.EXITED, 137, chunks=(("outputs/model/big.1", 0, b"x" * 10),),
                         pending=("outputs/model/big.1",))
    attempt = RayAttempt({0: "a", 1: "b"}, AttemptStage.RUNNING)
    assert executor.watch.take(job, launch, attempt, 1, partial) is None
    assert (job_dir / "outputs" / "model" / "big.1").read_bytes() == b"x" * 10
    assert attempt.fail(Failure(Phase.EXITED, 5, "rank 0 exited with code 5", now[0]))
    assert attempt.stage is AttemptStage.DRAINING
    assert not attempt.fail(Failure(Phase.LOST, None, "later", now[0], frozenset({1})))
    assert attempt.gone == {1} and attempt.failure.message == "rank 0 exited with code 5"
    with pytest.raises(ValueError, match="cannot go from draining to running"):
        attempt.move(AttemptStage.RUNNING)
    assert executor.watch.draining(job, attempt).phase is Phase.RUNNING  # still waiting for it
    now[0] += DRAIN_S
    ended = executor.watch.draining(job, attempt)
    assert (ended.phase, ended.exit_code) == (Phase.EXITED, 5)
    assert ended.message == ("rank 0 exited with code 5; within 10 s these files did not reach "
                             "the share in full (node 1: outputs/model/big.1)")
    outside = NodeStatus(Phase.RUNNING, chunks=(("wd/train.py", 0, b"x"),))
    assert executor.watch.take(job, launch, attempt, 0, outside) == (
        f"cannot write what node 0 sent into the job's folder {job_dir}: a Ray node sent a "
        "chunk for 'wd/train.py', outside the job's stdouterr and prep and outputs")
    assert not (job_dir / "wd").exists()


class RayService:
    """A job service with the routing executor, attached to a Ray cluster, ticked by the test."""

    def __init__(self, root: Path, placement_timeout_s: float = 30.0):
        self.store = SQLiteStore(root / "jobs.sqlite")
        share = Share(root / "share")
        self.ray = RayConnection("127.0.0.1")
        self.executor = RayExecutor(share, self.ray,
                                    lambda name: self.store.get_cluster(name).address or "",
                                    placement_timeout_s=placement_timeout_s)
        self.service = JobService(self.store, share, [
            LocalBackend(LocalExecutor(share)),
            RayBackend(self.executor, self.ray, root / "ray")])

    def submit(self, cluster: str, command: str, **spec: object) -> JobInfo:
        return self.service.submit(cluster, parse_job_spec({"node_count": 2, "command": command,
                                                            **spec}))

    def tick_until(self, job_id: str, predicate, timeout_s: float = 60.0) -> JobInfo:
        def check():
            self.service.tick()
            job = self.store.get_job(job_id)
            return job if predicate(job) else None
        return wait_for(check, timeout_s=timeout_s, every_s=0.2)

    def run_to_end(self, job_id: str, timeout_s: float = 90.0) -> JobInfo:
        return self.tick_until(job_id, lambda j: j.state.is_terminal(), timeout_s)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[object]:
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 2, "node_ip_address": "127.0.0.1", "object_store_memory": 80 << 20}
    cluster = Cluster(initialize_head=True,
                      head_node_args={**node, "include_dashboard": False})
    cluster.add_node(**node)
    cluster.wait_for_nodes()
    yield cluster
    import ray
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture
def rays(ray_cluster, tmp_path: Path) -> Iterator[RayService]:
    s = RayService(tmp_path)
    s.service.create_cluster(ClusterSpec(name="r", nodes=0, slots=2, backend="ray",
                                         address=ray_cluster.address))
    yield s
    end_unfinished_jobs(s)


def _ranks_running(marker: str) -> list[int]:
    """The ranks whose command line carries ``marker``: the ``python`` each rank's ``sh -c``
    execs, not the ``ringtrain run`` or task wrapper whose arguments carry the command too."""
    ranks = []
    for pid in pids_running(marker):
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if argv0 == b"python":
            ranks.append(pid)
    return ranks


def _placement_groups(prefix: str) -> list[dict]:
    from ray.util import placement_group_table

    return [pg for pg in placement_group_table().values()
            if pg["name"].startswith(prefix) and pg["state"] != "REMOVED"]


@inside
def test_cluster_show_has_ray_node_table_and_resize_is_refused(rays: RayService) -> None:
    info = rays.service.get_cluster("r")
    assert info.backend == "ray" and info.target_nodes == 2  # every alive Ray machine
    assert [m.alive for m in info.machines] == [True, True]
    assert {m.cpus for m in info.machines} == {2.0}
    with pytest.raises(InvalidRequestError, match="Ray cluster"):
        rays.service.resize_cluster("r", 3)


@inside
def test_agents_sample_their_machines_for_the_dashboard(rays: RayService, ray_cluster) -> None:
    def both() -> dict | None:
        usage = rays.ray.node_usage(ray_cluster.address)
        return usage if len(usage) == 2 else None

    usage = wait_for(both)
    assert set(usage) == {m.id for m in rays.service.get_cluster("r").machines}
    for sample in usage.values():
        assert sample["cpus"] >= 1 and 0 < sample["memory_used"] <= sample["memory_total"]
        assert 0.0 <= sample["cpu_percent"] <= 100.0 and sample["gpus"] == []


@inside
def test_two_node_job_spreads_over_both_machines_and_trains(rays: RayService) -> None:
    job = rays.submit("r", ALLREDUCE, job_preparation="echo prepared node $RINGTRAIN_NODE_INDEX",
                      outputs=["model"])
    running = rays.tick_until(job.id, lambda j: j.state == JobState.RUNNING, timeout_s=30)
    (pg,) = _placement_groups(f"{job.id}.")
    assert pg["strategy"] == "STRICT_SPREAD"
    assert len(set(pg["bundles_to_node_id"].values())) == 2  # one bundle on each machine
    done = rays.run_to_end(job.id)
    assert done.state == JobState.SUCCEEDED, done.message
    job_dir = Path(running.job_dir)
    for rank in range(2):
        out = (job_dir / "stdouterr" / f"rank.{rank}" / "stdout").read_text()
        assert f"sum 3 rank {rank} of 2" in out
    for node in range(2):
        assert (job_dir / "prep" / f"node.{node}.stdout").read_text() == f"prepared node {node}\n"
    assert _placement_groups(f"{job.id}.") == []  # released with the attempt


@inside
def test_failing_rank_fails_the_job_with_its_code(rays: RayService) -> None:
    marker = f"ringtrain-ray-failing-{os.getpid()}"
    job = rays.submit("r", 'if [ "$RANK" = 1 ]; then echo boom >&2; exit 7; fi; '
                           f"exec python -c 'import time; time.sleep(30)' {marker}")
    done = rays.run_to_end(job.id)
    assert done.state == JobState.FAILED and done.exit_code == 7
    assert "rank 1 on node1" in done.message and "stdouterr/rank.1/stderr" in done.message
    assert pids_running(marker) == []


@inside
def test_failed_attempt_is_retried_under_a_new_placement_group(rays: RayService) -> None:
    # The first attempt fails once both ranks marked themselves: the first failure stops the
    # other rank at once, which must not be before it marked itself.
    both = "[ -e $RINGTRAIN_JOB_DIR/tried.0 ] && [ -e $RINGTRAIN_JOB_DIR/tried.1 ]"
    once = (f'f=$RINGTRAIN_JOB_DIR/tried.$RANK; [ -e $f ] && echo again || '
            f'{{ touch $f; until {both}; do sleep 0.1; done; exit 3; }}')
    job = rays.submit("r", once, max_retries=1)
    done = rays.run_to_end(job.id)
    assert done.state == JobState.SUCCEEDED and done.attempt == 1, done.message
    job_dir = Path(done.job_dir)
    assert (job_dir / "stdouterr" / "rank.1" / "stdout").read_text() == "again\n"
    assert (job_dir / "attempts" / "0" / "stdouterr" / "rank.0").is_dir()  # archived
    assert _placement_groups(f"{job.id}.") == []


@inside
def test_terminate_stops_every_rank_on_every_node(rays: RayService) -> None:
    marker = f"ringtrain-ray-terminate-{os.getpid()}"
    job = rays.submit("r", f"exec python -c 'import time; time.sleep(300)' {marker}",
                      process_count_per_node=2)
    rays.tick_until(job.id, lambda j: j.state == JobState.RUNNING)
    wait_for(lambda: len(_ranks_running(marker)) == 4, timeout_s=30)
    rays.service.terminate(job.id)
    done = rays.run_to_end(job.id, timeout_s=30)
    assert done.state == JobState.TERMINATED
    wait_for(lambda: pids_running(marker) == [], timeout_s=10)
    assert _placement_groups(f"{job.id}.") == []


@inside
def test_restarted_service_finds_the_running_job_again(rays: RayService, tmp_path: Path) -> None:
    import ray

    marker = f"ringtrain-ray-restart-{os.getpid()}"
    job = rays.submit("r", f"exec python -c 'import time; time.sleep(300)' {marker}")
    rays.tick_until(job.id, lambda j: j.state == JobState.RUNNING)
    ray.shutdown()  # the old service's driver goes; detached actors and the group stay
    rays.store.close()
    again = RayService(tmp_path)
    for _ in range(5):
        again.service.tick()
    assert again.store.get_job(job.id).state == JobState.RUNNING
    assert len(_placement_groups(f"{job.id}.")) == 1  # found, not started twice
    wait_for(lambda: len(_ranks_running(marker)) == 2, timeout_s=30)
    again.service.terminate(job.id)
    assert again.run_to_end(job.id).state == JobState.TERMINATED
    wait_for(lambda: pids_running(marker) == [], timeout_s=10)
    rays.store = again.store  # the fixture's clean-up reads this one


@inside
def test_placed_job_outlives_the_placement_timeout(ray_cluster, tmp_path: Path) -> None:
    s = RayService(tmp_path, placement_timeout_s=1.0)
    s.service.create_cluster(ClusterSpec(name="r", nodes=0, slots=2, backend="ray",
                                         address=ray_cluster.address))
    job = s.submit("r", "sleep 4")
    done = s.run_to_end(job.id, timeout_s=60)
    assert done.state == JobState.SUCCEEDED, done.message
    s.store.close()


@inside
def test_unplaceable_job_fails_after_the_placement_timeout(ray_cluster, tmp_path: Path) -> None:
    s = RayService(tmp_path, placement_timeout_s=2.0)
    s.service.create_cluster(ClusterSpec(name="big", nodes=0, slots=8, backend="ray",
                                         address=ray_cluster.address))
    job = s.submit("big", "true", process_count_per_node=3)  # 3 CPUs; the machines have 2
    done = s.run_to_end(job.id, timeout_s=30)
    assert done.state == JobState.FAILED
    assert "Ray could not place 2 nodes of 3 free CPUs each" in done.message
    assert _placement_groups(f"{job.id}.") == []
    s.store.close()


@inside
def test_terminating_an_unplaced_job_ends_it_at_once(ray_cluster, rays: RayService) -> None:
    rays.service.create_cluster(ClusterSpec(name="big", nodes=0, slots=8, backend="ray",
                                            address=ray_cluster.address))
    job = rays.submit("big", "true", process_count_per_node=3)
    rays.tick_until(job.id, lambda j: j.state == JobState.PREPARING)
    rays.service.terminate(job.id)
    done = rays.run_to_end(job.id, timeout_s=10)  # long before the 30 s placement timeout
    assert done.state == JobState.TERMINATED
    assert _placement_groups(f"{job.id}.") == []


@inside
def test_node_that_does_not_see_the_share_fails_the_job_saying_so(rays: RayService,
                                                                   tmp_path: Path) -> None:
    # The executor alone, on a job folder neither the nodes nor the service have: no copy.
    job = JobInfo(id="unseen-1a2b3c", cluster="r", state="preparing", created_at=time.time(),
                  spec=parse_job_spec({"node_count": 2, "command": "true"}),
                  job_dir=str(tmp_path / "absent"))
    handle = rays.executor.start(job, [])
    seen = wait_for(lambda: (o := rays.executor.poll(job, handle)).phase is Phase.EXITED and o,
                    timeout_s=60, every_s=0.2)
    rays.executor.release(job, handle)
    assert seen.exit_code == 127
    assert "does not see the job's folder" in seen.message and "127.0.0.1" in seen.message
    assert not (tmp_path / "absent").exists()  # nothing written where the share should be
    assert _placement_groups(f"{job.id}.") == []


@inside
def test_node_without_the_share_works_in_a_private_copy(ray_cluster, rays: RayService,
                                                        tmp_path: Path) -> None:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # A third machine that works in private copies (as one without the share would), and the
    # worker machine kept busy, so the job's two nodes are the service's machine and that one.
    scratch = tmp_path / "scratch"
    private = ray_cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1",
                                   object_store_memory=80 << 20,
                                   env_vars={"RINGTRAIN_RAY_SCRATCH": str(scratch)})
    (worker,) = [n for n in ray_cluster.worker_nodes if n is not private]
    blocker = ray.remote(num_cpus=2)(_Idle).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(worker.node_id, soft=False)).remote()
    try:
        ray.get(blocker.ready.remote(), timeout=60)
        working_dir = tmp_path / "project"
        working_dir.mkdir()
        (working_dir / "greeting.txt").write_text("hello")
        (working_dir / "big.bin").write_bytes(b"\1" * (9 << 20))  # over one 8 MiB message
        command = ('for i in 1 2 3 4; do echo tick $i rank $RANK; sleep 1; done; '
                   'cp greeting.txt "$RINGTRAIN_OUTPUT_MODEL/from.$RANK"; '
                   'cat big.bin big.bin > "$RINGTRAIN_OUTPUT_MODEL/big.$RANK"')
        job = rays.submit("r", command, outputs=["model"], working_dir=str(working_dir))
        running = rays.tick_until(job.id, lambda j: j.state == JobState.RUNNING)
        job_dir = Path(running.job_dir)
        logs = [job_dir / "stdouterr" / f"rank.{rank}" / "stdout" for rank in range(2)]
        # Both ranks' first lines reach the share while they run (the job takes 4 s).
        seen = rays.tick_until(job.id, lambda j: all(
            p.is_file() and "tick 1" in p.read_text() for p in logs), timeout_s=20)
        assert seen.state == JobState.RUNNING
        done = rays.run_to_end(job.id)
        assert done.state == JobState.SUCCEEDED, done.message
        for rank, log in enumerate(logs):
            assert log.read_text() == "".join(f"tick {i} rank {rank}\n" for i in range(1, 5))
            assert (job_dir / "outputs" / "model" / f"from.{rank}").read_text() == "hello"
            assert (job_dir / "outputs" / "model" / f"big.{rank}").read_bytes() == \
                b"\1" * (18 << 20)
        copies = scratch / "ringtrain-ray"
        assert copies.is_dir()  # one node did work in a private copy ...
        assert list(copies.iterdir()) == []  # ... removed with the attempt
        # The machine with the share fails; the private copy's rank still runs, is stopped,
        # and its output comes back all the same.
        marker = f"ringtrain-ray-drain-{os.getpid()}"
        failing = ('echo out > "$RINGTRAIN_OUTPUT_MODEL/late.$RANK"; '
                   'if [ -n "$RINGTRAIN_RAY_SCRATCH" ]; then '
                   f"exec python -c 'import time; time.sleep(300)' {marker}; "
                   "else sleep 2; exit 5; fi")
        job = rays.submit("r", failing, outputs=["model"], working_dir=str(working_dir))
        done = rays.run_to_end(job.id)
        assert done.state == JobState.FAILED and done.exit_code == 5, done.message
        outputs = Path(done.job_dir) / "outputs" / "model"
        assert sorted(p.name for p in outputs.iterdir()) == ["late.0", "late.1"]
        wait_for(lambda: pids_running(marker) == [], timeout_s=10)
        assert list(copies.iterdir()) == []
    finally:
        ray.kill(blocker)
        ray_cluster.remove_node(private)


@inside
def test_private_copy_gets_the_inputs_its_machine_does_not_see(tmp_path: Path,
                                                               monkeypatch) -> None:
    from ringtrain.jobs.envvars import input_var
    from ringtrain.jobs.service.executors.node_launch import free_port
    from ringtrain.jobs.service.executors.ray import transfer
    from ringtrain.jobs.service.executors.ray.node import SCRATCH_VAR, NodePlan, NodeRunner

    # One node runner, as an agent runs it, on a "machine" where /absent/labels.csv is not:
    # the service's copy of that input comes in the private copy; one it sees is read in place.
    monkeypatch.setenv(SCRATCH_VAR, str(tmp_path / "scratch"))
    job_dir = tmp_path / "share" / "job-1"
    (job_dir / "wd").mkdir(parents=True)
    (job_dir / "wd" / "big.bin").write_bytes(os.urandom(100_000))
    (tmp_path / "labels.csv").write_text("a,b\n")
    seen = tmp_path / "seen"
    seen.mkdir()
    inputs = {"labels": "/absent/labels.csv", "seen": str(seen)}
    plan = NodePlan(job_dir=str(job_dir), node=0, node_count=1, process_count_per_node=1,
                    command='cat "$RINGTRAIN_INPUT_LABELS"; echo "$RINGTRAIN_INPUT_SEEN"; '
                            'wc -c < big.bin',
                    job_preparation=None, inputs=inputs, placement_group="job-1.0",
                    environ={input_var(name): path for name, path in inputs.items()})
    copy = transfer.private_copy(job_dir, {"labels": str(tmp_path / "labels.csv")},
                                 piece_bytes=16 << 10)
    assert isinstance(copy, transfer.PrivateCopy)
    assert wait_for(lambda: copy.size, timeout_s=10) > 100_000
    runner = NodeRunner(plan, lambda: ("127.0.0.1", free_port("127.0.0.1")))
    runner.run()
    try:
        asked = wait_for(lambda: (s := runner.status()).needs_workdir and s, timeout_s=10)
        assert asked.missing_inputs == ("labels",)
        # Sent in several pieces, each from what the node says it holds.
        pieces = 0
        while (status := runner.status()).needs_workdir:
            runner.receive_workdir(copy.piece(status.workdir_received))
            pieces += 1
            assert pieces < 100
        assert pieces >= 7
        done = wait_for(lambda: (s := runner.status()).phase is Phase.EXITED and s,
                        timeout_s=20)
        assert done.exit_code == 0, done.message
        logs = {rel: data for rel, _, data in done.chunks}
        assert logs["stdouterr/rank.0/stdout"] == f"a,b\n{seen}\n100000\n".encode()
    finally:
        copy.close()
        runner.discard()
    assert list((tmp_path / "scratch" / "ringtrain-ray").iterdir()) == []


@inside
def test_gpus_per_process_are_reserved_and_reach_the_ranks(ray_cluster, rays: RayService,
                                                           tmp_path: Path) -> None:
    # A raylet declaring two GPUs (none exist here): Ray places and assigns them all the same.
    gpu_node = ray_cluster.add_node(num_cpus=2, num_gpus=2, node_ip_address="127.0.0.1",
                                    object_store_memory=80 << 20)
    try:
        job = rays.submit("r", 'echo "gpus $CUDA_VISIBLE_DEVICES"', node_count=1,
                          process_count_per_node=2, gpus_per_process=1)
        done = rays.run_to_end(job.id)
        assert done.state == JobState.SUCCEEDED, done.message
        for rank in range(2):
            out = (Path(done.job_dir) / "stdouterr" / f"rank.{rank}" / "stdout").read_text()
            assert sorted(out.split()[1].split(",")) == ["0", "1"], out
        (tmp_path / "short").mkdir()
        short = RayService(tmp_path / "short", placement_timeout_s=2.0)
        short.service.create_cluster(ClusterSpec(name="g", nodes=0, slots=2, backend="ray",
                                                 address=ray_cluster.address))
        greedy = short.submit("g", "true", node_count=1, process_count_per_node=2,
                              gpus_per_process=2)
        failed = short.run_to_end(greedy.id, timeout_s=30)
        assert failed.state == JobState.FAILED
        assert "could not place 1 nodes of 2 free CPUs and 4 free GPUs each" in failed.message
        assert "2 CPUs/2 GPUs" in failed.message, failed.message
        short.store.close()
    finally:
        ray_cluster.remove_node(gpu_node)


class _Idle:
    """An actor that holds its CPUs."""

    def ready(self) -> bool:
        return True


@inside
def test_cli_attaches_a_ray_cluster_and_runs_a_job(ray_cluster, home, cli, tmp_path: Path
                                                   ) -> None:
    rc, out, err = cli("cluster", "create", "r", "--backend", "ray", "--address",
                       ray_cluster.address, "--slots", "2")
    assert rc == 0, err
    assert "machines:" in out and out.count(" alive ") == 2
    spec = tmp_path / "job.yaml"
    spec.write_text("node_count: 2\njob_preparation: echo preparing; echo prep-warning >&2\n"
                    "command: echo rank $RANK of $WORLD_SIZE; sleep 0.3; echo progress $RANK >&2; "
                    "sleep 0.3; echo done $RANK\n")
    rc, out, err = cli("job", "submit", str(spec), "--cluster", "r", "--follow")
    assert rc == 0, err
    # As on a local cluster: the preparation step, then rank 0's stdout and stderr as written
    # (two pipes: lines written apart in time keep their order).
    shown = [x for x in out.splitlines() if x.split(" ")[0] in
             ("preparing", "prep-warning", "rank", "progress", "done")]
    assert shown == ["preparing", "prep-warning", "rank 0 of 2", "progress 0", "done 0"], out
    rc, out, err = cli("cluster", "resize", "r", "--nodes", "3")
    assert rc != 0 and "is a Ray cluster" in err


@inside
@pytest.mark.quality  # 4 ranks of training and a job service: the suite's two-node job trains
def test_readme_job_reaches_the_same_accuracy_on_ray_as_on_local(rays: RayService) -> None:
    """The README's main job, cut short, on a local and a Ray cluster: the same numbers.
    (benchmarks/jobs_ray_parity.py runs it whole.)"""
    rays.service.create_cluster(ClusterSpec(name="l", nodes=2, slots=1))
    spec = load_job_spec(ROOT / "examples" / "fashion_mnist_job.yaml")
    quick = spec.model_copy(update={
        "command": f"{spec.command} --epochs 2 --limit-train 512 --limit-test 256 --batch-size 32",
        "working_dir": str(ROOT)})  # the spec's `.`, as `job submit` run from the checkout
    summary = {}
    for cluster in ("l", "r"):
        job = rays.service.submit(cluster, quick)
        done = rays.run_to_end(job.id, timeout_s=240)
        assert done.state == JobState.SUCCEEDED, done.message
        out = (Path(done.job_dir) / "stdouterr" / "rank.0" / "stdout").read_text()
        summary[cluster] = json.loads(out.strip().splitlines()[-1])
        assert (Path(done.job_dir) / "outputs" / "model" / "model.pt").is_file()
    assert summary["r"]["world_size"] == summary["l"]["world_size"] == 2
    assert summary["r"]["test_accuracy"] == pytest.approx(summary["l"]["test_accuracy"],
                                                          abs=0.02), summary


# Last of the module: it kills the shared Ray cluster's worker node (and starts another).
@inside
@pytest.mark.slow
def test_lost_node_fails_or_retries_the_jobs_naming_it(ray_cluster, tmp_path: Path) -> None:
    s = RayService(tmp_path, placement_timeout_s=90.0)
    # Four job nodes: both jobs hold both machines (one CPU of each) at once.
    s.service.create_cluster(ClusterSpec(name="r", nodes=4, slots=1, backend="ray",
                                         address=ray_cluster.address))
    marker = f"ringtrain-ray-lost-{os.getpid()}"
    sleep = f"exec python -c 'import time; time.sleep(300)' {marker}"
    once = f'f=$RINGTRAIN_JOB_DIR/tried.$RANK; [ -e $f ] && echo again || {{ touch $f; {sleep}; }}'
    doomed = s.submit("r", sleep)
    retried = s.submit("r", once, max_retries=1)
    for job in (doomed, retried):
        s.tick_until(job.id, lambda j: j.state == JobState.RUNNING)
    wait_for(lambda: len(_ranks_running(marker)) == 4, timeout_s=30)
    (worker,) = ray_cluster.worker_nodes
    ray_cluster.remove_node(worker, allow_graceful=False)  # SIGKILL its raylet
    # A lost machine is noticed within 30 s: the bound of each wait.
    failed = s.run_to_end(doomed.id, timeout_s=30)
    requeued = s.tick_until(retried.id, lambda j: j.attempt == 1, timeout_s=30)
    for job in (failed, requeued):
        assert "was lost: Ray node" in job.message and "127.0.0.1" in job.message, job.message
    assert failed.state == JobState.FAILED and failed.attempt == 0
    assert "re-queued, retry 1 of 1" in requeued.message
    wait_for(lambda: pids_running(marker) == [], timeout_s=10)  # on both machines
    assert _placement_groups(f"{doomed.id}.") == _placement_groups(f"{retried.id}.0") == []
    # The retry waits for two machines; a new one joins and it runs there.
    ray_cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1", object_store_memory=80 << 20)
    done = s.run_to_end(retried.id, timeout_s=90)
    assert done.state == JobState.SUCCEEDED and done.attempt == 1, done.message
    job_dir = Path(done.job_dir)
    assert (job_dir / "stdouterr" / "rank.1" / "stdout").read_text() == "again\n"
    assert (job_dir / "attempts" / "0" / "stdouterr" / "rank.1").is_dir()
    # The store: no attempt left running, every job node free, no placement group left.
    assert [j.state for j in s.store.list_jobs(cluster="r")] == [JobState.FAILED,
                                                                  JobState.SUCCEEDED]
    assert [(n.state.value, n.jobs) for n in s.store.list_nodes("r")] == [("idle", [])] * 4
    assert _placement_groups(f"{retried.id}.") == []
    s.store.close()


# After the lost-node test (in the suite's run): it kills a worker machine of the shared Ray
# cluster too. The quality tier's: 36 s of the suite's CPU-bound 20 minutes; the suite keeps a
# lost Ray node failing or retrying its jobs, and an elastic job going on without a lost node on
# the local backend (test_elastic_jobs.py).
@inside
@pytest.mark.slow
@pytest.mark.quality
def test_elastic_job_goes_on_without_a_lost_node(ray_cluster, tmp_path: Path) -> None:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    script = ROOT / "tests" / "integration" / "elastic_train.py"
    # The head's CPUs are held, so both nodes of the job land on worker machines, one of which
    # can be killed: the one of node 1 (node 0 drives the job).
    ray_cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1", object_store_memory=80 << 20)
    ray_cluster.wait_for_nodes()
    ray.init(address=ray_cluster.address, ignore_reinit_error=True)
    head = ray_cluster.head_node.node_id
    holder = ray.remote(num_cpus=2)(_Holder).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)).remote()
    ray.get(holder.ready.remote(), timeout=60)
    s = RayService(tmp_path, placement_timeout_s=90.0)
    s.service.create_cluster(ClusterSpec(name="r", nodes=2, slots=2, backend="ray",
                                         address=ray_cluster.address))
    # Two ranks a node: worker 2 (node 1's first) pauses in batch 6 of the first world, its
    # peers waiting for it in that batch's allreduce, and its machine is killed there.
    job = s.submit("r", "RINGTRAIN_TEST_PAUSE=2:0:6 RINGTRAIN_TEST_PAUSE_SIZE=4 "
                        f"OMP_NUM_THREADS=1 exec python {script}",
                   process_count_per_node=2, min_nodes=1, max_nodes=2)
    running = s.tick_until(job.id, lambda j: j.state == JobState.RUNNING)
    job_dir = Path(running.job_dir)
    events = job_dir / "stdouterr" / "rank.2" / "stdout"
    try:
        s.tick_until(job.id, lambda j: events.exists() and '"pause"' in events.read_text(),
                     timeout_s=120)
    except BaseException:
        logs = sorted((job_dir / "launcher").glob("*")) + sorted(job_dir.glob("stdouterr/*/*"))
        raise AssertionError(f"{s.store.get_job(job.id)}\n" + "\n".join(
            f"== {p}\n{p.read_text()[-3000:]}" for p in logs if p.is_file())) from None
    (pg,) = _placement_groups(f"{job.id}.")
    doomed = pg["bundles_to_node_id"][1]
    (victim,) = [n for n in ray_cluster.worker_nodes if n.node_id == doomed]
    ray_cluster.remove_node(victim, allow_graceful=False)  # SIGKILL its raylet
    done = s.run_to_end(job.id, timeout_s=180)
    assert done.state == JobState.SUCCEEDED, done.message + "".join(
        f"\n== {p}\n{p.read_text()[-4000:]}" for p in sorted(job_dir.glob("stdouterr/*/stderr"))
        + sorted(job_dir.glob("launcher/node.0.log")))
    lost = running.nodes[1]
    assert f"lost node {lost}" in done.message and "stopped answering" in done.message, \
        done.message
    assert done.nodes == [running.nodes[0]]
    survivor = [json.loads(line) for line in
                (job_dir / "stdouterr" / "rank.0" / "stdout").read_text().splitlines()
                if line.startswith("{")]
    assert any(e["event"] == "batch" and e["size"] == 2 for e in survivor)
    assert [e["epoch"] for e in survivor if e["event"] == "epoch"] == [0, 1, 2, 3]
    ray.kill(holder)
    s.store.close()


class _Holder:
    """An actor that only holds CPUs."""

    def ready(self) -> bool:
        return True
