"""Submit, list, show, follow, download, terminate, delete and deploy training jobs."""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ringtrain.jobs.cli import deployment, output
from ringtrain.jobs.cli.args import cluster_name, connect_from, experiment_name, job_id
from ringtrain.jobs.client.jobs_client import JobsClient
from ringtrain.jobs.errors import SpecError
from ringtrain.jobs.files.upload_tar import INPUTS, UPLOAD_SCHEME, WORKING_DIR, pack
from ringtrain.jobs.files.workdir import DEFAULT_MAX_BYTES, WARN_BYTES, human_bytes, plan_copy
from ringtrain.jobs.models import JobInfo, JobSpec, JobState, load_job_spec
from ringtrain.jobs.models.overrides import apply_overrides
from ringtrain.jobs.models.spec import expand_path


def add_commands(parser: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """Add the `job` subcommands."""
    sub = parser.add_subparsers(metavar="COMMAND")
    p = sub.add_parser("submit", parents=[common], help="submit a job spec (YAML or JSON)")
    p.add_argument("spec", help="the spec file; `ringtrain job schema` describes it")
    p.add_argument("--cluster", required=True, type=cluster_name)
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="change a field of the spec (repeatable): node_count=1, "
                        "environment.SEED=3, max_wall_clock_time=600")
    p.add_argument("--args", help="appended to the spec's command, e.g. --args='--epochs 1'")
    p.add_argument("--max-working-dir-mb", type=float, default=DEFAULT_MAX_BYTES / 1e6,
                   help="refuse a working_dir whose copy is larger (default "
                        f"{DEFAULT_MAX_BYTES / 1e6:.0f} MB, after .gitignore/.ringtrainignore)")
    p.add_argument("--follow", action="store_true",
                   help="stream the preparation step's output, then rank 0's stdout and stderr "
                        "as written, until the job ends; exit 1 unless it succeeds")
    p.add_argument("--idempotency-key", help="name this submission (default: a new random "
                   "key); submitting again with the same key never creates a second job (and "
                   "resumes an upload it started)")
    p.add_argument("--upload", action="store_true",
                   help="upload working_dir and local inputs, as for a service on another "
                        "machine (the default when the service's URL is not this host's)")
    p.set_defaults(func=_submit)
    p = sub.add_parser("list", parents=[common], help="list jobs")
    p.add_argument("--experiment", type=experiment_name)
    p.add_argument("--cluster", type=cluster_name)
    p.add_argument("--state", choices=[s.value for s in JobState])
    p.add_argument("--idempotency-key", help="only the job submitted with this key")
    p.set_defaults(func=_list)
    p = sub.add_parser("show", parents=[common], help="a job's state and details")
    p.add_argument("id", type=job_id)
    p.set_defaults(func=_show)
    p = sub.add_parser("logs", parents=[common],
                       help="a rank's output: stdout and stderr as written (or one of them)")
    p.add_argument("id", type=job_id)
    p.add_argument("--rank", type=int, default=0, help="the rank (with --prep: the node)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--stdout-only", action="store_true", help="stdout only")
    which.add_argument("--stderr", action="store_true", help="stderr only")
    which.add_argument("--prep", action="store_true",
                       help="the preparation step's output on node --rank (stdout, then stderr)")
    p.add_argument("--follow", action="store_true",
                   help="stream until the job ends (the preparation step's output first); "
                        "exit 1 unless it succeeds")
    p.set_defaults(func=_logs)
    p = sub.add_parser("metrics", parents=[common],
                       help="the training scalars a job logged (TensorBoard events under its "
                            "outputs, the step profiler's phases)")
    p.add_argument("id", type=job_id)
    p.add_argument("--tag", help="only the series of this tag")
    p.set_defaults(func=_metrics)
    p = sub.add_parser("files", parents=[common], help="list the files of a job's folder")
    p.add_argument("id", type=job_id)
    p.add_argument("path", nargs="?", default="", help="a sub-folder, e.g. outputs/model")
    p.set_defaults(func=_files)
    p = sub.add_parser("download", parents=[common], help="copy a job's file or folder here")
    p.add_argument("id", type=job_id)
    p.add_argument("path", help="relative to the job's folder, e.g. outputs/model")
    p.add_argument("--to", dest="dest", default=".", help="destination folder (default .)")
    p.set_defaults(func=_download)
    p = sub.add_parser("terminate", parents=[common], help="stop a job")
    p.add_argument("id", type=job_id)
    p.set_defaults(func=_terminate)
    p = sub.add_parser("delete", parents=[common], help="forget a finished job, delete its folder")
    p.add_argument("id", type=job_id)
    p.set_defaults(func=_delete)
    p = sub.add_parser("deploy", parents=[common],
                       help="serve a succeeded job's saved model (see `ringtrain deployment`)")
    p.add_argument("id", type=job_id)
    p.add_argument("--replicas", type=int, default=1,
                   help="servers, one per node of the cluster (default 1)")
    p.add_argument("--cluster", type=cluster_name, help="run them here (default: the job's)")
    p.add_argument("--port", type=int, default=0,
                   help="the front's port on 127.0.0.1, with several replicas (default: a free "
                        "one); refused if in use")
    p.add_argument("--replica-port", type=int, default=0, metavar="BASE",
                   help="replica K listens on BASE + K (default: free ports)")
    p.add_argument("--max-restarts", type=int,
                   help="times in a row a replica's server is started again after it died "
                        "before that replica gives up (default 5)")
    p.add_argument("--wait", type=float, default=120.0,
                   help="seconds to wait for every replica to listen (default 120; 0: return "
                        "at once); exit 1 if it is not ready by then")
    p.set_defaults(func=_deploy)
    p = sub.add_parser("schema", parents=[common], help="print the JSON Schema of job specs")
    p.set_defaults(func=_schema)


