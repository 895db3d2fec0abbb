"""The service asks a cluster's backend, never tests which one it is: a backend the service does
not run is refused, a Ray cluster's jobs get Ray's rules, and a job's logs follow the backend
that ran it, by the tag on its stored handle once its cluster is gone. Backends are plug-ins: a
new one is a folder and a line in the registry, and nothing outside its folder names it.
In-process: a real SQLite file, the fake executor behind every backend (no Ray needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringtrain.jobs.errors import InvalidRequestError
from ringtrain.jobs.models import ClusterSpec, JobState, parse_job_spec
from ringtrain.jobs.service.executors.local.backend import LocalBackend
from ringtrain.jobs.service.executors.ray.backend import RayBackend
from ringtrain.jobs.service.executors.ray.connection import RayConnection
from ringtrain.jobs.service.executors.routing import Backends
from ringtrain.jobs.service.job_service import JobService
from ringtrain.jobs.service.share import Share
from ringtrain.jobs.service.store import SQLiteStore

from .conftest import FakeClock, FakeExecutor

pytestmark = pytest.mark.fast  # in-process: the tier of `scripts/test.sh --fast`

#: A Ray address where nothing answers: describing the cluster fails fast and is only logged.
NOWHERE = "127.0.0.1:1"


def _ray_service(store: SQLiteStore, share: Share, executor: FakeExecutor,
                 clock: FakeClock, tmp_path: Path) -> JobService:
    ray = RayBackend(executor, RayConnection(), tmp_path / "ray")
    return JobService(store, share, [LocalBackend(executor), ray], clock)


def test_a_backend_the_service_does_not_run_is_refused_before_anything_is_recorded(
        store: SQLiteStore, share: Share, fake_executor: FakeExecutor, clock: FakeClock) -> None:
    service = JobService(store, share, [LocalBackend(fake_executor)], clock)
    with pytest.raises(InvalidRequestError,
                       match=r"this service runs no ray backend \(it runs local\)"):
        service.create_cluster(ClusterSpec(name="r", nodes=1, backend="ray", address=NOWHERE))
    assert store.list_clusters() == []
    # A Ray cluster recorded by a service that ran Ray: its jobs are refused at submit.
    store.add_cluster(ClusterSpec(name="r", nodes=1, backend="ray", address=NOWHERE), clock())
    with pytest.raises(InvalidRequestError, match="this service runs no ray backend"):
        service.submit("r", parse_job_spec({"node_count": 1, "command": "true"}))
    assert store.list_jobs() == []
    assert service.get_cluster("r").machines == []  # the record stands, undescribed


def test_two_backends_of_one_kind_are_refused(fake_executor: FakeExecutor) -> None:
    with pytest.raises(ValueError, match="two local backends"):
        Backends([LocalBackend(fake_executor), LocalBackend(fake_executor)],
                 lambda name: "local")


def test_a_ray_cluster_keeps_its_machines_and_runs_elastic_jobs_too(
        store: SQLiteStore, share: Share, fake_executor: FakeExecutor, clock: FakeClock,
        tmp_path: Path) -> None:
    service = _ray_service(store, share, fake_executor, clock, tmp_path)
    store.add_cluster(ClusterSpec(name="r", nodes=2, backend="ray", address=NOWHERE), clock())
    service.create_cluster(ClusterSpec(name="l", nodes=2))
    with pytest.raises(InvalidRequestError, match="cluster r is a Ray cluster: its machines are "
                                                  "Ray's to add or remove"):
        service.resize_cluster("r", nodes=3)
    assert service.resize_cluster("r", slots=2).slots == 2  # the CPUs a job may use: ours
    assert service.resize_cluster("l", nodes=3).target_nodes == 3
    elastic = parse_job_spec({"node_count": 2, "min_nodes": 1, "command": "true"})
    # Every node runs `ringtrain run` in its per-node mode: what a local cluster runs, Ray does.
    for cluster in ("r", "l"):
        assert service.submit(cluster, elastic).state in (JobState.STAGING, JobState.QUEUED)


def test_a_jobs_handle_keeps_its_backend_after_its_cluster_is_gone(
        store: SQLiteStore, share: Share, fake_executor: FakeExecutor, clock: FakeClock,
        tmp_path: Path) -> None:
    service = _ray_service(store, share, fake_executor, clock, tmp_path)
    store.add_cluster(ClusterSpec(name="r", nodes=1, backend="ray", address=NOWHERE), clock())
    service.create_cluster(ClusterSpec(name="l", nodes=1))
    spec = parse_job_spec({"node_count": 1, "command": "true"})
    on_ray, on_local = service.submit("r", spec), service.submit("l", spec)
    # Every backend's nodes write the interleaved copy of a rank's streams.
    for job in (on_ray, on_local):
        assert service.files.log_path(job.id, 0, "output") == "stdouterr/rank.0/output"
    assert service.files.log_path(on_ray.id, 0, "prep.stderr") == "prep/node.0.stderr"
    service.tick()  # both start; their handles are stored with their backend's tag
    assert store.get_launch(on_ray.id)["backend"] == "ray"
    assert store.get_launch(on_local.id)["backend"] == "local"
    for job in (on_ray, on_local):
        fake_executor.exit(job.id, 0)
    service.tick()
    assert store.get_job(on_ray.id).state == JobState.SUCCEEDED
    service.delete_cluster("r")
    service.tick()
    assert [c.name for c in store.list_clusters()] == ["l"]
    # A job that ran before nodes wrote the interleaved copy: its stdout stands in.
    stdout = share.job_dir(on_ray.id) / "stdouterr" / "rank.0" / "stdout"
    stdout.parent.mkdir(parents=True, exist_ok=True)
    stdout.write_text("trained\n")
    assert service.files.log_path(on_ray.id, 0, "output") == "stdouterr/rank.0/stdout"
    assert service.files.log_path(on_local.id, 0, "output") == "stdouterr/rank.0/output"


_FAKE_PLUGIN = '''
"""A backend that is not ringtrain's: a Slurm-like cluster, in a folder of its own."""
from ringtrain.jobs.models import MachineInfo
from ringtrain.jobs.service.executors.local.backend import LocalBackend

