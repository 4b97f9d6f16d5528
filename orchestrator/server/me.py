"""``GET /v1/me``: who the request's token is (tenant, scope, name), so a
client shows only what the token may do."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from orchestrator.server.auth import Reader
from orchestrator.server.errors import COMMON, responses
from orchestrator.store.token_sql import Scope

router = APIRouter(prefix="/v1", tags=["tokens"], responses=responses(*COMMON))


class Me(BaseModel):
    tenant: str
    scope: Scope
    name: str | None = None
    can_submit: bool


@router.get("/me", response_model=Me)
def me(principal: Reader) -> Me:
    """The token's tenant and scope (``can_submit``: it may cancel and send)."""
    return Me(
        tenant=principal.tenant,
        scope=principal.scope,
        name=principal.name,
        can_submit=principal.scope.allows(Scope.SUBMIT),
    )