def _client(args: argparse.Namespace) -> JobsClient:
    return connect_from(args)


def _resolve_paths(spec: JobSpec) -> JobSpec:
    """Relative working_dir and input paths are relative to where the CLI runs.

    Raises:
        SpecError: a path names no user (``~nobody``) or loops through symbolic links.
    """
    errors = []

    def absolute(field: str, value: str) -> str:
        try:
            return str(expand_path(value))
        except ValueError as e:
            errors.append({"field": field, "message": str(e)})
            return value

    update: dict[str, Any] = {}
    if spec.working_dir:
        update["working_dir"] = absolute("working_dir", spec.working_dir)
    inputs = {k: (v if not isinstance(v, str) or "://" in v else absolute(f"inputs.{k}", v))
              for k, v in spec.inputs.items()}
    if errors:
        raise SpecError(errors)
    if inputs != spec.inputs:
        update["inputs"] = inputs
    return spec.model_copy(update=update) if update else spec


def _show_job(args: argparse.Namespace, job: JobInfo) -> int:
    output.emit(args.output, job, lambda: output.job_text(job))
    return 0


def _submit(args: argparse.Namespace) -> int:
    spec = load_job_spec(args.spec)
    if args.sets or args.args:
        spec = apply_overrides(spec, args.sets, args.args,
                               f"job spec {args.spec} with --set/--args")
    spec = _resolve_paths(spec)
    if spec.working_dir:
        _size_working_dir(Path(spec.working_dir), args.max_working_dir_mb)
    client = _client(args)
    key = args.idempotency_key
    if args.upload or is_remote(client.url):
        key = key or uuid.uuid4().hex
        spec = _upload(client, spec, key, args.max_working_dir_mb)
    job = client.submit(args.cluster, spec, key)
    if not args.follow:
        if args.output == "json":
            output.emit_json(job)
        else:
            print(job.id)
        return 0
    print(job.id, file=sys.stderr if args.output == "json" else sys.stdout, flush=True)
    return _follow(client, args, job.id, rank=0, stream="output")


def is_remote(url: str) -> bool:
    """Whether the service at ``url`` runs on another machine (it cannot read this one's
    files): any host but a loopback name or address."""
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


