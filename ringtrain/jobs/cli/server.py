"""Run the job service: `ringtrain server` (foreground), `server start|stop|status`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ringtrain.jobs.cli import output
from ringtrain.jobs.client.connection import running_server, start_server, stop_server
from ringtrain.jobs.client.known_homes import remember
from ringtrain.jobs.home import Home, service_token
from ringtrain.jobs.server_info import ServerInfo
from ringtrain.jobs.service.api.server_cert import CertificateSource
from ringtrain.jobs.service.executors.registry import add_server_options
from ringtrain.jobs.service.storage_plans import DEFAULT_CACHE_GB
from ringtrain.storage.transfers import DEFAULT_CONCURRENCY


def add_commands(parser: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """`server` itself serves in the foreground; its subcommands manage a background one."""
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1; any other needs --token)")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument("--token", help="require `Authorization: Bearer TOKEN` (default: "
                                        "RINGTRAIN_TOKEN, else the home's token file)")
    parser.add_argument("--public-host", help="the host name remote clients use in their URL; "
                                              "needed with --host 0.0.0.0")
    tls = parser.add_argument_group("TLS (docs/jobs.md, Remote clients and TLS)")
    tls.add_argument("--tls", action="store_true",
                     help="serve HTTPS; without --cert/--key with a self-signed certificate "
                          "made once in HOME/tls/ (its fingerprint is printed, and shown by "
                          "`ringtrain server status`, for clients to pin)")
    tls.add_argument("--cert", type=Path, help="the certificate to serve (PEM; implies --tls)")
    tls.add_argument("--key", type=Path, help="its private key (PEM, no passphrase)")
    tls.add_argument("--insecure", action="store_true",
                     help="also take requests from other machines over plain HTTP (their token "
                          "crosses the network in the clear); without it they get 403")
    storage = parser.add_argument_group("object storage (docs/storage.md)")
    storage.add_argument("--cache-dir", type=Path,
                         help="the node cache of staged inputs (default: HOME/cache)")
    storage.add_argument("--cache-max-gb", type=float, default=DEFAULT_CACHE_GB,
                         help=f"the cache's bound; unused entries are evicted, least recently "
                              f"used first (default {DEFAULT_CACHE_GB:g})")
    storage.add_argument("--stage-concurrency", type=int, default=DEFAULT_CONCURRENCY,
                         help=f"transfers at once per node (default {DEFAULT_CONCURRENCY})")
    parser.add_argument("--min-free-mb", type=float, metavar="MB",
                        help="refuse new jobs (507) while a disk of the home has less free "
                             "space (default: 100, or 5%% of a disk under 2 GB; 0: never)")
    add_server_options(parser)  # each backend's own flags
    parser.set_defaults(func=_serve, output="table", server_parser=parser)
    sub = parser.add_subparsers(metavar="COMMAND")
    for name, func, help_ in (
            ("start", _start, "start a server for RINGTRAIN_HOME in the background, with the "
                              "flags given before `start` (`server --tls start`)"),
            ("stop", _stop, "stop the server of RINGTRAIN_HOME (jobs keep running)"),
            ("status", _status, "show the server of RINGTRAIN_HOME")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("-o", "--output", choices=["table", "json"], default="table")
        p.set_defaults(func=func)


def _serve(args: argparse.Namespace) -> int:
    from ringtrain.jobs.service.api.server import serve

    logging.getLogger("ringtrain").setLevel(logging.INFO)
    home = Home.from_environ()
    remember(home)
    tls = None
    if args.tls or args.cert is not None or args.key is not None:
        tls = CertificateSource(args.cert, args.key)
    serve(home, args.host, args.port, args.token or service_token(), args.public_host,
          vars(args), tls=tls, insecure=args.insecure)
    return 0


def _report(args: argparse.Namespace, info: ServerInfo | None, verb: str) -> int:
    if args.output == "json":
        output.emit_json({"running": verb != "stopped" and info is not None,
                          "server": None if info is None else info.model_dump(mode="json")})
    elif info is None:
        print(f"no server runs for {Home.from_environ().root}")
    else:
        print(f"server {verb}: pid {info.pid} at {info.url} (home {info.home})")
        if info.fingerprint:  # what remote clients pin: `ringtrain login URL --fingerprint`
            print(f"certificate fingerprint: {info.fingerprint}")
        if verb != "stopped":  # a browser sends no bearer header: the link sets a cookie once
            print(f"API docs in a browser: {info.url}/docs?token=TOKEN, TOKEN being the "
                  f"contents of {Path(info.home) / 'token'}")
    return 0 if info is not None or verb == "stopped" else 1


def _start(args: argparse.Namespace) -> int:
    home = Home.from_environ()
    running = running_server(home)
    flags = _given_flags(args)
    if running is not None and flags:
        print(f"a server already runs for {home.root}; `ringtrain server stop` first to start "
              f"it with {' '.join(flags)}", file=sys.stderr)
        return 1
    return _report(args, running or start_server(home, flags=flags, token=args.token), "running")


def _given_flags(args: argparse.Namespace) -> list[str]:
    """The server flags given before ``start`` (those not at their defaults), as the
    background server's command line; ``--token`` is left out: it goes by the environment."""
    flags: list[str] = []
    for action in args.server_parser._actions:  # noqa: SLF001 - argparse keeps no public list
        value = getattr(args, action.dest, None)
        if (not action.option_strings or action.dest == "token" or value == action.default
                or action.default == argparse.SUPPRESS):  # --help
            continue
        flags.append(action.option_strings[-1])
        if action.nargs != 0:  # store_true flags take no value
            flags.append(str(value))
    return flags


def _stop(args: argparse.Namespace) -> int:
    info = stop_server(Home.from_environ())
    if info is None and args.output != "json":
        print("no server was running", file=sys.stderr)
        return 0
    return _report(args, info, "stopped")


def _status(args: argparse.Namespace) -> int:
    return _report(args, running_server(Home.from_environ()), "running")

