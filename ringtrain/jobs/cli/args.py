"""Arguments of the job CLI: ids and names are checked while the command line is parsed, so a
malformed one (``../clusters/victim``) ends the command with exit 2 before any server is asked;
and the options that choose the service a command talks to."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ringtrain.jobs.client.connection import connect
from ringtrain.jobs.client.jobs_client import JobsClient
from ringtrain.jobs.errors import InvalidRequestError
from ringtrain.jobs.models.ids import check_job_id, check_name
from ringtrain.jobs.models.tokens import check_token_id


def job_id(value: str) -> str:
    """An argparse type: a well-formed job id."""
    return _argument(check_job_id, value)


def cluster_name(value: str) -> str:
    """An argparse type: a well-formed cluster name."""
    return _argument(check_name, value)


def experiment_name(value: str) -> str:
    """An argparse type: a well-formed experiment name."""
    return _argument(lambda v: check_name(v, "experiment"), value)


def token_id(value: str) -> str:
    """An argparse type: a well-formed scoped token id."""
    return _argument(check_token_id, value)


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """``--url``, ``--token`` and ``--fingerprint``: which service a command talks to."""
    parser.add_argument("--url", help="talk to this server (default: RINGTRAIN_URL, else the "
                                      "server of RINGTRAIN_HOME when it is set, else the "
                                      "service of `ringtrain login`, else the server of "
                                      "~/.ringtrain, started if needed)")
    parser.add_argument("--token", help="bearer token of the server (default: RINGTRAIN_TOKEN "
                                        "or the file RINGTRAIN_TOKEN_FILE names)")
    parser.add_argument("--fingerprint",
                        help="the certificate an https --url must show, SHA256:... (default: "
                             "RINGTRAIN_FINGERPRINT, or the pin of a login at that URL)")


def connect_from(args: argparse.Namespace) -> JobsClient:
    """A client of the service that ``--url``/``--token``/``--fingerprint`` (or their defaults)
    choose."""
    return connect(url=args.url, token=args.token, fingerprint=args.fingerprint)


def _argument(check: Callable[[str], str], value: str) -> str:
    # argparse prints an ArgumentTypeError's message as it is, after the usage, and exits 2.
    try:
        return check(value)
    except InvalidRequestError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
