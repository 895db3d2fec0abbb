"""The node table of the SQLite store: which jobs hold a node's slots, and the node states that
follow from them. Functions of one open transaction (``db``), called by
:class:`~ringtrain.jobs.service.store.sqlite.SQLiteStore` only."""

from __future__ import annotations

import sqlite3

from ringtrain.jobs.errors import ConflictError, NotFoundError
from ringtrain.jobs.models import JobInfo, NodeInfo, NodeState, check_node_transition


def nodes_of(db: sqlite3.Connection, cluster: str, index: int | None = None) -> list[NodeInfo]:
    """The nodes of ``cluster`` by index (only node ``index`` when given), with their jobs."""
    where, args = "cluster=?", list[object]([cluster])
    if index is not None:
        where, args = where + " AND idx=?", args + [index]
    held: dict[int, list[sqlite3.Row]] = {}
    for row in db.execute(f"SELECT * FROM node_jobs WHERE {where} ORDER BY seq", args):
        held.setdefault(row["idx"], []).append(row)
    return [NodeInfo(cluster=cluster, index=r["idx"], state=NodeState(r["state"]),
                     jobs=[j["job_id"] for j in held.get(r["idx"], [])],
                     slots_used=sum(j["slots"] for j in held.get(r["idx"], [])))
            for r in db.execute(f"SELECT * FROM nodes WHERE {where} ORDER BY idx", args)]


def node_at(db: sqlite3.Connection, cluster: str, index: int) -> NodeInfo:
    found = nodes_of(db, cluster, index)
    if not found:
        raise NotFoundError(f"cluster {cluster!r} has no node {index}")
    return found[0]


def resize(db: sqlite3.Connection, name: str, target: int) -> None:
    db.execute("UPDATE clusters SET target_nodes=? WHERE name=?", (target, name))
    rows = nodes_of(db, name)
    staying = [n for n in rows if n.state != NodeState.LEAVING]
    if target > len(staying):
        first = max((n.index for n in rows), default=-1) + 1
        db.executemany("INSERT INTO nodes (cluster, idx, state) VALUES (?,?,?)",
                       [(name, first + i, NodeState.IDLE.value)
                        for i in range(target - len(staying))])
        return
    # Shrink idle and unusable nodes first (highest index first); busy nodes only leave once
    # their jobs end, so a shrink never kills running work.
    order = {NodeState.IDLE: 0, NodeState.UNUSABLE: 1}
    victims = sorted(staying, key=lambda n: (order.get(n.state, 2), len(n.jobs), -n.index))
    for node in victims[:len(staying) - target]:
        if not node.jobs:
            db.execute("DELETE FROM nodes WHERE cluster=? AND idx=?", (name, node.index))
        else:
            _set_node(db, node, NodeState.LEAVING)


def claim(db: sqlite3.Connection, job: JobInfo, indices: list[int], slots: int) -> None:
    """Give ``job`` its slots on the nodes ``indices`` of its cluster (``slots`` per node)."""
    if not indices:
        raise ConflictError(f"job {job.id}: preparing needs the nodes it runs on")
    need = job.spec.process_count_per_node
    by_index = {n.index: n for n in nodes_of(db, job.cluster)}
    for i in indices:
        node = by_index.get(i)
        if node is None:
            raise NotFoundError(f"cluster {job.cluster!r} has no node {i}")
        if node.state in (NodeState.LEAVING, NodeState.UNUSABLE):
            raise ConflictError(f"node {job.cluster}/{i} is {node.state.value}")
        if job.id in node.jobs:
            raise ConflictError(f"job {job.id} holds node {job.cluster}/{i} already")
        if node.slots_used + need > slots:
            raise ConflictError(f"node {job.cluster}/{i} has {slots - node.slots_used} free "
                                f"slot(s); job {job.id} needs {need}")
        db.execute("INSERT INTO node_jobs (cluster, idx, job_id, slots) VALUES (?,?,?,?)",
                   (job.cluster, i, job.id, need))
        _refresh(db, job.cluster, i)

def mark_running(db: sqlite3.Connection, job: JobInfo, indices: list[int]) -> None:
    for i in indices:
        db.execute("UPDATE node_jobs SET running=1 WHERE cluster=? AND idx=? AND job_id=?",
                   (job.cluster, i, job.id))
        _refresh(db, job.cluster, i)

def job_nodes(db: sqlite3.Connection, job: JobInfo) -> list[int]:
    return [r[0] for r in db.execute(
        "SELECT idx FROM node_jobs WHERE cluster=? AND job_id=? ORDER BY idx",
        (job.cluster, job.id))]

def release_all(db: sqlite3.Connection, job: JobInfo) -> None:
    for index in job_nodes(db, job):
        release(db, job, index)

def release(db: sqlite3.Connection, job: JobInfo, index: int) -> None:
    db.execute("DELETE FROM node_jobs WHERE cluster=? AND idx=? AND job_id=?",
               (job.cluster, index, job.id))
    _refresh(db, job.cluster, index)


def _set_node(db: sqlite3.Connection, node: NodeInfo, state: NodeState) -> None:
    check_node_transition(f"{node.cluster}/{node.index}", node.state, state)
    db.execute("UPDATE nodes SET state=? WHERE cluster=? AND idx=?",
               (state.value, node.cluster, node.index))

def _refresh(db: sqlite3.Connection, cluster: str, index: int) -> None:
    """Bring a node's state in line with the jobs on it: running while one of them runs,
    preparing while they prepare, idle without any; a leaving node goes with its last job,
    and an unusable one stays so."""
    node = node_at(db, cluster, index)
    if node.state == NodeState.LEAVING:
        if not node.jobs:
            db.execute("DELETE FROM nodes WHERE cluster=? AND idx=?", (cluster, index))
        return
    if node.state == NodeState.UNUSABLE:
        return
    running = db.execute("SELECT 1 FROM node_jobs WHERE cluster=? AND idx=? AND running=1",
                         (cluster, index)).fetchone()
    state = (NodeState.RUNNING if running else NodeState.PREPARING if node.jobs
             else NodeState.IDLE)
    if state != node.state:
        _set_node(db, node, state)
