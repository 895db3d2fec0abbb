"""List, show, follow the logs of, and stop deployments (`ringtrain job deploy ID` starts one)."""

from __future__ import annotations

import argparse
import sys
import time

from ringtrain.jobs.cli import output
from ringtrain.jobs.cli.args import connect_from, job_id
from ringtrain.jobs.client.jobs_client import JobsClient
from ringtrain.jobs.models.deployment import DeploymentInfo, DeploymentState
from ringtrain.jobs.replica_record import ReplicaState

#: How often a waiting CLI asks for the deployment's state.
POLL_S = 0.2


def add_commands(parser: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """Add the `deployment` subcommands."""
    sub = parser.add_subparsers(metavar="COMMAND")
    p = sub.add_parser("list", parents=[common], help="list deployments (stopped ones too)")
    p.set_defaults(func=_list)
    p = sub.add_parser("show", parents=[common], help="a deployment's state and URLs")
    p.add_argument("id", type=job_id)
    p.set_defaults(func=_show)
    p = sub.add_parser("logs", parents=[common], help="a replica's stdout (or stderr)")
    p.add_argument("id", type=job_id)
    p.add_argument("--replica", type=int, default=0, help="which replica (default 0)")
    p.add_argument("--stderr", action="store_true", help="stderr instead of stdout")
    p.set_defaults(func=_logs)
    p = sub.add_parser("front", parents=[common],
                       help="one URL for the replicas: a round-robin front with health checks, "
                            "in the foreground (the service runs one itself for a deployment "
                            "of several replicas: its `url`)")
    p.add_argument("id", type=job_id)
    p.add_argument("--host", default="127.0.0.1", choices=["127.0.0.1", "::1"],
                   help="loopback address to listen on (the front has no token of its own)")
    p.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    p.add_argument("--cert", help="serve HTTPS with this certificate (PEM; with --key)")
    p.add_argument("--key", help="the certificate's private key (PEM, no passphrase)")
    p.set_defaults(func=_front)
    p = sub.add_parser("stop", parents=[common],
                       help="stop a deployment (requests in flight are answered first)")
    p.add_argument("id", type=job_id)
    p.set_defaults(func=_stop)


def show(args: argparse.Namespace, deployment: DeploymentInfo) -> None:
    """Print one deployment as ``-o`` asks."""
    output.emit(args.output, deployment, lambda: output.deployment_text(deployment))


def wait_ready(client: JobsClient, deployment_id: str, timeout_s: float) -> DeploymentInfo:
    """Poll a deployment until it is ready, has ended, is degraded with no replica on its way
    back, or ``timeout_s`` passed; return it."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = client.get_deployment(deployment_id)
        if not _changing(info) or time.monotonic() >= deadline:
            return info
        time.sleep(POLL_S)


def _changing(info: DeploymentInfo) -> bool:
    """Whether a deployment is on its way to ready: starting, or degraded while a replica is
    starting or restarting."""
    coming = {ReplicaState.STARTING, ReplicaState.RESTARTING}
    return info.state == DeploymentState.STARTING or (
        info.state == DeploymentState.DEGRADED
        and any(r.state in coming for r in info.replica_status))


def outcome(client: JobsClient, info: DeploymentInfo, waited_s: float) -> int:
    """Say on stderr why a deployment that should be ready is not; the exit code (0: ready)."""
    if info.state == DeploymentState.READY:
        return 0
    if info.state in (DeploymentState.STARTING, DeploymentState.DEGRADED):
        why = info.message or "waiting for nodes, or for its replicas to load the model"
        print(f"deployment {info.id} is {info.state.value} after {waited_s:g} s, "
              f"{len(info.healthy)} of {info.replicas} replicas healthy ({why}); it goes on: "
              f"`ringtrain deployment show {info.id}`", file=sys.stderr)
        return 1
    tail = b"".join(client.logs(info.id, 0, "stderr")).decode(errors="replace")[-2000:]
    print(f"deployment {info.id} {info.state.value}: {info.message or '-'}"
          + (f"\nend of replica 0's stderr:\n{tail}" if tail.strip() else ""), file=sys.stderr)
    return 1


def _client(args: argparse.Namespace) -> JobsClient:
    return connect_from(args)


def _list(args: argparse.Namespace) -> int:
    deployments = _client(args).list_deployments()
    output.emit(args.output, deployments,
                lambda: output.deployments_table(deployments) if deployments else "no deployments")
    return 0


def _show(args: argparse.Namespace) -> int:
    show(args, _client(args).get_deployment(args.id))
    return 0


def _logs(args: argparse.Namespace) -> int:
    client = _client(args)
    client.get_deployment(args.id)  # a job id is refused, with a message that says so
    data = b"".join(client.logs(args.id, args.replica, "stderr" if args.stderr else "stdout"))
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    return 0


def _front(args: argparse.Namespace) -> int:
    import socket

    from ringtrain.jobs.service.api.server_cert import given_certificate
    from ringtrain.jobs.service.front_proxy import Backends, create_front
    from ringtrain.web.connection_limits import ConnectionLimits, limited_server

    # Checked first: a certificate that cannot serve ends the command before anything else.
    cert = given_certificate(args.cert, args.key) if args.cert or args.key else None
    client = _client(args)
    info = client.get_deployment(args.id)
    if not info.urls:
        print(f"deployment {info.id} has no replica listening ({info.state.value}); see "
              f"`ringtrain deployment show {info.id}`", file=sys.stderr)
        return 1
    app = create_front(Backends(info.urls),
                       refresh=lambda: client.get_deployment(args.id).urls)
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    host, port = sock.getsockname()[:2]
    where = f"{'https' if cert else 'http'}://{f'[{host}]' if ':' in host else host}:{port}"
    print(f"front of deployment {info.id} at {where} -> "
          f"{len(info.urls)} replica(s), round robin; Ctrl-C stops it"
          + (f"; certificate {cert.fingerprint}" if cert else ""), flush=True)
    limited_server(app, ConnectionLimits().resolved(), log_level="warning",
                   **(cert.files.uvicorn_options() if cert else {})).run(sockets=[sock])
    return 0


def _stop(args: argparse.Namespace) -> int:
    show(args, _client(args).stop_deployment(args.id))
    return 0
