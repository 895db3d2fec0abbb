"""Create, list, show, resize and delete clusters.

Local clusters are N nodes of S slots on the service's host; a cluster of another backend the
service runs is attached to machines at an address (a ray cluster: a Ray cluster's).
"""

from __future__ import annotations

import argparse

from pydantic import ValidationError

from ringtrain.jobs.cli import output
from ringtrain.jobs.cli.args import cluster_name, connect_from
from ringtrain.jobs.errors import SpecError
from ringtrain.jobs.models import ClusterInfo, ClusterSpec
from ringtrain.jobs.models.spec import validation_errors


def add_commands(parser: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """Add the `cluster` subcommands."""
    sub = parser.add_subparsers(metavar="COMMAND")
    p = sub.add_parser("create", parents=[common], help="create a cluster")
    p.add_argument("name")
    p.add_argument("--nodes", type=int, help="number of nodes (required unless attached at an "
                                             "address: then how many of its machines jobs may "
                                             "hold, default all)")
    p.add_argument("--slots", type=int, default=1, help="process slots per node (default 1; "
                                                        "attached: CPUs a job may use per "
                                                        "machine)")
    p.add_argument("--backend", default="local",
                   help="local (default): process slots on the service's host; or another "
                        "backend the service runs, attached to machines at --address (ray: a "
                        "Ray cluster; `ringtrain server --help` lists the backends)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--address", help="where the backend's machines are (ray: the Ray "
                                         "cluster's HOST:PORT, its token from RAY_AUTH_TOKEN in "
                                         "the service's environment)")
    where.add_argument("--local", action="store_true",
                       help="the backend starts private machines on the service's host (ray: a "
                            "private Ray head)")
    p.add_argument("--max-nodes", type=int, help="the most nodes a resize may set; jobs "
                                                 "needing more are refused (default: no limit)")
    p.set_defaults(func=_create)
    p = sub.add_parser("list", parents=[common], help="list clusters")
    p.set_defaults(func=_list)
    p = sub.add_parser("show", parents=[common], help="a cluster's allocation and node states")
    p.add_argument("name", type=cluster_name)
    p.set_defaults(func=_show)
    p = sub.add_parser("resize", parents=[common],
                       help="change the number of nodes (busy nodes leave after their job) "
                            "and/or the process slots per node")
    p.add_argument("name", type=cluster_name)
    p.add_argument("--nodes", type=int)
    p.add_argument("--slots", type=int, help="process slots per node (jobs that start later)")
    p.set_defaults(func=_resize)
    p = sub.add_parser("delete", parents=[common],
                       help="delete a cluster (its queued jobs fail; running ones finish)")
    p.add_argument("name", type=cluster_name)
    p.set_defaults(func=_delete)


def _show_one(args: argparse.Namespace, info: ClusterInfo) -> int:
    output.emit(args.output, info, lambda: output.cluster_text(info))
    return 0


def _create(args: argparse.Namespace) -> int:
    if args.nodes is None and not (args.address or args.local):
        raise SpecError([{"field": "nodes",
                          "message": f"a {args.backend} cluster needs --nodes N (only one "
                                     "attached at an --address may take all its machines)"}],
                        "cluster")
    try:
        spec = ClusterSpec(name=args.name, nodes=args.nodes or 0, slots=args.slots,
                           backend=args.backend, max_nodes=args.max_nodes,
                           address="local" if args.local else args.address)
    except ValidationError as e:
        raise SpecError(validation_errors(e, ClusterSpec), "cluster") from None
    return _show_one(args, connect_from(args).create_cluster(spec))


def _list(args: argparse.Namespace) -> int:
    clusters = connect_from(args).list_clusters()
    output.emit(args.output, clusters,
                lambda: output.clusters_table(clusters) if clusters else "no clusters")
    return 0


def _show(args: argparse.Namespace) -> int:
    return _show_one(args, connect_from(args).get_cluster(args.name))


def _resize(args: argparse.Namespace) -> int:
    if args.nodes is None and args.slots is None:
        raise SpecError([{"field": "nodes", "message": "give --nodes N, --slots S, or both"}],
                        "cluster")
    return _show_one(args, connect_from(args).resize_cluster(
        args.name, args.nodes, args.slots))


def _delete(args: argparse.Namespace) -> int:
    info = connect_from(args).delete_cluster(args.name)
    if args.output == "json":
        output.emit_json(info)
    elif info.current_nodes == 0:
        print(f"cluster {args.name} deleted")
    else:
        print(f"cluster {args.name} is deleting: {info.current_nodes} busy nodes leave once "
              "their jobs end")
    return 0
