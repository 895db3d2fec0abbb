"""The SQLite store: one database file in WAL mode, one connection per thread.

WAL lets the API read while the scheduler writes, and a committed transaction survives the server
being killed with ``kill -9``. Writes take ``BEGIN IMMEDIATE`` so that a read-then-write (check a
transition, then apply it) never interleaves with another writer.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from ringtrain.jobs.errors import ConflictError, InvalidRequestError, NotFoundError
from ringtrain.jobs.models import (
    AllocationState,
    ClusterInfo,
    ClusterSpec,
    JobInfo,
    JobSpec,
    JobState,
    NodeCounts,
    NodeInfo,
    NodeState,
    check_job_transition,
)
from ringtrain.jobs.service.store import node_table
from ringtrain.jobs.service.store.token_table import TOKENS_SCHEMA, TokenTable
from ringtrain.jobs.service.store.transaction import write_transaction

SCHEMA_VERSION = 7  # 6: node_jobs (jobs share a node's slots); 7: tokens (scoped tokens' hashes)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS clusters (
    name TEXT PRIMARY KEY, backend TEXT NOT NULL, slots INTEGER NOT NULL,
    target_nodes INTEGER NOT NULL, deleting INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL,
    max_nodes INTEGER, address TEXT);
CREATE TABLE IF NOT EXISTS nodes (
    cluster TEXT NOT NULL, idx INTEGER NOT NULL, state TEXT NOT NULL,
    PRIMARY KEY (cluster, idx));
CREATE TABLE IF NOT EXISTS node_jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, cluster TEXT NOT NULL, idx INTEGER NOT NULL,
    job_id TEXT NOT NULL, slots INTEGER NOT NULL, running INTEGER NOT NULL DEFAULT 0,
    UNIQUE (cluster, idx, job_id));
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, cluster TEXT NOT NULL,
    experiment TEXT, spec TEXT NOT NULL, state TEXT NOT NULL, attempt INTEGER NOT NULL,
    created_at REAL NOT NULL, started_at REAL, running_at REAL, ended_at REAL, exit_code INTEGER,
    message TEXT NOT NULL DEFAULT '', nodes TEXT NOT NULL DEFAULT '[]', job_dir TEXT NOT NULL,
    terminate_requested_at REAL, ends_as TEXT, launch TEXT, idempotency_key TEXT, serves TEXT,
    front TEXT);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state);
""" + TOKENS_SCHEMA  # a database of version 6 or older gets the table on opening
#: Columns added after version 1, which a database of that version gets on opening.
_ADDED_COLUMNS = (("clusters", "max_nodes", "INTEGER"), ("jobs", "idempotency_key", "TEXT"),
                  ("clusters", "address", "TEXT"), ("jobs", "serves", "TEXT"),
                  ("jobs", "front", "TEXT"))
#: Version 4 tags each stored launch handle with its backend. The handles stored before it are
#: tagged once, on opening, by the one field that told the two kinds apart: a Ray handle names
#: its placement group, a local one does not.
_TAG_OLD_HANDLES = """
UPDATE jobs SET launch = json_set(launch, '$.backend',
    CASE WHEN json_type(launch, '$.placement_group') IS NULL THEN 'local' ELSE 'ray' END)
WHERE launch IS NOT NULL AND json_valid(launch) AND json_type(launch, '$.backend') IS NULL
"""
#: Before version 6 a node held one job, in ``nodes.job_id``: that job holds its slots now.
_MOVE_NODE_JOBS = """
INSERT INTO node_jobs (cluster, idx, job_id, slots, running)
SELECT nodes.cluster, nodes.idx, nodes.job_id,
       json_extract(jobs.spec, '$.process_count_per_node'), nodes.state = 'running'
FROM nodes JOIN jobs ON jobs.id = nodes.job_id
"""


