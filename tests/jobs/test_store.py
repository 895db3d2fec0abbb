"""The SQLite store on a real database file: records, node allocation, enforced transitions."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from ringtrain.jobs.errors import ConflictError, InvalidTransitionError, NotFoundError
from ringtrain.jobs.models import ClusterSpec, JobInfo, JobState, NodeState, parse_job_spec
from ringtrain.jobs.service.store import SQLiteStore

pytestmark = pytest.mark.fast  # in-process: the tier of `scripts/test.sh --fast`


def test_wal_mode_and_schema(store: SQLiteStore) -> None:
    with sqlite3.connect(store.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"clusters", "nodes", "jobs"} <= tables


def test_clusters(store: SQLiteStore, cluster: Callable[..., str]) -> None:
    cluster("a", nodes=3, slots=2)
    info = store.get_cluster("a")
    assert (info.current_nodes, info.slots, info.node_counts.idle) == (3, 2, 3)
    assert info.allocation_state.value == "steady"
    with pytest.raises(ConflictError, match="already exists"):
        cluster("a")
    assert [c.name for c in store.list_clusters()] == ["a"]
    for call in (lambda: store.get_cluster("zz"), lambda: store.resize_cluster("zz", 1),
                 lambda: store.list_nodes("zz"), lambda: store.mark_cluster_deleting("zz")):
        with pytest.raises(NotFoundError, match="no cluster named 'zz'"):
            call()


def test_unknown_job(store: SQLiteStore) -> None:
    for call in (lambda: store.get_job("nope"), lambda: store.remove_job("nope"),
                 lambda: store.update_job("nope", JobState.FAILED, 0.0),
                 lambda: store.set_launch("nope", {})):
        with pytest.raises(NotFoundError, match="no job with id 'nope'"):
            call()


def test_transitions_claim_and_release_nodes(store: SQLiteStore, cluster, add_job) -> None:
    cluster("c", nodes=3)
    job = add_job("c", node_count=2)
    job = store.update_job(job.id, JobState.PREPARING, 10.0, nodes=[0, 2])
    assert job.nodes == [0, 2] and job.started_at == 10.0
    states = {n.index: (n.state, n.jobs, n.slots_used) for n in store.list_nodes("c")}
    assert states == {0: (NodeState.PREPARING, [job.id], 1), 1: (NodeState.IDLE, [], 0),
                      2: (NodeState.PREPARING, [job.id], 1)}
    store.update_job(job.id, JobState.RUNNING, 11.0)
    assert store.get_cluster("c").node_counts.running == 2
    job = store.update_job(job.id, JobState.SUCCEEDED, 12.0, exit_code=0)
    assert (job.ended_at, job.exit_code) == (12.0, 0)
    assert store.get_cluster("c").node_counts.idle == 3


def test_refused_transition_changes_nothing(store: SQLiteStore, cluster, add_job) -> None:
    cluster("c", nodes=1)
    job = add_job("c")
    with pytest.raises(InvalidTransitionError, match="queued; it cannot become running"):
        store.update_job(job.id, JobState.RUNNING, 1.0)
    store.update_job(job.id, JobState.PREPARING, 1.0, nodes=[0])
    store.update_job(job.id, JobState.FAILED, 2.0, exit_code=3)
    with pytest.raises(InvalidTransitionError, match="failed; it cannot become queued"):
        store.update_job(job.id, JobState.QUEUED, 3.0)
    after = store.get_job(job.id)
    assert (after.state, after.exit_code, after.ended_at) == (JobState.FAILED, 3, 2.0)


def test_cannot_claim_busy_or_missing_nodes(store: SQLiteStore, cluster, add_job) -> None:
    cluster("c", nodes=1)
    a, b = add_job("c"), add_job("c")
    store.update_job(a.id, JobState.PREPARING, 1.0, nodes=[0])
    with pytest.raises(ConflictError, match="has 0 free slot"):
        store.update_job(b.id, JobState.PREPARING, 1.0, nodes=[0])
    with pytest.raises(NotFoundError, match="no node 5"):
        store.update_job(b.id, JobState.PREPARING, 1.0, nodes=[5])
    assert store.get_job(b.id).state == JobState.QUEUED  # rolled back


def test_jobs_share_a_node_up_to_its_slots(store: SQLiteStore, cluster, add_job) -> None:
    cluster("c", nodes=2, slots=3)
    two = add_job("c", process_count_per_node=2)
    one = add_job("c")
    other = add_job("c", process_count_per_node=2)
    store.update_job(two.id, JobState.PREPARING, 1.0, nodes=[0])
    store.update_job(one.id, JobState.PREPARING, 1.0, nodes=[0])
    with pytest.raises(ConflictError, match="node c/0 has 0 free slot"):
        store.update_job(other.id, JobState.PREPARING, 1.0, nodes=[0])
    node = store.list_nodes("c")[0]
    assert (node.jobs, node.slots_used, node.state) == ([two.id, one.id], 3, NodeState.PREPARING)
    assert store.get_cluster("c").free_slots == 3  # node 1's
    store.update_job(two.id, JobState.RUNNING, 2.0)
    assert store.list_nodes("c")[0].state == NodeState.RUNNING  # one of its jobs runs
    store.update_job(two.id, JobState.SUCCEEDED, 3.0, exit_code=0)
    node = store.list_nodes("c")[0]  # the one still preparing there is what it does now
    assert (node.jobs, node.slots_used, node.state) == ([one.id], 1, NodeState.PREPARING)
    store.update_job(other.id, JobState.PREPARING, 4.0, nodes=[0])
    assert store.list_nodes("c")[0].slots_used == 3
    info = store.resize_cluster("c", 0)  # a busy node leaves with its last job
    assert (info.current_nodes, info.node_counts.leaving) == (1, 1)
    store.update_job(one.id, JobState.FAILED, 5.0, exit_code=1)
    assert store.get_cluster("c").current_nodes == 1
    store.update_job(other.id, JobState.FAILED, 6.0, exit_code=1)
    assert store.get_cluster("c").current_nodes == 0


def test_retry_bumps_attempt(store: SQLiteStore, cluster, add_job) -> None:
    cluster("c", nodes=1)
    job = add_job("c", max_retries=1)
    store.update_job(job.id, JobState.PREPARING, 1.0, nodes=[0])
    store.set_launch(job.id, {"pid": 1})
    job = store.update_job(job.id, JobState.QUEUED, 2.0, message="retry")
    assert (job.attempt, job.message) == (1, "retry")
    assert store.get_launch(job.id) is None
    assert store.get_cluster("c").node_counts.idle == 1


def test_resize_while_busy_never_kills_work(store: SQLiteStore, cluster, add_job) -> None:
    cluster("c", nodes=3)
    job = add_job("c")
    store.update_job(job.id, JobState.PREPARING, 1.0, nodes=[1])
    info = store.resize_cluster("c", 0)
    # Idle nodes go at once; the busy one leaves after its job.
    assert (info.current_nodes, info.node_counts.leaving) == (1, 1)
    assert info.allocation_state.value == "resizing"
    info = store.resize_cluster("c", 2)  # grow while one is leaving: two fresh nodes
    assert info.current_nodes == 3 and info.node_counts.idle == 2
    store.update_job(job.id, JobState.RUNNING, 2.0)  # a leaving node stays leaving
    assert store.get_cluster("c").node_counts.leaving == 1
    store.update_job(job.id, JobState.SUCCEEDED, 3.0)
    info = store.get_cluster("c")
    assert (info.current_nodes, info.allocation_state.value) == (2, "steady")
    assert [n.index for n in store.list_nodes("c")] == [2, 3]


def test_shrink_prefers_idle_nodes(store: SQLiteStore, cluster, add_job) -> None:
    cluster("c", nodes=3)
    job = add_job("c")
    store.update_job(job.id, JobState.PREPARING, 1.0, nodes=[2])
    info = store.resize_cluster("c", 1)
    assert info.node_counts.leaving == 0
    assert [(n.index, n.state) for n in store.list_nodes("c")] == [(2, NodeState.PREPARING)]


def test_delete_cluster(store: SQLiteStore, cluster, add_job) -> None:
    cluster("c", nodes=2)
    job = add_job("c")
    store.update_job(job.id, JobState.PREPARING, 1.0, nodes=[0])
    info = store.mark_cluster_deleting("c")
    assert (info.allocation_state.value, info.current_nodes) == ("deleting", 1)
    with pytest.raises(ConflictError, match="still has 1 nodes"):
        store.remove_cluster("c")
    with pytest.raises(ConflictError, match="being deleted"):
        store.resize_cluster("c", 3)
    store.update_job(job.id, JobState.FAILED, 2.0)
    store.remove_cluster("c")
    with pytest.raises(NotFoundError):
        store.get_cluster("c")


def test_remove_job_only_when_final(store: SQLiteStore, cluster, add_job) -> None:
    cluster("c", nodes=1)
    job = add_job("c")
    with pytest.raises(ConflictError, match="terminate it first"):
        store.remove_job(job.id)
    store.update_job(job.id, JobState.TERMINATED, 1.0)
    store.remove_job(job.id)
    assert store.list_jobs() == []


def test_list_filters_and_order(store: SQLiteStore, cluster, add_job) -> None:
    cluster("c", nodes=1)
    cluster("d", nodes=1)
    a = add_job("c", experiment="e1")
    b = add_job("d", experiment="e2")
    c = add_job("c", experiment="e1")
    store.update_job(c.id, JobState.TERMINATED, 1.0)
    assert [j.id for j in store.list_jobs()] == [a.id, b.id, c.id]
    assert [j.id for j in store.list_jobs(experiment="e1")] == [a.id, c.id]
    assert [j.id for j in store.list_jobs(cluster="d")] == [b.id]
    assert [j.id for j in store.list_jobs(states=[JobState.TERMINATED])] == [c.id]


def test_records_survive_reopening(tmp_path: Path, cluster, add_job, store: SQLiteStore) -> None:
    cluster("c", nodes=2)
    job = add_job("c", node_count=2, outputs=["model"])
    store.update_job(job.id, JobState.PREPARING, 5.0, nodes=[0, 1])
    store.set_launch(job.id, {"pid": 123})
    store.close()
    again = SQLiteStore(store.path)
    got = again.get_job(job.id)
    assert (got.state, got.nodes, got.spec.outputs) == (JobState.PREPARING, [0, 1], ["model"])
    assert again.get_launch(job.id) == {"pid": 123}
    assert again.get_cluster("c").node_counts.preparing == 2
    again.close()


def test_duplicate_job_id_refused(store: SQLiteStore, cluster, add_job) -> None:
    cluster("c")
    job = add_job("c")
    with pytest.raises(ConflictError, match="already exists"):
        store.add_job(JobInfo(**{**job.model_dump(), "state": "queued"}))


def test_cluster_spec_is_validated() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        ClusterSpec(name="c", nodes=-1)
    with pytest.raises(ValidationError, match="backend"):
        ClusterSpec(name="c", nodes=1, backend="Ray cluster")
    with pytest.raises(ValidationError, match="max_nodes\n.*must be at least nodes \\(3\\)"):
        ClusterSpec(name="c", nodes=3, max_nodes=2)
    assert ClusterSpec(name="c", nodes=2, max_nodes=2).max_nodes == 2


def test_one_job_per_idempotency_key(store: SQLiteStore, cluster, add_job) -> None:
    cluster("c")
    first = add_job("c")
    keyed = store.add_job(JobInfo(**{**first.model_dump(), "id": "k1"}), idempotency_key="key")
    again = store.add_job(JobInfo(**{**first.model_dump(), "id": "k2"}), idempotency_key="key")
    assert keyed.id == again.id == "k1"
    assert store.find_job("key").id == "k1" and store.find_job("other") is None
    assert [j.id for j in store.list_jobs()] == [first.id, "k1"]


def test_a_database_of_version_1_opens_with_the_new_columns(tmp_path: Path) -> None:
    path = tmp_path / "v1.sqlite"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE clusters (name TEXT PRIMARY KEY, backend TEXT NOT NULL,
            slots INTEGER NOT NULL, target_nodes INTEGER NOT NULL,
            deleting INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL);
        CREATE TABLE nodes (cluster TEXT NOT NULL, idx INTEGER NOT NULL, state TEXT NOT NULL,
            job_id TEXT, PRIMARY KEY (cluster, idx));
        CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
            cluster TEXT NOT NULL, experiment TEXT, spec TEXT NOT NULL, state TEXT NOT NULL,
            attempt INTEGER NOT NULL, created_at REAL NOT NULL, started_at REAL,
            running_at REAL, ended_at REAL, exit_code INTEGER, message TEXT NOT NULL DEFAULT '',
            nodes TEXT NOT NULL DEFAULT '[]', job_dir TEXT NOT NULL,
            terminate_requested_at REAL, ends_as TEXT, launch TEXT);
        INSERT INTO clusters VALUES ('old', 'local', 1, 0, 0, 1.0);
        PRAGMA user_version = 1;
    """)
    db.close()
    store = SQLiteStore(path)
    assert store.get_cluster("old").max_nodes is None
    assert store.list_nodes("old") == []
    job = JobInfo(id="j", cluster="old", spec=parse_job_spec({"node_count": 1, "command": "x"}),
                  state="queued", created_at=2.0, job_dir="/j")
    assert store.add_job(job, idempotency_key="k").id == "j"
    assert store.find_job("k").id == "j"
    store.close()
    store = SQLiteStore(path)  # a second opening changes nothing
    assert store.find_job("k").id == "j"
    store.close()


