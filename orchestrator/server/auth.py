"""Bearer tokens on every request: who asks, and what their scope allows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from orchestrator.client import Client
from orchestrator.errors import AuthenticationError, PermissionDeniedError
from orchestrator.store import token_sql
from orchestrator.store.token_sql import Principal, Scope

_bearer = HTTPBearer(auto_error=False, description="A token from `chorus token create`.")


def client_of(request: Request) -> Client:
    """The app's one client (built at startup)."""
    found = request.app.state.client
    assert isinstance(found, Client)
    return found


def _principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    if credentials is None:
        raise AuthenticationError("a bearer token is required (Authorization: Bearer chorus_...)")
    token = credentials.credentials
    if len(token) > 200 or not token.isascii():
        raise AuthenticationError("the token is not valid")
    with client_of(request).runtime.session() as session:
        found = token_sql.verify(session, token)
    if found is None:
        raise AuthenticationError("the token is not valid (unknown or revoked)")
    return found


def still_valid(request: Request, principal: Principal) -> None:
    """After a request waited (a result's ``wait``): its token must still
    be valid for the answer, or the request ends with 401."""
    with client_of(request).runtime.session() as session:
        if not token_sql.unrevoked(session, [principal.token_id]):
            raise AuthenticationError("the token was revoked while the request waited")


def needs(scope: Scope) -> Callable[..., Principal]:
    """A dependency: the request's principal, if its scope allows ``scope``."""

    def check(principal: Annotated[Principal, Depends(_principal)]) -> Principal:
        if not principal.scope.allows(scope):
            raise PermissionDeniedError(
                f"a {principal.scope.value} token cannot do this; it needs {scope.value}"
            )
        return principal

    return check


Reader = Annotated[Principal, Depends(needs(Scope.READ))]
Submitter = Annotated[Principal, Depends(needs(Scope.SUBMIT))]