def _upload(client: JobsClient, spec: JobSpec, key: str, max_mb: float) -> JobSpec:
    """Send the working dir and local inputs as the upload ``key``; the spec naming them so.

    Raises:
        SpecError: a path cannot be read, or the files are over ``max_mb`` MB.
    """
    local = {name: Path(value) for name, value in spec.inputs.items()
             if isinstance(value, str) and "://" not in value}
    working_dir = Path(spec.working_dir) if spec.working_dir else None
    if working_dir is not None and not working_dir.is_dir():
        raise SpecError([{"field": "working_dir", "message": f"{working_dir} is not a folder"}])
    try:
        packed = pack(working_dir, local)
    except OSError as e:
        raise SpecError([{"field": "inputs", "message": f"cannot read {e.filename}: "
                          f"{e.strerror}"}]) from None
    if packed.file_bytes > max_mb * 1e6:
        raise SpecError([{"field": "working_dir", "message": (
            f"{human_bytes(packed.file_bytes)} to upload (working dir and inputs), more than "
            f"--max-working-dir-mb {max_mb:g}")}])
    if packed.skipped_links:
        print(f"not uploaded (links and special files): {', '.join(packed.skipped_links[:6])}"
              + (", ..." if len(packed.skipped_links) > 6 else ""), file=sys.stderr)
    if client.find_job(key) is None:  # else submitted before: its upload is in the job
        resumed = client.upload(key, packed)
        note = f", resumed at byte {resumed}" if resumed else ""
        print(f"uploaded {len(packed.files)} files, {human_bytes(packed.file_bytes)}{note}",
              file=sys.stderr)
    inputs = {name: (f"{UPLOAD_SCHEME}{INPUTS}/{name}" if name in local else value)
              for name, value in spec.inputs.items()}
    return spec.model_copy(update={"working_dir": UPLOAD_SCHEME + WORKING_DIR,
                                   "inputs": inputs})


def _size_working_dir(folder: Path, max_mb: float) -> None:
    """Say on stderr what of the working dir will be copied; refuse it above ``max_mb``.

    Raises:
        SpecError: the copy would be larger than ``max_mb`` MB.
    """
    if not folder.is_dir():
        return  # the service names the problem
    plan = plan_copy(folder)
    skipped = ", ".join(plan.skipped[:6]) + (", ..." if len(plan.skipped) > 6 else "")
    note = f"; skipped: {skipped}" if skipped else ""
    print(f"working_dir {folder}: {plan.files} files, {human_bytes(plan.bytes)} to copy into "
          f"the job{note}", file=sys.stderr)
    hint = ("list what the job does not need (data, outputs, checkpoints) in "
            f"{folder / '.ringtrainignore'} (.gitignore syntax), or point the job at its data "
            "with inputs:")
    if plan.bytes > max_mb * 1e6:
        raise SpecError([{"field": "working_dir", "message": (
            f"{human_bytes(plan.bytes)} to copy, more than --max-working-dir-mb {max_mb:g}: "
            f"{hint}")}])
    if plan.bytes > WARN_BYTES:
        print(f"warning: every job copies this working dir; {hint}", file=sys.stderr)


def _follow(client: JobsClient, args: argparse.Namespace, job_id: str, rank: int,
            stream: str) -> int:
    """Stream a log until the job ends (node 0's preparation output first, when the job has a
    preparation step); the outcome sets the exit code."""
    out = sys.stderr.buffer if args.output == "json" else sys.stdout.buffer
    if client.get_job(job_id).spec.job_preparation:
        # prep.stdout is followed until the ranks start; prep.stderr is complete by then.
        for prep, follow in (("prep.stdout", True), ("prep.stderr", False)):
            for chunk in client.logs(job_id, 0, prep, follow=follow):
                out.write(chunk)
                out.flush()
    for chunk in client.logs(job_id, rank, stream, follow=True):
        out.write(chunk)
        out.flush()
    job = client.get_job(job_id)
    if args.output == "json":
        output.emit_json(job)
    detail = f": {job.message}" if job.message else ""
    print(f"job {job.id} {job.state.value} after {output.duration(job) or '0s'}{detail}",
          file=sys.stderr)
    return 0 if job.state == JobState.SUCCEEDED else 1


def _list(args: argparse.Namespace) -> int:
    if args.idempotency_key is not None:
        found = _client(args).find_job(args.idempotency_key)
        jobs = [] if found is None else [found]
    else:
        jobs = _client(args).list_jobs(args.experiment, args.cluster,
                                       JobState(args.state) if args.state else None)
    output.emit(args.output, jobs, lambda: output.jobs_table(jobs) if jobs else "no jobs")
    return 0