def test_a_node_s_job_of_a_version_5_database_holds_its_slots(tmp_path: Path) -> None:
    path = tmp_path / "v5.sqlite"
    store = SQLiteStore(path)
    store.add_cluster(ClusterSpec(name="c", nodes=2, slots=2), 1.0)
    store.add_job(JobInfo(id="j", cluster="c", state="queued", created_at=2.0, job_dir="/j",
                          spec=parse_job_spec({"node_count": 1, "process_count_per_node": 2,
                                               "command": "x"})))
    store.close()
    # What a server of schema version 5 stored: the node's one job in nodes.job_id.
    db = sqlite3.connect(path)
    db.executescript("""
        DROP TABLE node_jobs;
        ALTER TABLE nodes ADD COLUMN job_id TEXT;
        UPDATE nodes SET state='running', job_id='j' WHERE idx=1;
        UPDATE jobs SET state='running', nodes='[1]';
        PRAGMA user_version = 5;
    """)
    db.close()
    store = SQLiteStore(path)
    nodes = store.list_nodes("c")
    assert [(n.state, n.jobs, n.slots_used) for n in nodes] == [
        (NodeState.IDLE, [], 0), (NodeState.RUNNING, ["j"], 2)]
    store.update_job("j", JobState.SUCCEEDED, 3.0, exit_code=0)
    assert store.get_cluster("c").node_counts.idle == 2
    store.close()


