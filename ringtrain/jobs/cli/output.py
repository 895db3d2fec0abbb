"""How the job CLI prints: aligned tables for people, one JSON document for ``-o json``."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, TypeVar

from pydantic import BaseModel

from ringtrain.jobs.models import ClusterInfo, FileInfo, JobInfo
from ringtrain.jobs.models.deployment import DeploymentInfo, DeploymentState, ReplicaStatus
from ringtrain.jobs.replica_record import ReplicaState

T = TypeVar("T")


def emit_json(value: Any) -> None:
    """Print one JSON document (models, lists of models or plain values) on stdout."""
    def plain(v: Any) -> Any:
        if isinstance(v, BaseModel):
            return v.model_dump(mode="json")
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    print(json.dumps(plain(value), indent=2))


def emit_json_array(items: Iterable[Any]) -> None:
    """Print one JSON array on stdout, each item as it comes (a long listing is never held)."""
    sep = "[\n"
    for item in items:
        value = item.model_dump(mode="json") if isinstance(item, BaseModel) else item
        body = json.dumps(value, indent=2).replace("\n", "\n  ")
        print(f"{sep}  {body}", end="")
        sep = ",\n"
    print("[]" if sep == "[\n" else "\n]")


def batches(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` in lists of ``size`` (the last may be shorter)."""
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


