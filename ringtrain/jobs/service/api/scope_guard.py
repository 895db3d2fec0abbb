"""What a scoped token may reach: the routes of its scope, and only its experiment's jobs.

A middleware inside the authenticating guard, so that a rule holds for every route, present and
future, without each route remembering it: a ``read`` token gets the GET (and HEAD) routes, a
``submit`` token besides them the few routes of :data:`SUBMIT_ROUTES`, both those of
:data:`OWN_ROUTES`, and both get 403 for the rest, naming their scope and what it allows. The
token routes are the admin's alone, reads included (a token list is a map of who may do what).

A token limited to one experiment does not see other experiments' jobs: a route under
``/v1/jobs/{id}`` or ``/v1/deployments/{id}`` of such a job answers 404 with the very message of
an unknown id, so that their ids cannot even be confirmed. Lists and the event stream leave those
jobs out (:mod:`ringtrain.jobs.service.api.experiment_view`).

A stream a scoped token opened (a followed log, the event stream) ends at its next chunk once
the token is revoked or expires: the guard let the request in, but nothing more is sent to a
token that no longer holds.
"""

from __future__ import annotations

import re

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ringtrain.jobs.errors import NotFoundError, brief
from ringtrain.jobs.models.schemas import API_PREFIX
from ringtrain.jobs.models.tokens import TokenScope
from ringtrain.jobs.service.api.caller import CALLER_KEY, Caller
from ringtrain.jobs.service.api.guard import refuse
from ringtrain.jobs.service.store import Store
from ringtrain.jobs.service.tokens import Tokens

_READS = ("GET", "HEAD")
_ID = r"[^/]+"
#: The routes a submit token may call besides the reads: each acts on a job (or deployment) of
#: its experiment, which the job path check below ensures, or submits into it
#: (:meth:`Caller.submitted`).
SUBMIT_ROUTES = tuple((method, re.compile(API_PREFIX + path)) for method, path in (
    ("POST", "/jobs"),
    ("PUT", f"/uploads/{_ID}"),  # an upload is its sender's alone (service/uploads.py)
    ("POST", f"/jobs/{_ID}/terminate"),
    ("DELETE", f"/jobs/{_ID}"),
    ("POST", f"/jobs/{_ID}/deploy"),
    ("POST", f"/jobs/{_ID}/ranks/{_ID}/stack"),
    ("POST", f"/deployments/{_ID}/stop"),
))
#: The routes any scoped token may call besides the reads: they act for the caller alone and
#: give it nothing it lacks (a login code signs a browser in as the very same token).
OWN_ROUTES = (("POST", re.compile(API_PREFIX + "/dashboard/login-codes")),)
_ADMIN_ONLY = re.compile(API_PREFIX + r"/tokens(/.*)?")
#: A path that names one job: its id is the group.
_JOB_PATH = re.compile(API_PREFIX + rf"/(?:jobs|deployments)/({_ID})(/.*)?")


def refusal(caller: Caller, method: str, path: str) -> str | None:
    """Why ``caller`` may not send ``method path`` (the 403's message), or ``None``."""
    token = caller.token
    if token is None:
        return None
    what = f"{method} {brief(path, 120)}"
    if _ADMIN_ONLY.fullmatch(path):
        return (f"{caller.describe()}: only the admin token may create, list or revoke tokens "
                f"({what})")
    if method in _READS or any(m == method and r.fullmatch(path) for m, r in OWN_ROUTES):
        return None
    submits = any(m == method and r.fullmatch(path) for m, r in SUBMIT_ROUTES)
    if submits and token.scope == TokenScope.SUBMIT:
        return None
    needs = ("a submit token of the job's experiment, or the admin token" if submits
             else "the admin token")
    return (f"refused: {caller.describe()}, which allows {token.scope.allows()}; "
            f"{what} needs {needs}")


class ScopeGuard:
    """Answer 403 to a scoped token's request outside its scope, and 404 to one that names a
    job of an experiment it does not see; end its streams once it is revoked or expires.

    Args:
        store: where a named job's experiment is looked up.
        tokens: the scoped tokens, asked whether one has ended.
    """

    def __init__(self, app: ASGIApp, store: Store, tokens: Tokens):
        self.app = app
        self.store = store
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        caller = scope.get(CALLER_KEY) if scope["type"] == "http" else None
        if isinstance(caller, Caller) and caller.token is not None:
            why = refusal(caller, scope["method"], scope["path"])
            if why is not None:
                await refuse(send, 403, why)
                return
            named = _JOB_PATH.fullmatch(scope["path"])
            if (caller.experiment is not None and named is not None
                    and await run_in_threadpool(self._hidden, caller, named.group(1))):
                await refuse(send, 404, f"no job with id {named.group(1)!r} (see `ringtrain "
                                        "job list`)")
                return
            send = self._while_valid(caller, send)
        await self.app(scope, receive, send)

    def _while_valid(self, caller: Caller, send: Send) -> Send:
        """``send``, which ends the response (and drops what the app sends after) at the first
        chunk of a stream after the caller's token ended."""
        token = caller.token
        assert token is not None
        closed = False

        async def checked(message: Message) -> None:
            nonlocal closed
            if closed:
                return  # the response is over; the app stops at its next look for a disconnect
            if (message["type"] == "http.response.body" and message.get("more_body")
                    and self.tokens.ended(token)):
                closed = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            await send(message)

        return checked

    def _hidden(self, caller: Caller, job_id: str) -> bool:
        try:
            job = self.store.get_job(job_id)
        except NotFoundError:  # the route answers for an unknown (or malformed) id
            return False
        return not caller.sees_job(job)