def test_a_version_6_database_gets_the_tokens_table_and_keeps_its_jobs(tmp_path: Path) -> None:
    from ringtrain.jobs.models.tokens import TokenInfo, TokenScope

    path = tmp_path / "v6.sqlite"
    store = SQLiteStore(path)
    store.add_cluster(ClusterSpec(name="c", nodes=1), 1.0)
    store.add_job(JobInfo(id="j", cluster="c", state="queued", created_at=2.0, job_dir="/j",
                          spec=parse_job_spec({"node_count": 1, "command": "x"})))
    store.close()
    # What a server of schema version 6 stored: no tokens table.
    db = sqlite3.connect(path)
    db.executescript("DROP TABLE tokens; PRAGMA user_version = 6;")
    db.close()
    store = SQLiteStore(path)
    assert store.get_job("j").state == JobState.QUEUED
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 7
    info = TokenInfo(id="0123456789ab", scope=TokenScope.READ, created_at=3.0)
    store.tokens.add(info, "hash")
    revision = store.revision()
    store.tokens.mark_used(info.id, 4.0)
    assert store.revision() == revision  # a token's use is no change a dashboard hears of
    assert store.tokens.revoke(info.id, 5.0).revoked_at == 5.0
    assert store.tokens.revoke(info.id, 6.0).revoked_at == 5.0  # the first revoke's time
    stored = store.tokens.get(info.id)
    assert stored is not None and stored.hash == "hash" and stored.info.last_used_at == 4.0
    with pytest.raises(NotFoundError, match="no token with id"):
        store.tokens.revoke("ffffffffffff", 7.0)
    with pytest.raises(ConflictError, match="already exists"):
        store.tokens.add(info, "other")
    store.close()


