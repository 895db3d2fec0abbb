"""Cluster names and job ids: the patterns they match, checked wherever one comes in.

A name or id ends up in a URL path and in a folder name, so anything else (``../clusters/victim``)
is refused before it is used: by the CLI's argument parser, by the client before it builds a URL,
and by the API's path parameters.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import StringConstraints

from ringtrain.jobs.errors import InvalidRequestError, brief

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
# An id is a job's name (or `job`) and six hex digits: see JobService.submit.
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}-[0-9a-f]{6}$"

NAME_RULE = ("must start with a letter or digit and contain only letters, digits, '.', '_' or '-' "
             "(at most 63 characters)")
JOB_ID_RULE = "must be a job's name and six hex digits, like fashion-2x1-3f9a1c"

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]


def check_name(value: str, what: str = "cluster name") -> str:
    """Return ``value`` if it is a valid cluster (or experiment) name; else raise
    InvalidRequestError, saying what a name looks like."""
    if not _matches(NAME_PATTERN, value, 63):
        raise InvalidRequestError(f"invalid {what} {brief(value)}: {NAME_RULE}")
    return value


def check_job_id(value: str) -> str:
    """Return ``value`` if it is a well-formed job id; else raise InvalidRequestError, saying
    what an id looks like and where ids are listed."""
    if not _matches(JOB_ID_PATTERN, value, 70):
        raise InvalidRequestError(f"invalid job id {brief(value)}: {JOB_ID_RULE} "
                                  "(see `ringtrain job list`)")
    return value


def _matches(pattern: str, value: str, max_length: int) -> bool:
    # The length check first keeps the match cheap whatever the caller passes; fullmatch, since
    # `$` alone would accept a trailing newline.
    return (isinstance(value, str) and len(value) <= max_length
            and re.fullmatch(pattern, value) is not None)
