"""Set, list and delete the named secrets the service keeps for object storage (docs/storage.md).

They live in the service's home, so these commands run on the service's host. A value is read
from stdin, never from the command line (which other users see in ``ps``), and never printed.
"""

from __future__ import annotations

import argparse
import json
import sys

from ringtrain.jobs.errors import InvalidRequestError
from ringtrain.jobs.home import Home
from ringtrain.storage.secrets import MAX_OPTIONS, MAX_VALUE, SecretError, SecretStore


def add_commands(parser: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """Add the `secret` subcommands."""
    sub = parser.add_subparsers(metavar="COMMAND")
    p = sub.add_parser("set", help="create or replace a secret: the store library's options as "
                                   "a JSON or YAML mapping on stdin")
    p.add_argument("name")
    p.set_defaults(func=_set)
    p = sub.add_parser("list", parents=[common], help="the secrets' names (never their values)")
    p.set_defaults(func=_list)
    p = sub.add_parser("delete", help="remove a secret")
    p.add_argument("name")
    p.set_defaults(func=_delete)


def _store() -> SecretStore:
    return SecretStore(Home.from_environ().ensure().secrets_folder)


def _set(args: argparse.Namespace) -> int:
    if sys.stdin.isatty():
        print("paste the options (JSON or YAML), then Ctrl-D:", file=sys.stderr)
    text = sys.stdin.read(MAX_OPTIONS * MAX_VALUE * 2 + 1)
    if len(text) > MAX_OPTIONS * MAX_VALUE * 2:
        raise InvalidRequestError("the secret on stdin is too large")
    try:
        import yaml

        options = yaml.safe_load(text)  # JSON is YAML too
    except Exception:
        raise InvalidRequestError("stdin is neither JSON nor YAML: give a mapping such as "
                                  '{"key": "...", "secret": "..."}') from None
    try:
        _store().set(args.name, options)
    except SecretError as e:
        raise InvalidRequestError(str(e)) from None
    print(f"secret {args.name} set")
    return 0


def _list(args: argparse.Namespace) -> int:
    names = _store().names()
    if args.output == "json":
        print(json.dumps(names))
    else:
        print("\n".join(names) if names else "no secrets")
    return 0


def _delete(args: argparse.Namespace) -> int:
    try:
        found = _store().delete(args.name)
    except SecretError as e:
        raise InvalidRequestError(str(e)) from None
    print(f"secret {args.name} deleted" if found else f"no secret named {args.name}")
    return 0 if found else 1