def test_launch_handles_of_a_version_3_database_are_tagged_with_their_backend_once(
        tmp_path: Path) -> None:
    from ringtrain.jobs.service.executors.local.backend import LocalBackend
    from ringtrain.jobs.service.executors.local.executor import LocalExecutor
    from ringtrain.jobs.service.executors.ray.attempt import RayHandle
    from ringtrain.jobs.service.executors.ray.backend import RayBackend
    from ringtrain.jobs.service.executors.ray.connection import RayConnection
    from ringtrain.jobs.service.executors.ray.executor import RayExecutor
    from ringtrain.jobs.service.executors.routing import Backends
    from ringtrain.jobs.service.share import Share

    path = tmp_path / "v3.sqlite"
    store = SQLiteStore(path)
    store.add_cluster(ClusterSpec(name="c", nodes=2), 1.0)
    spec = parse_job_spec({"node_count": 1, "command": "x"})
    for job_id in ("local-job", "ray-job", "unstarted"):
        store.add_job(JobInfo(id=job_id, cluster="c", spec=spec, state="queued", created_at=2.0,
                              job_dir="/j"))
    store.close()
    # What a server of schema version 3 stored: each executor's handle, without a tag.
    ray_fields = {"address": "10.0.0.5:6379", "placement_group": "ray-job.0", "node_count": 2,
                  "attempt": 0, "started_at": 5.0}
    db = sqlite3.connect(path)
    db.execute("UPDATE jobs SET launch=? WHERE id='local-job'",
               ('{"pid": 41, "start_ticks": 900, "attempt": 0, "cgroup": null}',))
    db.execute("UPDATE jobs SET launch=? WHERE id='ray-job'", (json.dumps(ray_fields),))
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()

    store = SQLiteStore(path)
    assert store.get_launch("local-job") == {"pid": 41, "start_ticks": 900, "attempt": 0,
                                             "cgroup": None, "backend": "local"}
    assert store.get_launch("ray-job") == {**ray_fields, "backend": "ray"}
    assert store.get_launch("unstarted") is None
    share = Share(tmp_path / "share")
    backends = Backends([LocalBackend(LocalExecutor(share, use_cgroups=False)),
                         RayBackend(RayExecutor(share, RayConnection(), lambda name: ""),
                                    RayConnection(), tmp_path / "ray")],
                        lambda name: "local")
    local = backends.load_handle(store.get_launch("local-job") or {})
    assert (local.backend, local.handle.pid) == ("local", 41)
    ray = backends.load_handle(store.get_launch("ray-job") or {})
    assert ray.backend == "ray" and ray.handle == RayHandle(**ray_fields)
    # Once tagged, the database is version 4: a later opening infers nothing again.
    store.set_launch("unstarted", {"placement_group": "whatever"})
    store.close()
    store = SQLiteStore(path)
    assert store.get_launch("unstarted") == {"placement_group": "whatever"}
    store.close()