class ChangeLog:
    """Which jobs changed since a revision, for the dashboard's event stream: a counter bumped
    after each committed write, with the revision at which each job last changed. In memory, so
    it starts at 0 with every server: a client that reconnects after a restart gets a full
    snapshot (its revision is then ahead of the server's, or far behind)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.revision = 0
        self._jobs: dict[str, int] = {}

    def touch(self, job_id: str | None) -> None:
        """Record one committed write, of ``job_id`` (``None``: clusters or nodes only)."""
        with self._lock:
            self.revision += 1
            if job_id is not None:
                self._jobs[job_id] = self.revision

    def since(self, revision: int) -> tuple[int, list[str]]:
        """The current revision and the jobs changed after ``revision``, oldest change first."""
        with self._lock:
            changed = sorted((rev, job) for job, rev in self._jobs.items() if rev > revision)
            return self.revision, [job for _, job in changed]


class SQLiteStore:
    """A :class:`~ringtrain.jobs.service.store.base.Store` in one SQLite file.

    Args:
        path: the database file; created with its schema if missing.
        on_full: called with the database's folder when a write finds its disk full, before
            the write's DiskFullError is raised (the service gives up its reserve then).
    """

    def __init__(self, path: str | Path, on_full: Callable[[Path], None] | None = None):
        self.path = Path(path)
        self.on_full = on_full
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self.changes = ChangeLog()
        #: The scoped tokens' records (in this database, outside the change log).
        self.tokens = TokenTable(self._conn, self._write)
        db = self._conn()
        db.executescript(_SCHEMA)  # idempotent; executescript manages its own transaction
        with self._tx() as db:  # one process adds the new columns; the others see them
            if db.execute("PRAGMA user_version").fetchone()[0] < 4:
                db.execute(_TAG_OLD_HANDLES)
            for table, column, kind in _ADDED_COLUMNS:
                if column not in _columns(db, table):
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            if "job_id" in _columns(db, "nodes"):
                db.execute(_MOVE_NODE_JOBS)
                db.execute("ALTER TABLE nodes DROP COLUMN job_id")
            # Unique, so that two submissions with one key can never both be recorded.
            db.execute("CREATE UNIQUE INDEX IF NOT EXISTS jobs_idempotency_key "
                       "ON jobs (idempotency_key)")
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # -- connections -------------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE below).
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None,
                                   check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across a crash
            conn.execute("PRAGMA foreign_keys=ON")
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction (:func:`.transaction.write_transaction`), outside the change
        log."""
        return write_transaction(self._conn(), self.path.parent, self.on_full)

    @contextmanager
    def _tx(self, job_id: str | None = None) -> Iterator[sqlite3.Connection]:
        """One write transaction; once committed, :attr:`changes` records it (of ``job_id``).

        Raises:
            DiskFullError: the disk holding the database has no room for it.
        """
        with self._write() as db:
            yield db
        self.changes.touch(job_id)

    def revision(self) -> int:
        return self.changes.revision

    def changes_since(self, revision: int) -> tuple[int, list[str]]:
        return self.changes.since(revision)

    def close(self) -> None:
        with self._all_lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
        self._local = threading.local()

    # -- clusters ----------------------------------------------------------------------------

    def add_cluster(self, spec: ClusterSpec, now: float) -> ClusterInfo:
        with self._tx() as db:
            if db.execute("SELECT 1 FROM clusters WHERE name=?", (spec.name,)).fetchone():
                raise ConflictError(f"cluster {spec.name!r} already exists")
            db.execute("INSERT INTO clusters (name, backend, slots, target_nodes, created_at, "
                       "max_nodes, address) VALUES (?,?,?,?,?,?,?)",
                       (spec.name, spec.backend, spec.slots, spec.nodes, now, spec.max_nodes,
                        spec.address))
            db.executemany("INSERT INTO nodes (cluster, idx, state) VALUES (?,?,?)",
                           [(spec.name, i, NodeState.IDLE.value) for i in range(spec.nodes)])
            return self._cluster(db, spec.name)

    def get_cluster(self, name: str) -> ClusterInfo:
        return self._cluster(self._conn(), name)

    def list_clusters(self) -> list[ClusterInfo]:
        db = self._conn()
        names = [r[0] for r in db.execute("SELECT name FROM clusters ORDER BY name")]
        return [self._cluster(db, n) for n in names]

    def list_nodes(self, cluster: str) -> list[NodeInfo]:
        db = self._conn()
        self._cluster_row(db, cluster)
        return node_table.nodes_of(db, cluster)

    def resize_cluster(self, name: str, nodes: int) -> ClusterInfo:
        with self._tx() as db:
            row = self._cluster_row(db, name)
            if row["deleting"]:
                raise ConflictError(f"cluster {name!r} is being deleted; it cannot be resized")
            if row["max_nodes"] is not None and nodes > row["max_nodes"]:
                raise InvalidRequestError(f"cluster {name!r} can have at most {row['max_nodes']} "
                                          f"nodes (its max_nodes), not {nodes}")
            node_table.resize(db, name, nodes)
            return self._cluster(db, name)

    def set_cluster_slots(self, name: str, slots: int) -> ClusterInfo:
        with self._tx() as db:
            if self._cluster_row(db, name)["deleting"]:
                raise ConflictError(f"cluster {name!r} is being deleted; it cannot be resized")
            db.execute("UPDATE clusters SET slots=? WHERE name=?", (slots, name))
            return self._cluster(db, name)

    def mark_cluster_deleting(self, name: str) -> ClusterInfo:
        with self._tx() as db:
            self._cluster_row(db, name)
            db.execute("UPDATE clusters SET deleting=1 WHERE name=?", (name,))
            node_table.resize(db, name, 0)
            return self._cluster(db, name)

    def remove_cluster(self, name: str) -> None:
        with self._tx() as db:
            self._cluster_row(db, name)
            left = db.execute("SELECT COUNT(*) FROM nodes WHERE cluster=?", (name,)).fetchone()[0]
            if left:
                raise ConflictError(f"cluster {name!r} still has {left} nodes")
            db.execute("DELETE FROM clusters WHERE name=?", (name,))

    def _cluster_row(self, db: sqlite3.Connection, name: str) -> sqlite3.Row:
        row = db.execute("SELECT * FROM clusters WHERE name=?", (name,)).fetchone()
        if row is None:
            raise NotFoundError(f"no cluster named {name!r} (see `ringtrain cluster list`)")
        return row

    def _cluster(self, db: sqlite3.Connection, name: str) -> ClusterInfo:
        row = self._cluster_row(db, name)
        counts = NodeCounts()
        for state, count in db.execute(
                "SELECT state, COUNT(*) FROM nodes WHERE cluster=? GROUP BY state", (name,)):
            setattr(counts, state, count)
        current = sum(counts.model_dump().values())
        if row["deleting"]:
            alloc = AllocationState.DELETING
        elif counts.leaving:
            alloc = AllocationState.RESIZING
        else:
            alloc = AllocationState.STEADY
        held = db.execute(
            "SELECT COALESCE(SUM(node_jobs.slots), 0) FROM node_jobs JOIN nodes "
            "USING (cluster, idx) WHERE cluster=? AND nodes.state NOT IN ('leaving', 'unusable')",
            (name,)).fetchone()[0]
        usable = current - counts.leaving - counts.unusable
        return ClusterInfo(name=name, backend=row["backend"], slots=row["slots"],
                           free_slots=usable * row["slots"] - held,
                           target_nodes=row["target_nodes"], max_nodes=row["max_nodes"],
                           current_nodes=current,
                           allocation_state=alloc, node_counts=counts,
                           created_at=row["created_at"], address=row["address"])

    # -- jobs --------------------------------------------------------------------------------

    def add_job(self, job: JobInfo, idempotency_key: str | None = None) -> JobInfo:
        with self._tx(job.id) as db:
            if idempotency_key is not None:
                row = db.execute("SELECT * FROM jobs WHERE idempotency_key=?",
                                 (idempotency_key,)).fetchone()
                if row is not None:
                    return _job(row)
            if db.execute("SELECT 1 FROM jobs WHERE id=?", (job.id,)).fetchone():
                raise ConflictError(f"job id {job.id!r} already exists")
            db.execute(
                "INSERT INTO jobs (id, cluster, experiment, spec, state, attempt, created_at, "
                "message, job_dir, idempotency_key, serves) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (job.id, job.cluster, job.spec.experiment, job.spec.model_dump_json(),
                 job.state.value, job.attempt, job.created_at, job.message, job.job_dir,
                 idempotency_key, job.serves))
            return self._job(db, job.id)

    def get_job(self, job_id: str) -> JobInfo:
        return self._job(self._conn(), job_id)

    def find_job(self, idempotency_key: str) -> JobInfo | None:
        row = self._conn().execute("SELECT * FROM jobs WHERE idempotency_key=?",
                                   (idempotency_key,)).fetchone()
        return None if row is None else _job(row)

    def list_jobs(self, *, experiment: str | None = None, cluster: str | None = None,
                  states: Iterable[JobState] | None = None) -> list[JobInfo]:
        sql, args = "SELECT * FROM jobs WHERE 1=1", list[object]()
        if experiment is not None:
            sql, args = sql + " AND experiment=?", args + [experiment]
        if cluster is not None:
            sql, args = sql + " AND cluster=?", args + [cluster]
        if states is not None:
            values = [JobState(s).value for s in states]
            sql += f" AND state IN ({','.join('?' * len(values))})"
            args += values
        return [_job(r) for r in self._conn().execute(sql + " ORDER BY seq", args)]

    def update_job(self, job_id: str, target: JobState, now: float, *,
                   nodes: list[int] | None = None, message: str | None = None,
                   exit_code: int | None = None, ends_as: JobState | None = None) -> JobInfo:
        with self._tx(job_id) as db:
            job = self._job(db, job_id)
            check_job_transition(job_id, job.state, target)
            sets: dict[str, Any] = {"state": target.value}
            if target == JobState.PREPARING:
                node_table.claim(db, job, nodes or [], self._cluster_row(db, job.cluster)["slots"])
                sets.update(started_at=now, running_at=None, ended_at=None, exit_code=None,
                            nodes=json.dumps(nodes), launch=None, terminate_requested_at=None,
                            ends_as=None)
            elif target == JobState.RUNNING:
                node_table.mark_running(db, job, job.nodes)
                sets["running_at"] = now
            elif target == JobState.UPLOADING:
                pass  # its nodes stay held until the upload ended
            elif target == JobState.TERMINATING:
                sets.update(terminate_requested_at=now,
                            ends_as=(ends_as or JobState.TERMINATED).value)
            elif job.state == JobState.STAGING:  # staged: queued, or ended before it queued
                if target.is_terminal():
                    sets.update(ended_at=now, exit_code=exit_code)
            elif target == JobState.QUEUED:  # a retry
                node_table.release_all(db, job)
                sets.update(attempt=job.attempt + 1, launch=None)
            else:  # a final state
                node_table.release_all(db, job)
                sets.update(ended_at=now, exit_code=exit_code)
            if message is not None:
                sets["message"] = message
            db.execute(f"UPDATE jobs SET {', '.join(f'{k}=?' for k in sets)} WHERE id=?",
                       (*sets.values(), job_id))
            return self._job(db, job_id)

    def set_job_nodes(self, job_id: str, nodes: list[int], message: str | None = None
                      ) -> JobInfo:
        with self._tx(job_id) as db:
            job = self._job(db, job_id)
            if job.state not in (JobState.PREPARING, JobState.RUNNING):
                raise ConflictError(f"job {job_id} is {job.state.value}: only a started job's "
                                    "nodes change")
            gained = [i for i in nodes if i not in job.nodes]
            if gained:
                node_table.claim(db, job, gained, self._cluster_row(db, job.cluster)["slots"])
            if job.state == JobState.RUNNING:  # a running job runs on what it gains
                node_table.mark_running(db, job, nodes)
            for index in node_table.job_nodes(db, job):
                if index not in nodes:
                    node_table.release(db, job, index)
            sets: dict[str, Any] = {"nodes": json.dumps(nodes)}
            if message is not None:
                sets["message"] = message
            db.execute(f"UPDATE jobs SET {', '.join(f'{k}=?' for k in sets)} WHERE id=?",
                       (*sets.values(), job_id))
            return self._job(db, job_id)

    def set_message(self, job_id: str, message: str) -> None:
        with self._tx(job_id) as db:
            self._job(db, job_id)
            db.execute("UPDATE jobs SET message=? WHERE id=?", (message, job_id))

    def set_launch(self, job_id: str, launch: dict[str, Any]) -> None:
        with self._tx() as db:
            self._job(db, job_id)
            db.execute("UPDATE jobs SET launch=? WHERE id=?", (json.dumps(launch), job_id))

    def set_front(self, job_id: str, url: str) -> None:
        with self._tx(job_id) as db:
            self._job(db, job_id)
            db.execute("UPDATE jobs SET front=? WHERE id=?", (url, job_id))

    def get_launch(self, job_id: str) -> dict[str, Any] | None:
        row = self._job_row(self._conn(), job_id)
        return json.loads(row["launch"]) if row["launch"] else None

    def remove_job(self, job_id: str) -> None:
        with self._tx(job_id) as db:
            job = self._job(db, job_id)
            if not job.state.is_terminal():
                raise ConflictError(f"job {job_id} is {job.state.value}; terminate it first "
                                    f"(`ringtrain job terminate {job_id}`)")
            db.execute("DELETE FROM jobs WHERE id=?", (job_id,))

    def _job_row(self, db: sqlite3.Connection, job_id: str) -> sqlite3.Row:
        row = db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no job with id {job_id!r} (see `ringtrain job list`)")
        return row

    def _job(self, db: sqlite3.Connection, job_id: str) -> JobInfo:
        return _job(self._job_row(db, job_id))


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {r["name"] for r in db.execute(f"PRAGMA table_info({table})")}


def _job(row: sqlite3.Row) -> JobInfo:
    return JobInfo(
        id=row["id"], cluster=row["cluster"], spec=JobSpec.model_validate_json(row["spec"]),
        state=JobState(row["state"]), attempt=row["attempt"], created_at=row["created_at"],
        started_at=row["started_at"], running_at=row["running_at"], ended_at=row["ended_at"],
        exit_code=row["exit_code"], message=row["message"], nodes=json.loads(row["nodes"]),
        job_dir=row["job_dir"], terminate_requested_at=row["terminate_requested_at"],
        ends_as=JobState(row["ends_as"]) if row["ends_as"] else None, serves=row["serves"],
        front=row["front"])
