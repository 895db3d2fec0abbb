"""Argument types of the job CLI: ids and names are checked while the command line is parsed, so a
malformed one (``../clusters/victim``) ends the command with exit 2 before any server is asked."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ringtrain.jobs.errors import InvalidRequestError
from ringtrain.jobs.models.ids import check_job_id, check_name


def job_id(value: str) -> str:
    """An argparse type: a well-formed job id."""
    return _argument(check_job_id, value)


def cluster_name(value: str) -> str:
    """An argparse type: a well-formed cluster name."""
    return _argument(check_name, value)


def experiment_name(value: str) -> str:
    """An argparse type: a well-formed experiment name."""
    return _argument(lambda v: check_name(v, "experiment"), value)


def _argument(check: Callable[[str], str], value: str) -> str:
    # argparse prints an ArgumentTypeError's message as it is, after the usage, and exits 2.
    try:
        return check(value)
    except InvalidRequestError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