def _show(args: argparse.Namespace) -> int:
    return _show_job(args, _client(args).get_job(args.id))


def _logs(args: argparse.Namespace) -> int:
    client = _client(args)
    stream = "stderr" if args.stderr else "stdout" if args.stdout_only else "output"
    if args.prep:
        if args.follow:
            raise SpecError([{"field": "--prep", "message": "give --prep or --follow, not both "
                                                            "(--follow shows the preparation "
                                                            "step first)"}], "command line")
        data = b"".join(b"".join(client.logs(args.id, args.rank, prep))
                        for prep in ("prep.stdout", "prep.stderr"))
        stream = "prep"
    elif args.follow:
        return _follow(client, args, args.id, args.rank, stream)
    else:
        data = b"".join(client.logs(args.id, args.rank, stream))
    if args.output == "json":
        output.emit_json({"id": args.id, "rank": args.rank, "stream": stream,
                          "text": data.decode(errors="replace")})
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return 0


def _metrics(args: argparse.Namespace) -> int:
    data = _client(args).scalars(args.id)
    series = [{"run": m["run"], "tag": m["tag"], "steps": [], "wall_times": [], "values": []}
              for m in data["series"]]
    for index, step, wall, value in data["points"]:
        series[index]["steps"].append(step)
        series[index]["wall_times"].append(wall)
        series[index]["values"].append(value)
    if args.tag is not None:
        series = [s for s in series if s["tag"] == args.tag]
    if args.output == "json":
        output.emit_json({"id": args.id, "series": series, "truncated": data["truncated"]})
        return 0
    if not series:
        print(f"job {args.id} logged no scalars"
              + (f" tagged {args.tag!r}" if args.tag is not None else "")
              + " (TensorBoard event files under outputs/, or the step profiler's metrics/)")
        return 0
    print(output.table(
        ["RUN", "TAG", "POINTS", "LAST STEP", "LAST", "MIN", "MAX"],
        [[s["run"], s["tag"], len(s["values"]), s["steps"][-1], f"{s['values'][-1]:.6g}",
          f"{min(s['values']):.6g}", f"{max(s['values']):.6g}"] for s in series]))
    if data["truncated"]:
        print("(the service keeps a bounded number of points per job; later ones are not shown)")
    return 0


def _files(args: argparse.Namespace) -> int:
    # Pages are fetched as they are printed: a million files never sit in memory at once.
    files = _client(args).iter_files(args.id, args.path)
    if args.output == "json":
        output.emit_json_array(files)
        return 0
    empty = True
    for page in output.batches(files, 1000):
        print(output.files_table(page, header=empty))
        empty = False
    if empty:
        print("no files")
    return 0


def _download(args: argparse.Namespace) -> int:
    written = _client(args).iter_download(args.id, args.path, args.dest)
    if args.output == "json":
        output.emit_json_array(str(p) for p in written)
        return 0
    for p in written:
        print(p)
    return 0


def _terminate(args: argparse.Namespace) -> int:
    return _show_job(args, _client(args).terminate(args.id))


def _delete(args: argparse.Namespace) -> int:
    _client(args).delete_job(args.id)
    if args.output == "json":
        output.emit_json({"id": args.id, "deleted": True})
    else:
        print(f"job {args.id} deleted")
    return 0


def _deploy(args: argparse.Namespace) -> int:
    client = _client(args)
    info = client.deploy(args.id, args.replicas, args.cluster, port=args.port,
                         replica_port=args.replica_port,
                         max_restarts=args.max_restarts)
    if args.wait > 0:
        print(f"deployment {info.id}: waiting up to {args.wait:g} s for {info.replicas} "
              "replica(s) to listen", file=sys.stderr, flush=True)
        info = deployment.wait_ready(client, info.id, args.wait)
    deployment.show(args, info)
    return deployment.outcome(client, info, args.wait) if args.wait > 0 else 0


def _schema(_args: argparse.Namespace) -> int:
    print(json.dumps(JobSpec.model_json_schema(), indent=2))
    return 0
