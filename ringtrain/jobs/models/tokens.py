"""Scoped tokens, as the API, the client and the CLI share them.

The admin token (the home's, or the one given with ``--token``) may do everything. Besides it the
service issues scoped tokens (``ringtrain token create``), so that a team member can watch jobs,
or run their own, without being able to delete everyone's: ``read`` reads (the GET routes and the
dashboard), of every job or of one experiment's only; ``submit`` also submits jobs into its
experiment and ends them. A scoped token's text is ``rt_<id>_<secret>``: the id finds its record,
the secret (256 random bits) proves it, and the service keeps only the SHA-256 of the whole text,
so the token is shown once, when it is made.
"""

from __future__ import annotations

import re
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from ringtrain.jobs.errors import InvalidRequestError, brief
from ringtrain.jobs.models.ids import Name

#: A scoped token's id: what ``token list`` shows and ``token revoke`` takes.
TOKEN_ID_PATTERN = r"^[0-9a-f]{12}$"
TOKEN_ID_RULE = "must be 12 hex digits, as `ringtrain token list` shows"
#: What every scoped token starts with; an admin token is told apart by comparing with it first.
TOKEN_PREFIX = "rt_"
#: The longest a token may be given for (ten years) and its label.
MAX_EXPIRES_DAYS = 3650
MAX_LABEL = 100


class TokenScope(str, Enum):
    """What a scoped token may do (the admin token may do everything)."""

    READ = "read"
    SUBMIT = "submit"

    def allows(self) -> str:
        """What the scope allows, in words, for help texts and refusals."""
        if self == TokenScope.READ:
            return ("read only: GET routes (jobs, their files, logs and scalars, clusters, "
                    "deployments, the dashboard and its event stream, metrics)")
        return ("reading, and submitting, terminating, deleting and deploying the jobs of its "
                "experiment (and stopping their deployments)")


class TokenRequest(BaseModel):
    """``POST /v1/tokens``: the scope of a new token, and what limits it."""

    model_config = ConfigDict(extra="forbid")

    scope: TokenScope
    experiment: Name | None = Field(
        None, validate_default=True,
        description="Only this experiment's jobs are visible (and, for submit, the only one it "
                    "submits into; required for submit).")
    label: str = Field("", max_length=MAX_LABEL, pattern=r"^[^\x00-\x1f\x7f]*$",
                       description="Who or what it is for (shown by `token list`).")
    expires_days: int | None = Field(None, ge=1, le=MAX_EXPIRES_DAYS, strict=True,
                                     description="Days until it stops working (default: never).")

    @field_validator("experiment")
    @classmethod
    def _submit_names_its_experiment(cls, value: str | None, info: ValidationInfo
                                     ) -> str | None:
        # A submit token without an experiment could submit and end anyone's jobs: no scope.
        if value is None and info.data.get("scope") == TokenScope.SUBMIT:
            raise ValueError("a submit token needs an experiment: the one it submits into")
        return value


class TokenInfo(BaseModel):
    """A scoped token's record, as ``GET /v1/tokens`` lists it: never the token itself."""

    id: str
    scope: TokenScope
    experiment: str | None = None
    label: str = ""
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None
    last_used_at: float | None = Field(
        None, description="When it last authenticated a request (to within a minute).")

    def state(self, now: float) -> str:
        """``revoked``, ``expired`` or ``active`` at time ``now``."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return "active"

    def describe(self) -> str:
        """The scope and its limit in words: ``read (experiment mnist)``."""
        limit = f" (experiment {self.experiment})" if self.experiment else " (every experiment)"
        return f"{self.scope.value}{limit}"


class NewToken(BaseModel):
    """``POST /v1/tokens``'s answer: the token, shown this once, and its record."""

    token: str = Field(description="The bearer token; the service keeps only its SHA-256.")
    info: TokenInfo


def token_id_of(text: str) -> str | None:
    """The id in a scoped token's text, or ``None`` if ``text`` is no scoped token."""
    if not text.startswith(TOKEN_PREFIX):
        return None
    parts = text[len(TOKEN_PREFIX):].split("_", 1)
    if len(parts) != 2 or not re.fullmatch(TOKEN_ID_PATTERN, parts[0]) or not parts[1]:
        return None
    return parts[0]


def check_token_id(value: str) -> str:
    """Return ``value`` if it is a well-formed token id; else raise InvalidRequestError."""
    if not (isinstance(value, str) and re.fullmatch(TOKEN_ID_PATTERN, value)):
        raise InvalidRequestError(f"invalid token id {brief(value)}: {TOKEN_ID_RULE}")
    return value
