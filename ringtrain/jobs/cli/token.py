"""Create, list and revoke scoped tokens (the admin token's commands).

A scoped token lets someone read jobs (``--scope read``: the dashboard, logs, files), of every
experiment or of one, or run jobs in one experiment (``--scope submit``), without the rights of
the admin token. ``create`` prints the token once, alone on stdout (so that ``> FILE`` keeps just
the token), and its id on stderr; the service keeps only its hash.
"""

from __future__ import annotations

import argparse
import sys
import time

from pydantic import ValidationError

from ringtrain.jobs.cli import output
from ringtrain.jobs.cli.args import connect_from, experiment_name, token_id
from ringtrain.jobs.errors import SpecError
from ringtrain.jobs.models.spec import validation_errors
from ringtrain.jobs.models.tokens import MAX_EXPIRES_DAYS, TokenInfo, TokenRequest, TokenScope


def add_commands(parser: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """Add the `token` subcommands."""
    sub = parser.add_subparsers(metavar="COMMAND")
    p = sub.add_parser("create", parents=[common],
                       help="make a scoped token and print it (once: it cannot be shown again)")
    p.add_argument("--scope", required=True, choices=[s.value for s in TokenScope],
                   help=f"read: {TokenScope.READ.allows()}; submit: "
                        f"{TokenScope.SUBMIT.allows()}")
    p.add_argument("--experiment", type=experiment_name,
                   help="only this experiment's jobs (required for --scope submit: the one it "
                        "submits into)")
    p.add_argument("--name", default="", help="a label: who or what it is for")
    p.add_argument("--expires-days", type=int,
                   help=f"days until it stops working, 1 to {MAX_EXPIRES_DAYS} (default: never)")
    p.set_defaults(func=_create)
    p = sub.add_parser("list", parents=[common],
                       help="scoped tokens: ids, scopes, labels, state, last use (never tokens)")
    p.set_defaults(func=_list)
    p = sub.add_parser("revoke", parents=[common], help="revoke a token: refused from now on")
    p.add_argument("id", type=token_id, help="the token's id, as `token list` shows it")
    p.set_defaults(func=_revoke)


def _create(args: argparse.Namespace) -> int:
    try:
        request = TokenRequest(scope=args.scope, experiment=args.experiment, label=args.name,
                               expires_days=args.expires_days)
    except ValidationError as e:
        raise SpecError(validation_errors(e, TokenRequest), "token") from None
    made = connect_from(args).create_token(request)
    if args.output == "json":
        output.emit_json(made)
        return 0
    info = made.info
    until = f", expires {output.when(info.expires_at)}" if info.expires_at else ""
    print(f"token {info.id}: {info.describe()}{until}. It is shown this once: keep it "
          f"(`ringtrain token revoke {info.id}` ends it).", file=sys.stderr)
    print(made.token)
    return 0


def _list(args: argparse.Namespace) -> int:
    tokens = connect_from(args).list_tokens()
    output.emit(args.output, tokens, lambda: _table(tokens) if tokens else "no tokens")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    info = connect_from(args).revoke_token(args.id)
    output.emit(args.output, info,
                lambda: f"token {info.id} revoked at {output.when(info.revoked_at)}")
    return 0


def _table(tokens: list[TokenInfo]) -> str:
    now = time.time()
    return output.table(
        ["id", "scope", "experiment", "label", "state", "created", "expires", "last used"],
        [[t.id, t.scope.value, t.experiment or "(all)", t.label, t.state(now),
          output.when(t.created_at), output.when(t.expires_at) or "never",
          output.when(t.last_used_at) or "never"] for t in tokens])
