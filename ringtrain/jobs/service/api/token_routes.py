"""The routes of scoped tokens (``/v1/tokens``): create, list and revoke, for the admin token
only (the scope guard refuses every scoped token first; each route checks again, so that the
rule does not rest on one place)."""

from __future__ import annotations

from fastapi import APIRouter

from ringtrain.jobs.models.schemas import API_PREFIX
from ringtrain.jobs.models.tokens import NewToken, TokenInfo, TokenRequest
from ringtrain.jobs.service.api.caller import CallerDep
from ringtrain.jobs.service.api.params import ERRORS, TokenIdPath
from ringtrain.jobs.service.tokens import Tokens


def token_routes(tokens: Tokens) -> APIRouter:
    """``POST /v1/tokens``, ``GET /v1/tokens`` and ``POST /v1/tokens/{id}/revoke``."""
    r = APIRouter(prefix=API_PREFIX, responses=ERRORS)

    @r.post("/tokens", status_code=201)
    def create_token(body: TokenRequest, caller: CallerDep) -> NewToken:
        """A new scoped token. Its text is in this answer only: the service keeps its hash."""
        caller.require_admin("create tokens")
        return tokens.create(body)

    @r.get("/tokens")
    def list_tokens(caller: CallerDep) -> list[TokenInfo]:
        """Every scoped token's record (revoked and expired ones too), never a token."""
        caller.require_admin("list tokens")
        return tokens.list()

    @r.post("/tokens/{token_id}/revoke")
    def revoke_token(token_id: TokenIdPath, caller: CallerDep) -> TokenInfo:
        """Revoke a token: its next request is refused (401, saying it was revoked)."""
        caller.require_admin("revoke tokens")
        return tokens.revoke(token_id)

    return r