def emit(fmt: str, value: Any, text: Callable[[], str]) -> None:
    """Print ``value`` as JSON when ``fmt`` (the ``-o`` choice) is ``json``, else ``text()``."""
    if fmt == "json":
        emit_json(value)
    else:
        print(text())


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces; '-' for empty cells."""
    cells = [[str(h).upper() for h in headers]]
    cells += [["-" if c is None or c == "" else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def when(t: float | None) -> str:
    """A timestamp as local date and time."""
    return "" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def duration(job: JobInfo, now: float | None = None) -> str:
    """How long the current attempt ran (so far)."""
    if job.started_at is None:
        return ""
    end = job.ended_at if job.ended_at is not None else (now or time.time())
    return f"{max(0.0, end - job.started_at):.1f}s"


def clusters_table(clusters: list[ClusterInfo]) -> str:
    """The table of `cluster list`."""
    return table(
        ["name", "backend", "nodes", "slots", "free slots", "allocation", "idle", "preparing",
         "running", "leaving", "unusable"],
        [[c.name, c.backend, f"{c.current_nodes}/{c.target_nodes}", c.slots, c.free_slots,
          c.allocation_state.value, *c.node_counts.model_dump().values()] for c in clusters])


def cluster_text(c: ClusterInfo) -> str:
    """The text of `cluster show`."""
    counts = ", ".join(f"{k} {v}" for k, v in c.node_counts.model_dump().items())
    return "\n".join([
        f"name:        {c.name}", f"backend:     {c.backend}",
        f"nodes:       {c.current_nodes} (target {c.target_nodes}"
        + ("" if c.max_nodes is None else f", at most {c.max_nodes}")
        + f"), {c.slots} slots each, {c.free_slots} free",
        f"allocation:  {c.allocation_state.value}", f"node states: {counts}",
        f"created:     {when(c.created_at)}"]
        + ([f"address:     {c.address}"] if c.address else [])
        + (["machines:\n" + table(
            ["machine", "address", "state", "cpus free", "gpus free"],
            [[m.id[:12], m.address, "alive" if m.alive else "dead",
              f"{m.cpus_free:g}/{m.cpus:g}", f"{m.gpus_free:g}/{m.gpus:g}"]
             for m in c.machines])] if c.machines else []))


def jobs_table(jobs: list[JobInfo]) -> str:
    """The table of `job list`."""
    return table(["id", "experiment", "cluster", "state", "nodes", "priority", "created",
                  "duration"],
                 [[j.id, j.spec.experiment, j.cluster, j.state.value,
                   f"{j.spec.node_count}x{j.spec.process_count_per_node}",
                   j.spec.priority.value, when(j.created_at), duration(j)] for j in jobs])


def job_text(j: JobInfo) -> str:
    """The text of `job show`."""
    s = j.spec
    lines = [
        f"id:          {j.id}", f"name:        {s.name or '-'}",
        f"experiment:  {s.experiment or '-'}", f"cluster:     {j.cluster}",
        f"state:       {j.state.value}" + (f" (attempt {j.attempt + 1} of {s.max_retries + 1})"
                                           if s.max_retries else ""),
        f"message:     {j.message or '-'}",
        f"exit code:   {'-' if j.exit_code is None else j.exit_code}",
        f"ranks:       {s.node_count} nodes x {s.process_count_per_node} processes"
        + (f" on nodes {', '.join(map(str, j.nodes))}" if j.nodes else ""),
        f"command:     {s.command}", f"priority:    {s.priority.value}",
        f"created:     {when(j.created_at)}", f"started:     {when(j.started_at) or '-'}",
        f"running:     {when(j.running_at) or '-'}", f"ended:       {when(j.ended_at) or '-'}",
        f"duration:    {duration(j) or '-'}", f"folder:      {j.job_dir}",
    ]
    if j.serves:
        lines.append(f"deployment:  serves job {j.serves} (`ringtrain deployment show {j.id}`)")
    return "\n".join(lines)


def deployments_table(deployments: list[DeploymentInfo]) -> str:
    """The table of `deployment list`."""
    return table(["id", "serves", "cluster", "state", "healthy", "url"],
                 [[d.id, d.serves, d.job.cluster, d.state.value,
                   f"{len(d.healthy)}/{d.replicas}", d.url or "-"] for d in deployments])


def deployment_text(d: DeploymentInfo) -> str:
    """The text of `deployment show` and `job deploy`."""
    lines = [f"id:          {d.id}", f"serves:      job {d.serves}", f"model:       {d.model}",
             f"cluster:     {d.job.cluster}", f"state:       {d.state.value}",
             f"message:     {d.message or '-'}", f"replicas:    {d.replicas}"]
    if d.replicas > 1 and d.url:
        lines.append(f"url:         {d.url}   (front: each request to the next healthy "
                     f"replica; {len(d.healthy)} of {d.replicas} healthy)")
    for r in d.replica_status:
        if d.replicas == 1 and r.healthy:  # its URL is the deployment's
            lines.append(f"url:         {r.url}")
        else:
            lines.append(f"replica {r.index}:   {r.url or '-'}   ({_replica_note(r)})")
    url = d.url or (d.urls[0] if d.urls else None)
    if url and d.state == DeploymentState.READY:  # not on the way down
        lines.append(f"try:         curl -H 'Content-Type: image/jpeg' --data-binary @IMAGE.jpg "
                     f"{url}/v2/models/model/image")
    return "\n".join(lines)


def _replica_note(r: ReplicaStatus) -> str:
    """How one replica of `deployment show` stands, in words."""
    if r.healthy:
        return "healthy" + (f", after {r.restarts} restart(s) in a row" if r.restarts else "")
    if r.state == ReplicaState.SERVING:
        return "out: failed its last health check"
    if r.state == ReplicaState.STARTING:
        return "starting: loading the model"
    return f"{r.state.value}: {r.message}"


def files_table(files: list[FileInfo], header: bool = True) -> str:
    """The table of `job files` (one page of it: columns are aligned within the page)."""
    text = table(["path", "size", "modified"], [[f.path, f.size, when(f.modified_at)]
                                                for f in files])
    return text if header else text.partition("\n")[2]


def error(message: str, errors: list[dict[str, str]] | None, as_json: bool) -> None:
    """Report a failure: text on stderr, and with ``-o json`` a JSON document on stdout."""
    print(f"ringtrain: {message}", file=sys.stderr)
    if as_json:
        emit_json({"error": message, "errors": errors or []})
