"""Who sent a request: the admin token, or a scoped token and its record.

The guard (:mod:`ringtrain.jobs.service.api.guard`) puts the caller in the request's ASGI scope
once the token is checked; routes that answer differently by caller (lists limited to one
experiment, a submit into the token's experiment, the token routes) take it as a dependency.
Which routes a scope may reach at all is :mod:`ringtrain.jobs.service.api.scope_guard`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from ringtrain.jobs.errors import ForbiddenError
from ringtrain.jobs.models import JobInfo, JobSpec
from ringtrain.jobs.models.tokens import TokenInfo, TokenScope

#: The key of the ASGI scope under which the guard leaves the caller.
CALLER_KEY = "ringtrain.caller"


@dataclass(frozen=True)
class Caller:
    """The sender of one request.

    Args:
        token: the scoped token's record; ``None`` for the admin token (and for an app called
            in-process, which has no guard: nothing else can reach it).
    """

    token: TokenInfo | None = None

    @property
    def is_admin(self) -> bool:
        return self.token is None

    @property
    def experiment(self) -> str | None:
        """The one experiment whose jobs this caller sees, or ``None`` for all of them."""
        return None if self.token is None else self.token.experiment

    @property
    def owner(self) -> str:
        """Whose what it makes is (an upload): the scoped token's id, or the admin's."""
        return "admin" if self.token is None else f"token:{self.token.id}"

    def sees(self, experiment: str | None) -> bool:
        """Whether jobs of ``experiment`` (``None``: jobs of no experiment) are visible to it."""
        return self.experiment is None or experiment == self.experiment

    def sees_job(self, job: JobInfo) -> bool:
        return self.sees(job.spec.experiment)

    def describe(self) -> str:
        """The caller in words, for refusals: ``this token's scope is read (experiment x)``."""
        if self.token is None:
            return "the admin token"
        return f"this token's scope is {self.token.describe()}"

    def require_admin(self, what: str) -> None:
        """Raises ForbiddenError unless this is the admin token (``what``: the refused act)."""
        if self.token is not None:
            raise ForbiddenError(f"only the admin token may {what}; {self.describe()}, which "
                                 f"allows {self.token.scope.allows()}")

    def submitted(self, spec: JobSpec) -> JobSpec:
        """The spec as this caller may submit it: a submit token's jobs go into its experiment
        (set when the spec names none, as kubectl sets the context's namespace).

        Raises:
            ForbiddenError: a read token, or a spec naming another experiment.
        """
        if self.token is None:
            return spec
        own = self.token.experiment
        if self.token.scope != TokenScope.SUBMIT or own is None:
            raise ForbiddenError(f"{self.describe()}, which allows {self.token.scope.allows()}; "
                                 "submitting needs a submit token or the admin token")
        if spec.experiment is None:
            return spec.model_copy(update={"experiment": own})
        if spec.experiment != own:
            raise ForbiddenError(f"{self.describe()}: it submits into experiment {own} only, and "
                                 f"this spec names experiment {spec.experiment}")
        return spec


#: The admin token's caller.
ADMIN = Caller()


def caller_of(request: Request) -> Caller:
    """The request's caller, as the guard left it (a FastAPI dependency)."""
    found = request.scope.get(CALLER_KEY)
    return found if isinstance(found, Caller) else ADMIN


#: A route parameter that receives the caller.
CallerDep = Annotated[Caller, Depends(caller_of)]
