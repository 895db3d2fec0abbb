"""`ringtrain logout [NAME]`: forget a service of `ringtrain login` (default: the current one)
and the copy of its token; a token file the user named stays."""

from __future__ import annotations

import argparse
import sys

from ringtrain.jobs.client import services
from ringtrain.jobs.errors import InvalidRequestError


def add_commands(parser: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """`logout` takes the service's name."""
    parser.add_argument("name", nargs="?", help="the service (default: the current one)")
    parser.set_defaults(func=_logout, output="table")


def _logout(args: argparse.Namespace) -> int:
    name = args.name
    if name is None:
        current = services.current_service()
        if current is None:
            raise InvalidRequestError("no service is current: name the one to forget "
                                      "(`ringtrain login --list`)")
        name = current[0]
    record = services.forget_service(name)
    print(f"logged out of {name} ({record.url})", file=sys.stderr)
    return 0