EXECUTOR = None  # the test's fake executor


class SlurmBackend(LocalBackend):
    name = "slurm"

    def __init__(self, executor, partition):
        super().__init__(executor)
        self.partition = partition

    def attach(self, spec):
        return spec.model_copy(update={"nodes": spec.nodes or 2})

    def describe(self, info):
        return info.model_copy(update={"machines": [
            MachineInfo(id=f"{self.partition}-{k}", address=f"{self.partition}-{k}:6818",
                        alive=True, cpus=4, cpus_free=4) for k in range(info.current_nodes)]})

    def resize_problem(self, info):
        return "the partition's machines are Slurm's"

    def machine_usage(self, info):
        return {}


class SlurmPlugin:
    name = "slurm"
    summary = "a cluster is a Slurm partition"

    def add_options(self, group):
        group.add_argument("--slurm-partition", default="batch")

    def create(self, context, options):
        return SlurmBackend(EXECUTOR, options.get("slurm_partition") or "batch")


PLUGIN = SlurmPlugin()
'''


def test_a_new_backend_is_a_folder_of_its_own_and_a_line_in_the_registry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: SQLiteStore, share: Share,
        fake_executor: FakeExecutor, clock: FakeClock) -> None:
    """docs/architecture.md's walk-through, kept true: a backend ringtrain does not have (a fake
    Slurm, in a package outside ringtrain) brings its own `ringtrain server` flag through the
    registry, and the service attaches and describes its clusters, refuses their resize in its
    words, runs their jobs and tags their handles with its name; the cluster's text shows its
    machines. Nothing outside its folder changed but the list of plug-in modules."""
    import argparse
    import importlib

    from ringtrain.jobs.cli.output import cluster_text
    from ringtrain.jobs.service.executors import registry

    (tmp_path / "fakeslurm").mkdir()
    (tmp_path / "fakeslurm" / "__init__.py").write_text("")
    (tmp_path / "fakeslurm" / "backend.py").write_text(_FAKE_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("fakeslurm.backend").EXECUTOR = fake_executor
    modules = (*registry.PLUGIN_MODULES, "fakeslurm.backend")

    parser = argparse.ArgumentParser()
    registry.add_server_options(parser, modules)
    assert "the slurm backend: a cluster is a Slurm partition" in parser.format_help()
    options = vars(parser.parse_args(["--slurm-partition", "gpu"]))
    backends = registry.create_backends(
        lambda name: registry.BackendContext(share, tmp_path / name, lambda cluster: ""),
        options, modules)
    assert [b.name for b in backends] == ["local", "ray", "slurm"]
    service = JobService(store, share, backends, clock)

    info = service.create_cluster(ClusterSpec(name="s", nodes=0, backend="slurm",
                                              address="login1:6817"))
    assert info.target_nodes == 2 and [m.id for m in info.machines] == ["gpu-0", "gpu-1"]
    assert "gpu-1:6818" in cluster_text(info)
    with pytest.raises(InvalidRequestError, match="the partition's machines are Slurm's"):
        service.resize_cluster("s", nodes=3)
    job = service.submit("s", parse_job_spec({"node_count": 2, "command": "true"}))
    service.tick()
    assert store.get_launch(job.id)["backend"] == "slurm"
    fake_executor.exit(job.id, 0)
    service.tick()
    assert store.get_job(job.id).state == JobState.SUCCEEDED


def test_no_code_outside_a_backends_folder_names_the_backend() -> None:
    """The service, the API, the page and the command line reach a backend through the registry
    and the ClusterBackend protocol: no identifier, key or comparison outside
    `service/executors/<name>/` names a backend other than the default (`local`)."""
    import ast
    import re

    import ringtrain.jobs
    from ringtrain.jobs.service.executors.registry import plugins

    jobs = Path(ringtrain.jobs.__file__).parent
    names = {p.name for p in plugins()} - {"local"}
    assert names  # the registry has a backend besides the default
    broken = []
    for name in sorted(names):
        own = jobs / "service" / "executors" / name
        word = re.compile(rf"(^|_){name}($|_)|^{name.capitalize()}[A-Z]|[a-z]{name.capitalize()}"
                          rf"([A-Z]|$)")
        for path in sorted(jobs.rglob("*.py")):
            if own in path.parents:
                continue
            tree = ast.parse(path.read_text())
            docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)
                          and isinstance(n.value, ast.Constant)}
            for node in ast.walk(tree):
                words = [getattr(node, a) for a in ("id", "attr", "name", "arg")
                         if isinstance(getattr(node, a, None), str)]
                if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                        and id(node) not in docstrings and re.match(rf"{name}($|[._])",
                                                                    node.value):
                    words.append(node.value)
                broken += [f"{path.relative_to(jobs)}:{getattr(node, 'lineno', 0)}: {w}"
                           for w in words if word.search(w) or w == name]
        for path in sorted((jobs / "service" / "api" / "static").glob("*.js")):
            for k, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("//", 1)[0]
                if re.search(rf"[\"'`]{name}[\"'`]|\.{name}\b|\b{name}_", code):
                    broken.append(f"{path.relative_to(jobs)}:{k}: {code.strip()[:80]}")
    assert not broken, "backends named outside their folder:\n" + "\n".join(broken)
